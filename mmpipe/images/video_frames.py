"""The sampled frames of one video as ONE uint8 array, and its patch layout.

`mmpipe.images.video` resizes each sampled frame into `SampledFrames` as it is decoded, then
`patchify_video_u8` copies that array once into the video processor's patch order. Why one
array: a list of resized frames, its ``np.stack`` and the patch copy held three copies of the
output at the peak (tracemalloc: 3.0x the patches; 2.0x this way).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SampledFrames", "patchify_video_u8"]


class SampledFrames:
    """uint8 [n + pad, th, tw, 3]: the ``n`` sampled frames in the order of ``idx`` (ascending
    source frames, a repeated one in adjacent slots, as `decode_sampled` returns them), then
    ``pad`` copies of the last one up to a multiple of ``T`` (as the video processors pad)."""

    def __init__(self, idx: np.ndarray, th: int, tw: int, T: int):
        self.n = len(idx)
        self.stack = np.empty((self.n + (-self.n % T), th, tw, 3), np.uint8)
        uniq, counts = np.unique(idx, return_counts=True)
        ends = np.cumsum(counts)
        self.slots = {int(u): (int(e - c), int(e)) for u, c, e in zip(uniq, counts, ends)}  # source -> rows

    def put(self, source: int, resized: np.ndarray) -> np.ndarray:
        """Source frame ``source``, resized (uint8 [th, tw, 3]), into its rows; returns its first row."""
        s, e = self.slots[source]
        self.stack[s:e] = resized
        return self.stack[s]

    def padded(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the frames with the padding rows filled, ``indices`` int64 [n] padded alike)."""
        pad = len(self.stack) - self.n
        self.stack[self.n:] = self.stack[self.n - 1]
        return self.stack, np.concatenate([indices, np.repeat(indices[-1:], pad)]).astype(np.int64)


def patchify_video_u8(frames: np.ndarray, spec) -> np.ndarray:
    """uint8 [n, H, W, 3] (n a multiple of T, H and W multiples of patch*merge) -> uint8
    [n/T * gh * gw, 3 * T * p * p], the video processor's patch layout (channel, then the T
    frames of the patch, then p x p), merge windows consecutive as for images (``spec``: a
    `mmpipe.images.spec.VisionSpec`)."""
    p, m, T = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    n, H, W, C = frames.shape
    gt, gh, gw = n // T, H // p, W // p
    x = frames.reshape(gt, T, gh // m, m, p, gw // m, m, p, C)
    # -> (gt, gh/m, gw/m, m_h, m_w, C, T, p_h, p_w)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x).reshape(gt * gh * gw, C * T * p * p)
