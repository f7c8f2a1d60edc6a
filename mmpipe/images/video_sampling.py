"""Which frames of a video qwen-vl-utils 0.0.14's ``fetch_video`` samples (the default rule of
`mmpipe.images.video`; ``VideoOptions(sampling="processor")``: `mmpipe.images.video_processor_plan`),
and the times of the frame groups. Pure functions of the metadata (frame count, rate, options).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mmpipe.errors import VideoError

__all__ = ["FRAME_FACTOR", "group_times", "sample_count", "sample_indices", "frame_range"]

FRAME_FACTOR = 2  # qwen-vl-utils: sampled frame counts are multiples of this


def group_times(indices, video_fps: float, T: int) -> tuple:
    """Seconds of each temporal patch (frame group), transformers' Qwen3-VL
    ``_calculate_timestamps``: indices padded with the last to a multiple of ``T``, each
    ``index / video_fps``, then the mean of each group's first and last."""
    idx = [int(i) for i in indices]
    idx += [idx[-1]] * (-len(idx) % T)
    ts = [i / video_fps for i in idx]
    return tuple((ts[i] + ts[i + T - 1]) / 2 for i in range(0, len(ts), T))


def sample_count(total_frames: int, video_fps: float, opts: Any, *, where: str = "video") -> int:
    """qwen-vl-utils ``smart_nframes``: the number of frames to sample."""
    if opts.nframes is not None:
        n = round(opts.nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        fps = opts.fps if opts.fps is not None else 2.0
        lo = math.ceil(opts.min_frames / FRAME_FACTOR) * FRAME_FACTOR
        hi = math.floor(min(opts.max_frames, total_frames) / FRAME_FACTOR) * FRAME_FACTOR
        n = min(min(max(total_frames / video_fps * fps, lo), hi), total_frames)
        n = math.floor(n / FRAME_FACTOR) * FRAME_FACTOR
    if total_frames < FRAME_FACTOR:  # a still image opened as a video (a JPEG/PNG/GIF), or a one-frame clip
        raise VideoError(f"cannot sample {FRAME_FACTOR} frames from a video of {total_frames} frame (the least "
                         "qwen-vl-utils' rule samples)",
                         where=where, expected=f"a video of at least {FRAME_FACTOR} frames",
                         found=f"{total_frames} frame (a still image file read as a video?)",
                         fix="give a still image as an image (an image item / the images column), or its frame "
                             "as a one-frame list [frame] (repeated to 2 frames), or drop the row (on_error='skip')")
    if not FRAME_FACTOR <= n <= total_frames:
        raise VideoError(f"cannot sample {n} frames from a video of {total_frames} frames", where=where,
                         expected=f"between {FRAME_FACTOR} and the video's {total_frames} frames",
                         found=f"{n} frames", fix="use a longer video, or lower nframes / min_frames")
    return int(n)


def sample_indices(total_frames: int, n: int, first: int = 0) -> np.ndarray:
    """int64 [n]: ``round(linspace(first, first + total - 1, n))`` as qwen-vl-utils computes it
    (torch's float32 linspace, round half to even; ``first``: a clip's first frame, `frame_range`)."""
    import torch

    return torch.linspace(first, first + total_frames - 1, n).round().long().numpy()


def frame_range(total_frames: int, video_fps: float, opts: Any, *, where: str = "video") -> tuple[int, int]:
    """(first, last) source frame of the clip ``[video_start, video_end]`` seconds, qwen-vl-utils'
    ``calculate_video_frame_range``: times clamped to the video's ``total / fps`` seconds, first
    ``ceil(start * fps)``, last ``min(floor(end * fps), total - 1)``; the whole video without them."""
    if opts.video_start is None and opts.video_end is None:
        return 0, total_frames - 1
    duration = total_frames / video_fps
    first = 0 if opts.video_start is None else math.ceil(max(0.0, min(opts.video_start, duration)) * video_fps)
    last = total_frames - 1
    if opts.video_end is not None:
        last = min(math.floor(max(0.0, min(opts.video_end, duration)) * video_fps), total_frames - 1)
    if first >= last:
        raise VideoError(f"the clip {opts.video_start}..{opts.video_end} s holds no frame range", where=where,
                         expected=f"video_start < video_end within the video's {duration:.2f} s",
                         found=f"frames {first}..{last} of {total_frames} at {video_fps:g} fps",
                         fix="fix video_start / video_end (seconds from the start of the video)")
    return first, last
