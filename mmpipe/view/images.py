"""Images of a row as the model sees them (view stage): thumbnails rebuilt from the stored
pixels (exact for uint8 rows and float32 rows read with their constants), video frames,
PNG data URIs, shown sizes and the colour of each image.
"""

from __future__ import annotations

import base64
import colorsys
import io
from typing import Any, Optional

import numpy as np

from mmpipe.families import get_family
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import default_processor_for
from mmpipe.view.summary import as_row

MIN_SHOWN_SIDE = 96  # tiny images are shown enlarged by a whole factor, pixelated
MAX_SHOWN_SIDE = 320


def spec_for(family: str, source: Any = None):
    """The `VisionSpec` to read pixels with: from a processor / spec if given (or the default
    processor of this family), else the family's."""
    from mmpipe.images.spec import VisionSpec

    if source is None:
        source = default_processor_for(family)
    if isinstance(source, VisionSpec):
        return source
    if source is not None and getattr(source, "image_processor", None) is not None:
        return VisionSpec.from_processor(source)
    return VisionSpec.from_family(get_family(family))


def _approx_u8(x: np.ndarray, spec) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 by undoing the normalisation arithmetically (rounded)."""
    mean = np.asarray(spec.image_mean, np.float64)[None, :, None] if spec.do_normalize else 0.0
    std = np.asarray(spec.image_std, np.float64)[None, :, None] if spec.do_normalize else 1.0
    v = x.astype(np.float64) * std + mean
    v = v / spec.rescale_factor if spec.do_rescale else v
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def _patches_u8(row: MultiModalInputs, spec) -> tuple[Optional[np.ndarray], bool]:
    """The row's image patches as uint8 [N, 3*p*p] (one temporal copy) and whether they are
    exact; None for a row without pixels."""
    from mmpipe.images.pixels import pixel_values_to_u8

    if row.pixel_values_u8 is not None:
        return np.asarray(row.pixel_values_u8), True
    if row.pixel_values is None:
        return None, True
    pv = np.asarray(row.pixel_values, np.float32)
    try:
        return pixel_values_to_u8(pv, spec.lut(), spec.temporal_patch_size), True
    except ValueError:  # other normalisation constants than `spec`: undo them approximately
        n, d = pv.shape
        T = spec.temporal_patch_size
        x = pv.reshape(n, 3, T, d // (3 * T))[:, :, 0, :]
        return _approx_u8(x, spec).reshape(n, -1), False


def image_arrays(row: MultiModalInputs, spec=None) -> tuple[list[Optional[np.ndarray]], bool]:
    """uint8 [H', W', 3] per image (None without pixels), and whether they are exact."""
    from mmpipe.images.pixels import unpatchify_u8

    spec = spec_for(row.family, spec)
    patches, exact = _patches_u8(row, spec)
    grids = np.asarray(row.image_grid_thw).reshape(-1, 3)
    if patches is None:
        return [None] * len(grids), exact
    out, at = [], 0
    for t, h, w in grids.tolist():
        n = t * h * w
        out.append(unpatchify_u8(patches[at:at + h * w], h, w, spec))
        at += n
    return out, exact


def image_thumbnails(row, *, spec=None) -> list:
    """The row's images as the model sees them (after the resize), from the stored pixels.

    Args:
        row: a `MultiModalInputs` (or a stored row dict).
        spec: a `VisionSpec` or a processor supplying the normalisation constants that
            float32 rows are inverted with (default: the family's).

    Returns one ``PIL.Image`` (RGB, ``w*p x h*p`` pixels for grid ``(1, h, w)``) per image,
    equal to the resized uint8 image the processor normalised; ``None`` for each image of a
    layout-only row (``pixels="none"``), which stores no pixels.
    """
    from PIL import Image

    arrays, _ = image_arrays(as_row(row), spec)
    return [Image.fromarray(a, "RGB") if a is not None else None for a in arrays]


def video_frames(row, *, spec=None) -> list[list]:
    """Per video, the first frame of each temporal patch group as a ``PIL.Image`` (the model
    sees ``T`` frames per group); an empty list for a video without stored pixels."""
    from PIL import Image

    from mmpipe.images.pixels import unpatchify_u8, video_pixel_values_to_u8

    row = as_row(row)
    spec = spec_for(row.family, spec)
    T = spec.temporal_patch_size
    if row.pixel_values_videos_u8 is not None:
        patches = np.asarray(row.pixel_values_videos_u8)
    elif row.pixel_values_videos is not None:
        pv = np.asarray(row.pixel_values_videos, np.float32)
        try:
            patches = video_pixel_values_to_u8(pv, spec.for_videos().lut())
        except ValueError:
            patches = _approx_u8(pv.reshape(len(pv), 3, -1), spec).reshape(len(pv), -1)
    else:
        return [[] for _ in range(row.num_videos)]
    out, at = [], 0
    for t, h, w in np.asarray(row.video_grid_thw).reshape(-1, 3).tolist():
        frames = []
        for g in range(t):
            block = patches[at + g * h * w: at + (g + 1) * h * w]
            first = block.reshape(h * w, 3, T, -1)[:, :, 0, :].reshape(h * w, -1)
            frames.append(Image.fromarray(unpatchify_u8(first, h, w, spec), "RGB"))
        out.append(frames)
        at += t * h * w
    return out


def png_data_uri(img: Any) -> str:
    """A ``PIL.Image`` as a ``data:image/png;base64,...`` URI (embedded, no file)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def shown_size(w: int, h: int) -> tuple[int, int, bool]:
    """CSS size of a thumbnail: small images enlarged by a whole factor (pixelated, so each
    patch stays crisp), large ones fitted into `MAX_SHOWN_SIDE`."""
    side = max(w, h)
    if side < MIN_SHOWN_SIDE:
        f = -(-MIN_SHOWN_SIDE // side)
        return w * f, h * f, True
    if side > MAX_SHOWN_SIDE:
        s = MAX_SHOWN_SIDE / side
        return max(1, round(w * s)), max(1, round(h * s)), False
    return w, h, False


def media_colour(index: int, kind: str = "image") -> str:
    """The colour of image (or video) ``index``: its thumbnail border and its token span.
    Saturated, distinct for neighbouring indices (golden-ratio hue steps)."""
    base, sat = (0.02, 0.9) if kind == "image" else (0.52, 0.7)
    r, g, b = colorsys.hsv_to_rgb((base + index * 0.6180339887) % 1.0, sat, 0.82)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def tint(colour: str, amount: float = 0.82) -> str:
    """``colour`` (``"#rrggbb"``) mixed towards white by ``amount`` (a span's background)."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#%02x%02x%02x" % tuple(round(c + (255 - c) * amount) for c in rgb)
