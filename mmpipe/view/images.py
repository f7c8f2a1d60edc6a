"""Images of a row as the model sees them (view stage): thumbnails rebuilt from the stored
pixels, video frames, PNG data URIs, shown sizes and the colour of each image.

How pictures come out of a row's storage is its kind's (``fam.media.view_pictures``,
`mmpipe.media`): the patch grids give each resized image (exact for uint8
rows and float32 rows read with their constants), the tiles kind each image's stored tiles, the
generic path none (its outputs are in the processor's own layout).
"""

from __future__ import annotations

import base64
import colorsys
import io
from typing import Any, Optional

import numpy as np

from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import default_processor_for
from mmpipe.view.summary import as_row

MIN_SHOWN_SIDE = 96  # tiny images are shown enlarged by a whole factor, pixelated
MAX_SHOWN_SIDE = 320


def pixel_source(row: MultiModalInputs, source: Any = None) -> Any:
    """What pixels are read with: ``source`` (a `VisionSpec` or processor), else the processor
    `set_default_processor` named for this row's family (None: the family's constants)."""
    return source if source is not None else default_processor_for(row.family)


def media_pictures(row: MultiModalInputs, kind: str, source: Any = None) -> tuple[list, bool]:
    """Per image (video) of ``kind``, its pictures uint8 [H, W, 3] as the model sees them (one
    resized image, one per stored tile, or a video's first frame of each temporal patch group),
    None without them; and whether they are exact (see `image_thumbnails`). ``source`` as given
    (None: the family's constants)."""
    pictures, exact = row.fam.media.view_pictures(row, kind, source)
    if pictures is None:
        pictures = [None] * (row.num_images if kind == "image" else row.num_videos)
    return pictures, exact


def row_pictures(row: MultiModalInputs, source: Any = None) -> tuple[list[Optional[list[np.ndarray]]], bool]:
    """`media_pictures` of the row's images, read with `pixel_source`."""
    return media_pictures(row, "image", pixel_source(row, source))


def image_thumbnails(row, *, spec=None) -> list:
    """The row's images as the model sees them (after the resize), from the stored pixels.

    Args:
        row: a `MultiModalInputs` (or a stored row dict).
        spec: a `VisionSpec` or a processor supplying the normalisation constants that
            float32 rows are inverted with (default: the family's).

    Returns one ``PIL.Image`` (RGB) per image: for a patch-grid row ``w*p x h*p`` pixels for grid
    ``(1, h, w)``, equal to the resized uint8 image the processor normalised; for a tiled row
    its stored tiles side by side. ``None`` for each image without stored pixels (layout-only
    rows, ``pixels="none"``; the generic path's processor outputs).
    """
    from PIL import Image

    pictures, _ = row_pictures(as_row(row), spec)
    return [None if p is None else Image.fromarray(np.concatenate(p, axis=1), "RGB") for p in pictures]


def video_frames(row, *, spec=None) -> list[list]:
    """Per video, the first frame of each temporal patch group as a ``PIL.Image`` (the model
    sees ``T`` frames per group); an empty list for a video without stored pixels."""
    from PIL import Image

    row = as_row(row)
    frames, _ = media_pictures(row, "video", pixel_source(row, spec))
    return [[Image.fromarray(f, "RGB") for f in video or ()] for video in frames]


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
