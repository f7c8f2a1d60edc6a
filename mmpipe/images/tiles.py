"""Tiled families (`mmpipe.families.ModelFamily`: Gemma 3, InternVL, LLaVA-OneVision): compact
uint8 tiles <-> the processor's float32 ``pixel_values``, and the image processor a processor
call really uses.

These processors resize each image (or crop) to a uint8 tile, then rescale and normalise each
pixel on its own: ``pixel_values`` is a per-pixel, per-channel function of the resized uint8
tile. So mmpipe stores the tiles (uint8 [n, S, S, 3], 1/4 of the float32 bytes) and expands
them at collate time through a 256-entry table per channel (`normalise_table`) computed with
the image processor's OWN ``rescale`` / ``normalize`` methods: bit-exact by construction.

A family's image module (``mmpipe.images.<family>``, named in its `ModelFamily.module`) exposes:

- ``tile_count(height, width, image_processor) -> int``: tiles of one image (header size only);
- ``image_tokens(height, width, image_processor, processor) -> int``: the feature tokens
  (``ModelFamily.feature_token``) its placeholder text holds (header size only);
- ``tiles_u8(image: PIL RGB, image_processor) -> uint8 [n, S, S, 3]``: the resized tiles, in
  the processor's order (what it normalises into ``pixel_values``);
- ``expand_placeholder(height, width, processor, image_processor=None) -> str``: the text one
  ``ModelFamily.image_token`` becomes, exactly as the processor writes it;
- optionally ``BACKENDS``: the image-processor backends ``tiles_u8`` reproduces (default
  ``("pil",)``; `resize_tile` resizes as either backend does);
- optionally ``max_tiles(image_processor) -> int``: the most tiles one image can have (memory
  bounds of `mmpipe.map_kwargs`; default: a 2048x2048 image's `tile_count`);
- optionally ``extra_inputs(image_hw: int64 [I, 2]) -> {name: array}``: model inputs derived
  from the images' (height, width) (LLaVA-OneVision's ``image_sizes``), and
  ``batch_pixel_values(pixel_values: float32 [N, 3, S, S], tiles_per_image: int64 [I]) ->
  array``: the batch's ``pixel_values`` when the model takes another layout than the tiles
  concatenated (default: as given).

``image_processor`` is always `effective_image_processor`'s copy: the processor call's own
settings (its ``images_kwargs`` defaults, e.g. Gemma 3's ``do_pan_and_scan=False``, override the
image processor's attributes, and so do the caller's keyword arguments).
"""

from __future__ import annotations

import copy
import sys
from typing import Optional

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.images.pixels import u8_video_to_pixel_values

__all__ = ["effective_image_processor", "normalise_table", "normalise_tiles", "resize_tile", "tiles_to_u8",
           "image_tiles", "with_images_kwargs", "check_call_kwargs"]

_NORMALISED_AT_COLLATE = ("collate expands the stored uint8 tiles with the collating processor's own rescale and "
                          "normalisation: set it on the processor's image processor (its preprocessor_config.json)")
# processor-call image options whose effect the stored tiles cannot carry -> what to do instead (a family's
# image module adds its own in REFUSED_CALL_KWARGS)
REFUSED_CALL_KWARGS = {
    "size": "collate takes tiles of the collating processor's tile size only: set size on the processor's image "
            "processor (its preprocessor_config.json), as the checkpoint's vision tower expects",
    **{k: _NORMALISED_AT_COLLATE for k in ("image_mean", "image_std", "do_normalize", "do_rescale", "rescale_factor")},
}


def effective_image_processor(processor, **images_kwargs):
    """A shallow copy of ``processor.image_processor`` whose attributes are what a processor
    call passes it: the processor's merged image kwargs (its class defaults, then
    ``images_kwargs`` from the caller, e.g. ``do_pan_and_scan=True``). A bare image processor
    (no ``image_processor`` attribute) is copied with ``images_kwargs`` set on it."""
    ip = getattr(processor, "image_processor", None)
    merged, ip = (dict(images_kwargs), processor) if ip is None else (_merged(processor, images_kwargs), ip)
    out = copy.copy(ip)
    for k, v in merged.items():
        if v is not None:
            setattr(out, k, v)
    return out


def check_call_kwargs(images_kwargs: dict, image_processor, module, what: str) -> None:
    """`ArgumentError` for an encoder's ``images_kwargs`` (the processor call's image options) whose
    effect mmpipe would not reproduce, so its rows would silently differ from the processor's call:
    normalisation and tile size (collate uses the collating processor's), and the family module's
    ``REFUSED_CALL_KWARGS``. ``image_processor``: the `effective_image_processor` (a family whose
    module sets ``RESIZES_ALWAYS`` refuses ``do_resize=False`` there, given or the processor's own:
    its processor then keeps each image at its own size, not a tile). ``what``: "Cls (family)"."""
    refused = {**REFUSED_CALL_KWARGS, **getattr(module, "REFUSED_CALL_KWARGS", {})}
    for key in images_kwargs:
        if key in refused:
            raise ArgumentError(f"images_kwargs {key!r} is not available for {what}: {refused[key]}")
    if getattr(module, "RESIZES_ALWAYS", False) and getattr(image_processor, "do_resize", True) is False:
        raise ArgumentError(f"do_resize=False is not available for {what}: its processor then keeps every image at "
                            "its own size instead of resizing it to a tile, which mmpipe's tiles (and the vision "
                            "tower) do not take; leave do_resize at True (images_kwargs and the image processor)")


def with_images_kwargs(image_processor, images_kwargs: Optional[dict]):
    """``image_processor`` (an `effective_image_processor` copy) with a row's ``images_kwargs``
    set on a shallow copy (the caller's kwargs override the processor's defaults, as in
    `effective_image_processor`); the same object when there are none."""
    if not images_kwargs:
        return image_processor
    out = copy.copy(image_processor)
    for k, v in images_kwargs.items():
        if v is not None:
            setattr(out, k, v)
    return out


def image_tiles(value, image_processor, module, *, where: str = "image") -> tuple[tuple[int, int], np.ndarray]:
    """One image (any form `mmpipe.images.load_image` takes: a path, bytes, ``{"bytes"}``, PIL,
    array) -> ((height, width) upright, uint8 tiles [n, S, S, 3] of the family ``module``): the
    decode, EXIF orientation, RGB conversion and tiling of both the ``"uint8"`` encode and the
    ``"source"`` rows' collate, so the two give the same tiles."""
    from PIL import Image

    from mmpipe.errors import InputError
    from mmpipe.images.load import bomb_error, load_image, located, to_rgb_image, unreadable_error, upright

    img = load_image(value, where=where)
    try:  # PIL decodes here (it opens lazily)
        rgb = to_rgb_image(upright(img))
        return (rgb.height, rgb.width), module.tiles_u8(rgb, image_processor)
    except InputError as e:  # an ImageError (before the ValueError clause: InputError is one)
        raise located(e, where)
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:
        raise unreadable_error(e, where, getattr(img, "format", None) and f"a {img.format} image") from e


def resize_tile(image, height: int, width: int, image_processor) -> np.ndarray:
    """uint8 [height, width, 3]: an RGB PIL image resized as ``image_processor`` resizes it: PIL
    with its ``resample`` (the PIL backend), or torch's antialiased uint8 kernel with the
    matching mode (the torchvision backend: what torchvision's ``resize`` runs on a uint8 CPU
    tensor; same size: unchanged, as torchvision returns it)."""
    from PIL import Image

    resample = getattr(image_processor, "resample", None)
    resample = Image.BILINEAR if resample is None else int(resample)
    if getattr(image_processor, "backend", "pil") != "torchvision":
        return np.asarray(image.resize((width, height), resample=resample))
    if image.size == (width, height):
        return np.asarray(image)
    import torch
    import torch.nn.functional as F

    from mmpipe._fork import torch_fork_safe

    modes = {int(Image.BILINEAR): "bilinear", int(Image.BICUBIC): "bicubic"}
    if resample not in modes:
        raise ArgumentError(f"the torchvision backend is reproduced for bilinear and bicubic resizing, got resample={resample}")
    torch_fork_safe()  # a forked map worker's first parallel torch op deadlocks otherwise
    t = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()[None]
    out = F.interpolate(t, size=[height, width], mode=modes[resample], align_corners=False, antialias=True)
    return np.ascontiguousarray(out[0].permute(1, 2, 0).numpy())


def _merged(processor, images_kwargs: dict) -> dict:
    """The image kwargs a processor call passes its image processor (the processor's own merge:
    class defaults < caller's)."""
    init = getattr(processor.tokenizer, "init_kwargs", {})
    try:  # transformers >= 5.2x: the defaults are the processor's own
        return processor._merge_kwargs(tokenizer_init_kwargs=init, **images_kwargs)["images_kwargs"]
    except (TypeError, AttributeError, KeyError):
        pass
    for cls in type(processor).__mro__:  # earlier: a `<Processor>Kwargs` class next to the processor's
        kwargs_class = getattr(sys.modules.get(cls.__module__), cls.__name__ + "Kwargs", None)
        if kwargs_class is not None:
            return processor._merge_kwargs(kwargs_class, tokenizer_init_kwargs=init, **images_kwargs)["images_kwargs"]
    return {**dict(getattr(type(processor), "images_kwargs", None) or {}), **images_kwargs}


def normalise_table(image_processor) -> np.ndarray:
    """float32 [3, 256]: ``pixel_values`` of a pixel whose channel c holds value v is
    ``table[c, v]``. Computed by the image processor's own ``rescale`` and ``normalize`` (PIL
    backend: float64 rescale, float32 normalise) or fused ``rescale_and_normalize``
    (torchvision backend) on a [3, 1, 256] image holding every value, with its
    ``do_rescale`` / ``rescale_factor`` / ``do_normalize`` / ``image_mean`` / ``image_std``."""
    ip = image_processor
    values = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()
    do_rescale, do_normalize = bool(getattr(ip, "do_rescale", True)), bool(getattr(ip, "do_normalize", True))
    factor = getattr(ip, "rescale_factor", 1 / 255)
    mean, std = getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
    if getattr(ip, "backend", "pil") == "torchvision":
        import torch

        out = ip.rescale_and_normalize(torch.from_numpy(values)[None], do_rescale, factor, do_normalize, mean, std)
        return np.ascontiguousarray(out[0].to(torch.float32).numpy().reshape(3, 256))
    x = values
    if do_rescale:
        x = ip.rescale(x, factor)
    if do_normalize:
        x = ip.normalize(x.astype(np.float32) if x.dtype == np.uint8 else x, mean, std)
    if x.dtype != np.float32:
        raise ArgumentError(f"{type(ip).__name__} gives {x.dtype} pixel values; the tiled path expects float32")
    return np.ascontiguousarray(x.reshape(3, 256))


def normalise_tiles(tiles_u8: np.ndarray, table: np.ndarray, *, threads: Optional[int] = None) -> np.ndarray:
    """Compact tiles uint8 [n, S, S, 3] -> float32 [n, 3, S, S], the processor's
    ``pixel_values`` (``out[i, c, y, x] = table[c, tiles_u8[i, y, x, c]]``). The tiles are
    made channel-first (a uint8 copy), then expanded by the pair-table lookup the Qwen pixels
    use (`mmpipe.images.pixels.u8_video_to_pixel_values`; ``threads`` for large batches)."""
    if tiles_u8.ndim != 4 or tiles_u8.shape[-1] != 3 or tiles_u8.dtype != np.uint8:
        raise ArgumentError(f"tiles must be uint8 [n, S, S, 3], got {tiles_u8.dtype} {tuple(tiles_u8.shape)}")
    n, h, w, _ = tiles_u8.shape
    if n == 0:
        return np.zeros((0, 3, h, w), np.float32)
    planes = np.ascontiguousarray(tiles_u8.transpose(0, 3, 1, 2)).reshape(n, 3 * h * w)
    table = np.ascontiguousarray(table, dtype=np.float32)
    return u8_video_to_pixel_values(planes, table, threads=threads).reshape(n, 3, h, w)


def tiles_to_u8(pixel_values: np.ndarray, table: np.ndarray) -> Optional[np.ndarray]:
    """Inverse of `normalise_tiles`: float32 [n, 3, S, S] -> uint8 [n, S, S, 3], or None when a
    value is not in the table (the pixels were not made from uint8 tiles with it)."""
    out = np.empty((pixel_values.shape[0], *pixel_values.shape[2:], 3), np.uint8)
    for c in range(3):  # each channel's table is strictly increasing (std > 0)
        idx = np.searchsorted(table[c], pixel_values[:, c]).clip(0, 255)
        if not np.array_equal(table[c][idx], pixel_values[:, c]):
            return None
        out[..., c] = idx
    return out
