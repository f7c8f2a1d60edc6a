"""The RGB image the processor works on: how any PIL mode becomes RGB (as the processor converts
it, transparency by `mmpipe.images.transparency`'s rule), refusing the modes whose values the
conversion would clip (16-bit, int, float beyond 0..255) or that PIL cannot convert."""

from __future__ import annotations

from typing import Optional

import numpy as np
from PIL import Image

from mmpipe.errors import ImageError
from mmpipe.images.orientation import read_pixels
from mmpipe.images.transparency import apply_rule, check_transparency, has_transparency, transparency_rule

__all__ = ["check_range", "to_rgb_image", "to_rgb_array", "unconvertible_error"]

_WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
_EXTREMA_MODES = ("I", "I;16", "F")  # the wide modes PIL's getextrema takes


def check_range(img: Image.Image, where: str = "") -> None:
    """16-bit / int / float images: PIL's (and so the processor's) RGB conversion clips
    values to 0..255, turning a 16-bit photo white. Raise instead of training on that
    (``where``: the image's location, "" where the caller adds it)."""
    if img.mode not in _WIDE_MODES:
        return
    # PIL computes extrema of I;16 but not of its byte-order variants (I;16B: big-endian TIFFs):
    # those are read through mode I, the same values
    lo, hi = (img if img.mode in _EXTREMA_MODES else img.convert("I")).getextrema()
    if lo < 0 or hi > 255:
        raise ImageError(
            f"{img.mode} image with values {lo}..{hi}: converting it to RGB clips them to 0..255 "
            "(what the transformers processor does), which would wash the image out", where=where,
            expected="8-bit data (values 0..255)", found=f"mode {img.mode}, values {lo}..{hi}",
            fix="convert to 8 bits yourself, e.g. Image.fromarray((np.asarray(img) >> 8).astype(np.uint8))",
        )


def to_rgb_image(img: Image.Image, transparency: Optional[str] = None) -> Image.Image:
    """The RGB PIL image the processor works on. ``transparency``: how an image with
    transparency becomes RGB (`TRANSPARENCY_RULES`): None / ``"auto"`` as the installed
    transformers' processors do it (`transparency_rule`), ``"white"`` (composited onto white)
    or ``"drop"`` (``convert("RGB")``). An RGB image without transparency is returned as is
    (no copy); the rule is looked up only for an image with transparency."""
    read_pixels(img)  # a decode error is the file's (the caller's); a ValueError below is the conversion's
    check_range(img)
    if has_transparency(img):
        return apply_rule(img, transparency_rule(transparency))
    check_transparency(transparency)
    if img.mode == "RGB":
        return img
    try:
        return img.convert("RGB")
    except ValueError as e:
        raise unconvertible_error(img, e) from e


def unconvertible_error(img: Image.Image, e: Exception) -> ImageError:
    """The `ImageError` (located by the caller) for a PIL mode PIL cannot convert to RGB (such as
    ``La``, premultiplied LA): the transformers processor, whose first step is that conversion,
    refuses it too."""
    return ImageError(
        f"PIL cannot convert a mode {img.mode} image to RGB ({e}), and neither can the transformers processor",
        where="", expected="a mode PIL converts to RGB (RGB, RGBA, L, LA, P, CMYK, YCbCr, ...)",
        found=f"mode {img.mode}", fix="convert the image to such a mode first (a premultiplied La image: "
                                      "im.convert('LA')), or drop the row (on_error='skip')")


def to_rgb_array(img: Image.Image, transparency: Optional[str] = None) -> np.ndarray:
    """uint8 [H, W, 3]: `to_rgb_image` as an array."""
    return np.asarray(to_rgb_image(img, transparency))
