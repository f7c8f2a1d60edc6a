"""Pictures back from stored patch rows, for the views: the inverse of `mmpipe.images.pixels`'
patchify and normalisation. uint8 patches are exact; float32 ``pixel_values`` go back through
the normalisation table (exact when read with their own constants), else arithmetically
(rounded, approximate).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.images.pixels import pixel_values_to_u8, unpatchify_u8, video_pixel_values_to_u8


def sourced_pixels(row, decode):
    """``decode(row)``: a ``pixels="source"`` row with its files decoded into uint8 pixels as
    collate decodes them; the row as it is when they do not decode to its stored layout (read
    with other sizes than it was encoded with: `mmpipe.view.set_default_processor` names the
    processor) or do not decode at all, so a view shows a placeholder instead of failing."""
    from mmpipe.errors import InputError

    try:
        return decode(row)
    except InputError:
        return row


def spec_for(fam, source: Any = None):
    """The `VisionSpec` pixels are read with: ``source`` when it is one, a processor's own,
    else the family's constants."""
    from mmpipe.images.spec import VisionSpec

    if isinstance(source, VisionSpec):
        return source
    if source is not None and getattr(source, "image_processor", None) is not None:
        return VisionSpec.from_processor(source)
    return VisionSpec.from_family(fam)


def approx_u8(x: np.ndarray, spec) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 by undoing the normalisation arithmetically (rounded)."""
    mean = np.asarray(spec.image_mean, np.float64)[None, :, None] if spec.do_normalize else 0.0
    std = np.asarray(spec.image_std, np.float64)[None, :, None] if spec.do_normalize else 1.0
    v = x.astype(np.float64) * std + mean
    v = v / spec.rescale_factor if spec.do_rescale else v
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def patches_u8(u8: Optional[np.ndarray], values: Optional[np.ndarray], spec, *,
               video: bool) -> tuple[Optional[np.ndarray], bool]:
    """Stored patches as uint8 and whether they are exact; None without pixels. ``u8``: the
    compact rows, returned as they are; else ``values`` float32 [N, 3*T*p*p] undone by ``spec``'s
    table: images to one temporal copy [N, 3*p*p], videos to [N, 3*T*p*p] (all T frames);
    float32 rows read with other constants than ``spec``'s are undone approximately."""
    if u8 is not None:
        return np.asarray(u8), True
    if values is None:
        return None, True
    pv = np.asarray(values, np.float32)
    try:
        if video:
            return video_pixel_values_to_u8(pv, spec.for_videos().lut()), True
        return pixel_values_to_u8(pv, spec.lut(), spec.temporal_patch_size), True
    except ValueError:  # other normalisation constants than `spec`: undo them approximately
        n, T = len(pv), spec.temporal_patch_size
        x = pv.reshape(n, 3, -1) if video else pv.reshape(n, 3, T, -1)[:, :, 0, :]
        return approx_u8(x, spec).reshape(n, -1), False


def grid_pictures(patches: np.ndarray, grids: list, spec, *, video: bool) -> list[list[np.ndarray]]:
    """Per grid ``(t, h, w)`` of ``patches`` (uint8, `patches_u8`), its pictures uint8
    [h*p, w*p, 3]: an image's resized image (one), a video's first frame of each temporal
    patch group (``t``; the model sees ``T`` frames per group)."""
    frames = spec.temporal_patch_size if video else 1  # frames per stored patch row
    out, at = [], 0
    for t, h, w in grids:
        groups = []
        for g in range(t if video else 1):
            block = patches[at + g * h * w: at + (g + 1) * h * w]
            first = block.reshape(h * w, 3, frames, -1)[:, :, 0, :].reshape(h * w, -1)  # frame 0 of the group
            groups.append(unpatchify_u8(first, h, w, spec))
        out.append(groups)
        at += t * h * w
    return out
