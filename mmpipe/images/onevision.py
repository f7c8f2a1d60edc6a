"""LLaVA-OneVision (`LlavaOnevisionProcessor` + `LlavaOnevisionImageProcessorPil`): anyres
tiling, ``image_sizes`` and the unpadded token count, from the image's size alone.

Each image gets anyres tiling: the base tile (the whole image bicubic-resized to ``S x S``),
then the image resized into the best grid pinpoint keeping its aspect ratio (``ceil``),
zero-padded to the pinpoint (centred, the odd pixel at the bottom/right) and cut into ``S x S``
patches row-major. Every tile is then rescaled and normalised per value and channel:
``pixel_values`` float32 ``[n_images, max_tiles, 3, S, S]`` is a per-pixel function of the
uint8 tiles `tiles_u8` returns (the processor pads the tile axis with float 0.0 up to the
batch's most tiles, `batch_pixel_values`; the model slices them off by ``image_sizes``). Each
``<image>`` becomes ``<image>`` x `image_tokens`.

Multi-image rows: the processor has two modes (`MODES`), chosen per encoder by
``mmpipe.Encoder(processor, images_kwargs={"multi_image": ...})`` (`split_images_kwargs` keeps
this option of mmpipe's apart from the processor call's):

- ``"per_conversation"`` (the default): one image LIST per prompt, as
  ``processor.apply_chat_template(..., tokenize=True)``, TRL's collator and the model's
  ``batch_num_images`` do it. A row holding several images (``images_in_row != 1``) gives each
  image one tile (padded to a square of the mean colour ``int(mean * 255)``, resized to
  ``S x S``; base tokens + one newline); a row of one image is tiled as below.
- ``"flat"``: a FLAT image list (what vLLM does, and the generic path): every image tiled
  (``batch_num_images`` all 1).

The mode of a stored row is in its layout, not stored apart (`stored_mode`: a row of several
images has one tile per image in the per-conversation mode, at least two in the flat one);
rows of 0 or 1 image are the same in both. Collate hands the model ``batch_num_images`` for
either mode (`model_batch_num_images`); vLLM prompts need the flat mode (`VLLM_MODE`). `conversation_image_processor` gives the image processor as the
processor's call for one conversation uses it (its ``images_in_row``), which every function
here reads when ``images_in_row`` is not passed::

    >>> tile_count(600, 800, processor)                     # doctest: +SKIP  (stock settings)
    7
    >>> image_tokens(600, 800, processor, processor)        # doctest: +SKIP
    4725
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Optional

import numpy as np
from PIL import Image

from mmpipe.errors import ArgumentError
from mmpipe.images.settings import size_field
from mmpipe.images.tiles import effective_image_processor

__all__ = ["settings", "best_resolution", "tile_count", "image_tokens", "tiles_u8", "placeholder_text",
           "expand_placeholder", "placeholder_runs", "max_tiles", "extra_inputs", "batch_pixel_values", "image_sizes",
           "batch_num_images", "MODE_KEY", "MODES", "DEFAULT_MODE", "VLLM_MODE", "split_images_kwargs", "images_in_row",
           "conversation_image_processor", "stored_mode", "row_image_processor", "model_batch_num_images"]

MODE_KEY = "multi_image"  # the encoder's images_kwargs key naming the multi-image mode (mmpipe's, not the processor's)
MODES = ("per_conversation", "flat")  # the processor's chat path (and TRL, batch_num_images) / a flat list (vLLM)
DEFAULT_MODE = "per_conversation"
VLLM_MODE = "flat"  # vLLM's LLaVA-OneVision processor passes each prompt's images as a flat list
RESIZES_ALWAYS = True  # do_resize=False: a conversation's several images stay at their own size (refused)
# processor-call options refused (mmpipe.images.tiles.check_call_kwargs): the processor tiles with call pinpoints but
# counts an image's tokens with its image processor's own, and the model its features with its config's
REFUSED_CALL_KWARGS = {"image_grid_pinpoints": "the processor would tile with these but count the image's tokens with "
                       "its image processor's own pinpoints (and the model its features with its config's): set "
                       "image_grid_pinpoints on the image processor and in the model config"}


def split_images_kwargs(images_kwargs: Optional[dict]) -> tuple[dict, dict]:
    """An encoder's ``images_kwargs`` -> (mmpipe's own options ``{"multi_image": mode}``, the
    rest: the processor call's image kwargs). ``mode``: one of `MODES`, default
    ``"per_conversation"``; another value is an `ArgumentError`."""
    rest = dict(images_kwargs or {})
    mode = rest.pop(MODE_KEY, DEFAULT_MODE)
    if mode not in MODES:
        raise ArgumentError(f"images_kwargs {MODE_KEY}={mode!r} is not a LLaVA-OneVision multi-image mode: use "
                            "'per_conversation' (the default: one tile per image of a row holding several, as "
                            "processor.apply_chat_template(tokenize=True), TRL and the model's batch_num_images) "
                            "or 'flat' (every image tiled, as vLLM does)")
    return {MODE_KEY: mode}, rest


def images_in_row(n_images: int, multi_image: str = DEFAULT_MODE) -> int:
    """What the processor's rule sees for each image of a row of ``n_images`` in mode
    ``multi_image``: the row's image count in the per-conversation mode, 1 in the flat mode
    (every image tiled)."""
    return int(n_images) if multi_image == "per_conversation" else 1


def conversation_image_processor(image_processor, n_images: int, multi_image: str = DEFAULT_MODE):
    """A shallow copy of ``image_processor`` (an `effective_image_processor` copy) as the
    processor's call for ONE conversation of ``n_images`` images in mode ``multi_image`` uses it: its
    ``images_in_row`` (`images_in_row`) set, which `tile_count`, `image_tokens`, `tiles_u8`,
    `placeholder_text` and `placeholder_runs` read when not passed it."""
    out = copy.copy(image_processor)
    out.images_in_row = images_in_row(n_images, multi_image)
    return out


def stored_mode(tiles_per_image) -> Optional[str]:
    """The multi-image mode a row was encoded in, from its ``tiles_per_image`` int64 [I]: a row
    of several images has one tile per image in ``"per_conversation"`` and at least two per
    image in ``"flat"`` (a base tile + its grid); None for 0 or 1 image (both modes agree)."""
    t = np.asarray(tiles_per_image, dtype=np.int64).reshape(-1)
    if len(t) < 2:
        return None
    return "per_conversation" if bool((t == 1).all()) else "flat"


def row_image_processor(image_processor, tiles_per_image):
    """`conversation_image_processor` for a stored row (its mode `stored_mode`, its image count
    ``len(tiles_per_image)``): what re-tiles its source files as encode did."""
    t = np.asarray(tiles_per_image).reshape(-1)
    return conversation_image_processor(image_processor, len(t), stored_mode(t) or DEFAULT_MODE)


def _in_row(image_processor, images_in_row: Optional[int]) -> int:
    if images_in_row is not None:
        return int(images_in_row)
    return int(getattr(image_processor, "images_in_row", 1) or 1)


def settings(image_processor) -> dict:
    """``{"tile": (S_h, S_w), "patch": int, "pinpoints": tuple, "resample": int, "fill":
    (r, g, b)}`` of an image processor whose attributes are the call's settings
    (`mmpipe.images.tiles.effective_image_processor`), or of a processor (its effective one)."""
    if hasattr(image_processor, "image_processor"):
        image_processor = effective_image_processor(image_processor)
    ip = image_processor
    size, crop = ip.size, getattr(ip, "crop_size", None)
    h, w, short = (size_field(size, k) for k in ("height", "width", "shortest_edge"))
    tile = (h, w) if h and w else (short, short)
    patch = size_field(crop, "height") if crop is not None and size_field(crop, "height") else tile[0]
    return {"tile": (int(tile[0]), int(tile[1])), "patch": int(patch),
            "pinpoints": tuple((int(h), int(w)) for h, w in ip.image_grid_pinpoints), "resample": int(ip.resample),
            "fill": tuple(int(x * 255) for x in ip.image_mean)}


@functools.lru_cache(maxsize=4096)
def _best(height: int, width: int, pinpoints: tuple) -> tuple[int, int]:
    # transformers' select_best_resolution: most effective pixels, then least waste
    best, most, least = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (h, w), effective, wasted
    return best


def best_resolution(height: int, width: int, image_processor) -> tuple[int, int]:
    """(height, width) of the grid pinpoint a single ``height x width`` image is tiled into."""
    return _best(int(height), int(width), settings(image_processor)["pinpoints"])


def tile_count(height: int, width: int, image_processor, images_in_row: Optional[int] = None) -> int:
    """Tiles of one image: base + patches of its pinpoint (a row with one image, or the flat
    mode), else 1. ``images_in_row``: default the image processor's
    (`conversation_image_processor`), else 1."""
    if _in_row(image_processor, images_in_row) != 1:
        return 1
    bh, bw = best_resolution(height, width, image_processor)
    p = settings(image_processor)["patch"]
    return 1 + math.ceil(bh / p) * math.ceil(bw / p)


def max_tiles(image_processor) -> int:
    """The most tiles one image can have: the base tile + the largest pinpoint's patches."""
    s = settings(image_processor)
    return 1 + max(math.ceil(h / s["patch"]) * math.ceil(w / s["patch"]) for h, w in s["pinpoints"])


def _unpadded(height: int, width: int, side: int, scale_h: int, scale_w: int, max_patches: int) -> tuple[int, int]:
    # the processor's _get_unpadded_features: (features, newline features) of the patch grid
    cur_h, cur_w = side * scale_h, side * scale_w
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= (cur_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= (cur_w - new_w) // 2 * 2
    ratio = math.sqrt(cur_h * cur_w / (max_patches * side**2))
    if ratio > 1.1:
        return int(cur_h // ratio) * int(cur_w // ratio), int(cur_h // ratio)
    return cur_h * cur_w, cur_h


def image_tokens(height: int, width: int, image_processor, processor, images_in_row: Optional[int] = None) -> int:
    """LLM tokens one ``<image>`` expands to. One image in the row: base tokens + the unpadded
    patch grid's tokens + one newline per grid row (grids beyond ``anyres_max_N`` shrunk as the
    model interpolates them); several: base tokens + one newline. Minus one each with the
    ``"default"`` feature strategy (CLS dropped)."""
    base = int(processor.num_image_tokens)
    if _in_row(image_processor, images_in_row) != 1:
        n = base + 1
    else:
        s = settings(image_processor)
        bh, bw = best_resolution(height, width, image_processor)
        side = int(math.sqrt(base))
        max_patches = int(processor.vision_aspect_ratio.strip("anyres_max_"))
        feats, newlines = _unpadded(int(height), int(width), side, bh // s["tile"][0], bw // s["tile"][1], max_patches)
        n = feats + newlines + base
    return n - 1 if processor.vision_feature_select_strategy == "default" else n


def placeholder_text(height: int, width: int, processor, image_processor=None,
                     images_in_row: Optional[int] = None) -> str:
    """Exactly the text `LlavaOnevisionProcessor` puts in place of one ``<image>``
    (``image_processor``: default the processor's effective one)."""
    ip = processor if image_processor is None else image_processor
    return processor.image_token * image_tokens(height, width, ip, processor, images_in_row)


def placeholder_runs(height: int, width: int, processor, image_processor=None,
                     images_in_row: Optional[int] = None) -> tuple[str, list[int]]:
    """`placeholder_text` as one ``<image>`` and its run length (`image_tokens`), for
    `mmpipe.media.tiles_encode` to tokenize the short text and repeat the id."""
    ip = processor if image_processor is None else image_processor
    n = image_tokens(height, width, ip, processor, images_in_row)
    return (processor.image_token, [n]) if n else ("", [])


def _resize(image: Image.Image, h: int, w: int, resample: int) -> np.ndarray:
    return np.asarray(image if image.size == (w, h) else image.resize((w, h), resample=resample))


def _square(image: Image.Image, fill: tuple) -> Image.Image:
    # the processor's pad_to_square: centred on a square of the mean colour
    w, h = image.size
    if w == h:
        return image
    side = max(w, h)
    out = Image.new("RGB", (side, side), fill)
    out.paste(image, (0, (side - h) // 2) if w > h else ((side - w) // 2, 0))
    return out


def tiles_u8(image: Image.Image, image_processor, images_in_row: Optional[int] = None) -> np.ndarray:
    """uint8 ``[n, S_h, S_w, 3]``: the tiles the processor normalises, in its order (base tile,
    then the anyres patches row-major; one padded-square tile when ``images_in_row != 1``).
    ``image``: PIL RGB (the processor's RGB conversion already applied)."""
    s = settings(image_processor)
    (th, tw), p, resample = s["tile"], s["patch"], s["resample"]
    if _in_row(image_processor, images_in_row) != 1:
        return _resize(_square(image, s["fill"]), th, tw, resample)[None]
    height, width = image.height, image.width
    bh, bw = _best(height, width, s["pinpoints"])
    # the processor's get_patch_output_size: fit inside the pinpoint, keep the aspect ratio
    if bw / width < bh / height:
        nh, nw = min(math.ceil(height * (bw / width)), bh), bw
    else:
        nh, nw = bh, min(math.ceil(width * (bh / height)), bw)
    canvas = np.zeros((bh, bw, 3), np.uint8)
    top, left = (bh - nh) // 2, (bw - nw) // 2
    canvas[top:top + nh, left:left + nw] = _resize(image, nh, nw, resample)
    tiles = [_resize(image, th, tw, resample)]
    for i in range(0, bh, p):
        for j in range(0, bw, p):
            patch = canvas[i:i + p, j:j + p]
            if patch.shape[:2] != (th, tw):  # a pinpoint not a multiple of the patch: resized as the processor does
                patch = _resize(Image.fromarray(np.ascontiguousarray(patch)), th, tw, resample)
            tiles.append(patch)
    return np.stack(tiles)


def image_sizes(sizes) -> np.ndarray:
    """int64 ``[n_images, 2]``: each image's ORIGINAL (height, width), the model input that
    tells the model each image's tile grid and unpadding (``sizes``: (h, w) pairs)."""
    return np.asarray([(int(h), int(w)) for h, w in sizes], dtype=np.int64).reshape(-1, 2)


def extra_inputs(image_hw, tiles_per_image=None, image_offsets=None) -> dict:
    """The model inputs besides ``pixel_values`` of a batch's images (``image_hw``: int64 [I, 2]
    original (height, width)): ``{"image_sizes": int64 [I, 2]}``, and with the batch's layout
    (``tiles_per_image`` int64 [I], ``image_offsets`` int64 [B+1]) ``"batch_num_images"``
    (`model_batch_num_images`), as the processor returns them."""
    out = {"image_sizes": image_sizes(np.asarray(image_hw).reshape(-1, 2))}
    if tiles_per_image is not None and image_offsets is not None:
        out["batch_num_images"] = model_batch_num_images(tiles_per_image, image_offsets)
    return out


def batch_pixel_values(pixel_values: np.ndarray, tiles_per_image) -> np.ndarray:
    """The processor's layout of a batch's pixels: float32 [N, 3, S, S] (every image's tiles,
    concatenated) -> float32 [I, max tiles, 3, S, S], each image's tiles first and float 0.0
    after them (the model slices them off by ``image_sizes``)."""
    counts = [int(n) for n in tiles_per_image]
    out = np.zeros((len(counts), max(counts, default=0), *pixel_values.shape[1:]), pixel_values.dtype)
    start = 0
    for i, n in enumerate(counts):
        out[i, :n] = pixel_values[start:start + n]
        start += n
    return out


def model_batch_num_images(tiles_per_image, image_offsets) -> np.ndarray:
    """int64 [K]: the model's ``batch_num_images`` for a batch of rows in either mode (rows own
    images ``image_offsets[b]:image_offsets[b+1]``): a per-conversation row of several images
    counts as one entry of its image count (one tile each), every other image as an entry of
    1 (tiled). Equal to the processor's own output for a batch in one mode: its per-row counts
    (chat path), or all 1 (a flat image list); the model reads it only to know which images
    were tiled (``n == 1``)."""
    t, at = np.asarray(tiles_per_image).reshape(-1), np.asarray(image_offsets, dtype=np.int64).reshape(-1)
    out: list[int] = []
    for a, b in zip(at[:-1].tolist(), at[1:].tolist()):
        out += [b - a] if stored_mode(t[a:b]) == "per_conversation" else [1] * (b - a)
    return np.asarray(out, dtype=np.int64)


def batch_num_images(images_per_row) -> np.ndarray:
    """int64 ``[rows with images]``: the model's ``batch_num_images`` (rows without images are
    left out, as the processor does); it decides which images were tiled (rows with exactly
    one)."""
    return np.asarray([int(n) for n in images_per_row if n], dtype=np.int64)


# The interface name (`mmpipe.images.tiles`); the placeholder mechanics themselves (finding the
# placeholders, splicing the text) are written once, in mmpipe.media.tiles_encode.
expand_placeholder = placeholder_text
