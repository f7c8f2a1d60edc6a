"""Any image value (datasets.Image() dict, path, bytes, data URI, PIL, uint8 array) -> an upright
RGB PIL image, or an `ImageError` naming the image. Header-only size reads for the layout path."""

from __future__ import annotations

import io
import os
import re
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from mmpipe.errors import ImageError



# ---- loading ---------------------------------------------------------------------------
def load_image(value: Any, *, where: str = "image") -> Image.Image:
    """Any supported image value -> PIL image (not yet decoded where PIL can avoid it).

    Accepted: PIL image; ``datasets.Image()`` value ``{"bytes": ..., "path": ...}``; a file
    path (or ``file://``); a base64 ``data:image/...`` URI; raw encoded bytes; a uint8 array
    ``[H, W]``, ``[H, W, 1|3|4]``. URLs are refused (mmpipe does not fetch).
    """
    if isinstance(value, Image.Image):
        return value
    found = f"{type(value).__name__}"
    try:
        if isinstance(value, dict):
            if value.get("bytes") is not None:
                return Image.open(io.BytesIO(value["bytes"]))
            if value.get("path") is not None:
                return load_image(value["path"], where=where)
            raise ImageError("the image dict has neither 'bytes' nor 'path'", where=where,
                             expected="{'bytes': <encoded image>} or {'path': <file>}", found=f"keys {sorted(value)}",
                             fix="store images with datasets.Image() or give a path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return Image.open(io.BytesIO(bytes(value)))
        if isinstance(value, str) and value.startswith("data:"):
            return Image.open(io.BytesIO(_data_uri_bytes(value, where)))
        if isinstance(value, (str, os.PathLike)):
            path = os.fspath(value)
            if path.startswith("file://"):
                path = path[len("file://"):]
            if path.startswith(("http://", "https://")):
                raise ImageError(f"{path[:80]!r} is a URL; mmpipe does not fetch images", where=where,
                                 expected="a local path, encoded bytes, a data: URI or a PIL image", found="a URL",
                                 fix="download the images first (e.g. datasets' Image() cast on a local copy)")
            if not os.path.exists(path):
                raise ImageError(f"no such file: {path!r}", where=where, expected="an existing image file",
                                 found="a missing path",
                                 fix="fix the path (relative paths resolve against the working directory) "
                                     "or embed the image bytes with datasets.Image()")
            return Image.open(path)
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            return _array_to_pil(value, where)
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise unreadable_error(e, where, found) from e
    raise ImageError(
        f"unsupported image value of type {type(value).__name__}", where=where,
        expected="a PIL image, a datasets Image dict, a path, encoded bytes or a uint8 array [H, W, C]",
        found=type(value).__name__, fix="convert the value to one of those",
    )


def _data_uri_bytes(uri: str, where: str) -> bytes:
    """``data:image/png;base64,...`` (OpenAI-style ``image_url``) -> the encoded image bytes."""
    import base64
    import binascii

    head, sep, payload = uri.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError("unsupported data: URI", where=where, expected="data:image/<type>;base64,<payload>",
                         found=repr(uri[:40]), fix="base64-encode the image bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"the data: URI's base64 payload is invalid ({e})", where=where,
                         fix="re-encode the image with base64.b64encode") from e


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def unreadable_error(e: Exception, where: str, found: str = "", fix: str = "") -> ImageError:
    """The `ImageError` for image bytes PIL cannot decode (``e``: PIL's error); ``fix``
    replaces the encode-stage advice (re-export the image or skip the row)."""
    # PIL names the stream by its repr ("<_io.BytesIO object at 0x7f...>"): keep the
    # message (and an on_error="skip" record) the same from run to run
    detail = _OBJECT_REPR.sub("the image data", str(e))
    return ImageError(
        f"cannot read the image ({type(e).__name__}: {detail})", where=where,
        expected="a complete PNG/JPEG/WebP/GIF/... file", found=found or None,
        fix=fix or "the bytes are corrupt or truncated: re-export the image, or drop the row (on_error='skip')",
    )


def bomb_error(e: Exception, where: str) -> ImageError:
    return ImageError(
        f"the image is larger than PIL's decompression-bomb limit ({e})", where=where,
        expected=f"at most {2 * Image.MAX_IMAGE_PIXELS} pixels (2 x PIL.Image.MAX_IMAGE_PIXELS)",
        fix="downscale the file before encoding, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the "
            "source (decoding takes about 3 bytes per pixel)",
    )


def _array_to_pil(arr: np.ndarray, where: str = "image") -> Image.Image:
    arr = _check_array(arr, where)
    if arr.ndim == 2:
        return Image.fromarray(arr, mode="L")
    return Image.fromarray(arr, mode="RGB" if arr.shape[-1] == 3 else "RGBA")


def _check_array(arr: np.ndarray, where: str) -> np.ndarray:
    """A uint8 [H, W] / [H, W, 1|3|4] array (a trailing channel of 1 dropped), or raise."""
    if arr.dtype != np.uint8:
        raise ImageError("image arrays must be uint8", where=where, expected="dtype uint8 [H, W, C]",
                         found=f"dtype {arr.dtype}",
                         fix="convert with np.clip(x, 0, 255).astype(np.uint8) (x*255 first for 0..1 floats)")
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4)):
        return arr
    raise ImageError("image arrays must be [H, W] or [H, W, 1|3|4]", where=where,
                     expected="[H, W], [H, W, 1], [H, W, 3] or [H, W, 4]", found=f"shape {arr.shape}",
                     fix="channels last; one image per array")


# EXIF orientations 5..8 swap width and height (transpose / rotate by 90 degrees)
_EXIF_ORIENTATION = 0x0112


_SWAPS_AXES = (5, 6, 7, 8)


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1..8; 1 = upright) from the header; no pixel decode.

    A PNG's eXIf chunk counts only when it comes before the image data (where the PNG
    standard puts it, and PIL writes it): looking for a later one makes PIL decode the image."""
    if img.format == "PNG" and "exif" not in img.info:
        return 1
    try:
        o = img.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block: PIL itself ignores it when decoding
        return 1
    return int(o) if isinstance(o, int) and 1 <= o <= 8 else 1


def upright(img: Image.Image) -> Image.Image:
    """The image as displayed: EXIF orientation applied (``PIL.ImageOps.exif_transpose``,
    as ``datasets.Image()`` decoding does); the image itself when already upright."""
    if exif_orientation(img) == 1:
        return img
    return ImageOps.exif_transpose(img)


def image_hw(value: Any, *, where: str = "image") -> tuple[int, int]:
    """(height, width) of the upright image from the header alone; no pixel decode."""
    if isinstance(value, np.ndarray):
        _check_array(value, where)
        return int(value.shape[0]), int(value.shape[1])
    img = load_image(value, where=where)
    w, h = img.size
    return (w, h) if exif_orientation(img) in _SWAPS_AXES else (h, w)


_WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")


def _check_range(img: Image.Image) -> None:
    """16-bit / int / float images: PIL's (and so the processor's) RGB conversion clips
    values to 0..255, turning a 16-bit photo white. Raise instead of training on that."""
    if img.mode not in _WIDE_MODES:
        return
    lo, hi = img.getextrema()
    if lo < 0 or hi > 255:
        raise ImageError(
            f"{img.mode} image with values {lo}..{hi}: converting it to RGB clips them to 0..255 "
            "(what the transformers processor does), which would wash the image out", where="",
            expected="8-bit data (values 0..255)", found=f"mode {img.mode}, values {lo}..{hi}",
            fix="convert to 8 bits yourself, e.g. Image.fromarray((np.asarray(img) >> 8).astype(np.uint8))",
        )


def to_rgb_image(img: Image.Image) -> Image.Image:
    """The RGB PIL image the processor works on, transparency composited onto white (as
    transformers does). An RGB image without transparency is returned as is (no copy)."""
    _check_range(img)
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3], transparency composited onto white (as transformers does)."""
    return np.asarray(to_rgb_image(img))

