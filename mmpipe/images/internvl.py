"""InternVL (transformers format, `InternVLProcessor` + `GotOcr2ImageProcessorPil`): dynamic
tiling with a thumbnail, from the image's size alone.

The processor picks a grid of ``cols x rows`` tiles (``min_patches <= cols*rows <=
max_patches``) whose aspect ratio is closest to the image's, bicubic-resizes the uint8 image
to ``(rows*S, cols*S)``, cuts it into ``S x S`` crops in row-major order and, when that gives
more than one crop, appends a thumbnail (the whole image resized to ``S x S``). Each tile is
then rescaled and normalised per value and channel, so ``pixel_values`` float32
``[n, 3, S, S]`` is a per-pixel function of the uint8 tiles `tiles_u8` returns (a 256-entry
table per channel reproduces it bit for bit). Each image placeholder ``<IMG_CONTEXT>`` becomes
``<img>`` + ``<IMG_CONTEXT>`` x (``image_seq_length`` * tiles) + ``</img>``.

Settings: `InternVLProcessor` passes ``crop_to_patches=True`` to its image processor (its
``images_kwargs`` default) whatever the image processor's own attribute says. Where these
functions take ``image_processor``, pass the processor's effective image processor
(`mmpipe.images.tiles.effective_image_processor`) or the processor itself; a bare image
processor gives its own attributes, as calling it directly does::

    >>> tile_count(300, 400, processor)     # doctest: +SKIP  (448x448 tiles, max_patches 12)
    13
    >>> tiles_u8(image, processor).shape    # doctest: +SKIP  (4x3 crops + the thumbnail)
    (13, 448, 448, 3)
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from mmpipe.images.settings import size_field
from mmpipe.images.tiles import effective_image_processor

__all__ = ["settings", "grid", "tile_count", "image_tokens", "tiles_u8", "placeholder_text", "expand_placeholder",
           "placeholder_runs", "max_tiles"]


def settings(image_processor) -> dict:
    """The tiling settings in effect: ``{"tile": (S_h, S_w), "crop": bool, "min_patches": int,
    "max_patches": int, "resample": int}``. ``image_processor``: an image processor whose
    attributes are the call's settings (`mmpipe.images.tiles.effective_image_processor`), or
    the processor itself (its effective image processor is taken)."""
    if hasattr(image_processor, "image_processor"):
        image_processor = effective_image_processor(image_processor)
    ip = image_processor
    size = ip.size
    return {"tile": (int(size_field(size, "height")), int(size_field(size, "width"))), "crop": bool(ip.crop_to_patches),
            "min_patches": int(ip.min_patches), "max_patches": int(ip.max_patches), "resample": int(ip.resample)}


@functools.lru_cache(maxsize=64)
def _arrangements(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """(cols, rows) grids with min_tiles <= cols*rows <= max_tiles, by tile count (stable)."""
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
             if min_tiles <= c * r <= max_tiles]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


@functools.lru_cache(maxsize=4096)
def _best_grid(height: int, width: int, tile_h: int, tile_w: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    # transformers' get_optimal_tiled_canvas: closest aspect ratio; on a tie the grid with more
    # tiles wins while the image covers more than half of that grid's area
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for c, r in _arrangements(min_tiles, max_tiles):
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best_diff, best = diff, (c, r)
        elif diff == best_diff and area > 0.5 * tile_h * tile_w * c * r:
            best = (c, r)
    return best


def grid(height: int, width: int, image_processor) -> tuple[int, int]:
    """(cols, rows) of the crops of a ``height x width`` image; (1, 1) without cropping (and
    then no thumbnail either)."""
    return _grid(int(height), int(width), settings(image_processor))


def _grid(height: int, width: int, s: dict) -> tuple[int, int]:
    if not s["crop"] or s["max_patches"] <= 1:
        return (1, 1)
    return _best_grid(height, width, *s["tile"], s["min_patches"], s["max_patches"])


def tile_count(height: int, width: int, image_processor) -> int:
    """Tiles of one ``height x width`` image: cols*rows crops, plus the thumbnail when there
    is more than one crop."""
    cols, rows = grid(height, width, image_processor)
    return 1 if cols * rows == 1 else cols * rows + 1


def image_tokens(height: int, width: int, image_processor, processor) -> int:
    """``<IMG_CONTEXT>`` tokens (the feature tokens) one image's text holds:
    ``image_seq_length`` per tile. The text has 2 more (``<img>``, ``</img>``)."""
    return int(processor.image_seq_length) * tile_count(height, width, image_processor)


def placeholder_text(height: int, width: int, processor, image_processor=None) -> str:
    """Exactly the text `InternVLProcessor` puts in place of one ``<IMG_CONTEXT>``:
    ``<img>`` + ``<IMG_CONTEXT>`` x `image_tokens` + ``</img>`` (``image_processor``: default
    the processor's effective one)."""
    ip = processor if image_processor is None else image_processor
    n = image_tokens(height, width, ip, processor)
    return f"{processor.start_image_token}{processor.image_token * n}{processor.end_image_token}"


def placeholder_runs(height: int, width: int, processor, image_processor=None) -> tuple[str, list[int]]:
    """`placeholder_text` with its run of ``<IMG_CONTEXT>`` written once, and the run's length
    (`image_tokens`): ``<img><IMG_CONTEXT></img>``, [n] (`mmpipe.media.tiles_encode` tokenizes this)."""
    ip = processor if image_processor is None else image_processor
    n = image_tokens(height, width, ip, processor)
    body = processor.image_token if n else ""
    return f"{processor.start_image_token}{body}{processor.end_image_token}", [n] if n else []


def tiles_u8(image: Image.Image, image_processor) -> np.ndarray:
    """uint8 ``[n, S_h, S_w, 3]``: the resized tiles the processor normalises, in its order
    (row-major crops, then the thumbnail). ``image``: PIL RGB (the processor's RGB conversion
    already applied)."""
    s = settings(image_processor)
    (th, tw), resample = s["tile"], s["resample"]
    cols, rows = _grid(image.height, image.width, s)

    def resized(h, w):
        return np.asarray(image if image.size == (w, h) else image.resize((w, h), resample=resample))

    if cols * rows == 1:
        return resized(th, tw)[None]
    canvas = resized(rows * th, cols * tw)
    crops = canvas.reshape(rows, th, cols, tw, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, th, tw, 3)
    return np.concatenate([crops, resized(th, tw)[None]])


# The interface name (`mmpipe.images.tiles`); the placeholder mechanics themselves (finding the
# placeholders, splicing the text) are written once, in mmpipe.media.tiles_encode.
expand_placeholder = placeholder_text


def max_tiles(image_processor) -> int:
    """The most tiles one image can have: ``max_patches`` crops + the thumbnail (1 without
    cropping)."""
    s = settings(image_processor)
    return s["max_patches"] + 1 if s["crop"] and s["max_patches"] > 1 else 1
