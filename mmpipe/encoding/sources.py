"""``pixels="source"``: keep each image's encoded file bytes instead of its pixels, and decode +
resize them at collate time (in DataLoader workers), bit for bit the uint8 path.

Stored per row: ``image_sources`` (one ``binary`` per image, Arrow ``list<binary>``): the
source file's bytes as given (``{"bytes"}`` of a ``datasets.Image()`` value, raw bytes, a
path's file, a ``data:`` URI's payload); an image given only as decoded pixels (a PIL image
without a file, an array) is stored as a lossless PNG (TIFF for modes PNG lacks) of those
pixels, EXIF kept (a mode neither file holds - RGBa, HSV - as the RGB image the uint8 encode
converts it to). Collate runs `mmpipe.images.encode_image` on the bytes: the same decode,
EXIF orientation and resize the ``"uint8"`` encode runs, so the pixels are identical. The tiled
families' source rows keep the same columns; `mmpipe.media.tiles_collate.decoded_rows` tiles them.

Why not a lossless PNG of the *resized* image: on the bench's real-size photos it is 5.9x the
JPEG sources (983 vs 167 KiB per image) and costs ~0.5 s per image to compress; the source
bytes are 1.0x.
"""

from __future__ import annotations

import io
import os
from typing import Any, Optional

import numpy as np
from PIL import Image

from mmpipe.errors import ImageError
from mmpipe.images.load import load_image, read_image_file

__all__ = ["SOURCE_COLUMN", "read_once", "source_bytes", "decode_sources", "with_pixels"]

SOURCE_COLUMN = "image_sources"


def source_bytes(value: Any, *, where: str = "image") -> bytes:
    """One image value (any form `mmpipe.images.load_image` accepts) -> encoded file bytes, checked
    to decode whole (`check_decodes`): a truncated or corrupt file is this row's `ImageError` at
    encode time (``on_error="skip"`` records it), not a collate failure in a DataLoader worker."""
    if isinstance(value, dict) and value.get("bytes") is not None:
        return check_decodes(bytes(value["bytes"]), where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return check_decodes(bytes(value), where)
    img = load_image(value, where=where)  # validates paths (regular file, size) and data URIs
    if not isinstance(value, Image.Image):  # a path or a data: URI, opened from its bytes
        fp, name = getattr(img, "fp", None), getattr(img, "filename", "") or ""
        if isinstance(fp, io.BytesIO):
            return check_decodes(fp.getvalue(), where)
        if name and os.path.isfile(name):
            return check_decodes(read_image_file(name, where=where), where)
    return _lossless(_usable(img, where), where)  # a PIL image (maybe edited since it was opened) or an array: its pixels


def read_once(value: Any, header, *, where: str = "image") -> tuple[Any, bytes]:
    """(``header`` of the image: its grid or size, `source_bytes` of it). An image named by a path
    is read once and ``header`` reads the bytes stored: a file replaced between a header read and
    a bytes read gave a row whose grid was one file's and whose bytes another's (encoded, then
    refused at collate in a DataLoader worker). Other values: ``header(value)`` first, as before
    (its typed errors come before `check_decodes`')."""
    from mmpipe.images.load import image_path

    if image_path(value, where=where) is None:
        return header(value), source_bytes(value, where=where)
    data = source_bytes(value, where=where)
    return header(data), data


def check_decodes(data: bytes, where: str) -> bytes:
    """``data`` (an encoded image file) when its whole pixel data decodes - a file cut short after
    its header (which alone gave the row's layout) raises `ImageError` here, as collate's decode
    would; JPEGs are decoded at 1/8 scale (PIL's draft: every byte is still read)."""
    with Image.open(io.BytesIO(data)) as im:
        if im.format == "JPEG":
            im.draft(im.mode, (max(1, im.width // 8), max(1, im.height // 8)))
        _usable(im, where)
    return data


def _usable(img: Image.Image, where: str) -> Image.Image:
    """``img`` decoded whole (PIL decodes lazily) and of values collate's RGB conversion keeps
    (`check_range`: 16-bit data past 255 would wash out), else this image's `ImageError` now:
    at encode, where ``on_error="skip"`` records it, not in the DataLoader worker that collates."""
    from mmpipe.errors import InputError
    from mmpipe.images.load import bomb_error, check_range, read_pixels, unreadable_error

    try:
        read_pixels(img)  # one thread at a time per image object (`mmpipe.images.orientation`)
        check_range(img, where)
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except Exception as e:  # noqa: BLE001 - PIL's OSError / SyntaxError / zlib and struct errors
        raise unreadable_error(e, where, fix="the source file is corrupt or truncated (its header is intact, its "
                               "pixel data is not): re-export the image, or drop the row (on_error='skip')") from e
    return img


def _lossless(img: Image.Image, where: str = "image") -> bytes:
    """A decoded image -> PNG bytes of the same pixels and mode (TIFF for modes PNG lacks), EXIF
    kept. A mode neither stores (RGBa, HSV, I;16N, La) is stored as the RGB image the ``"uint8"``
    encode converts it to first (`to_rgb_image`: ``convert("RGB")`` when it has no transparency:
    the same pixels once oriented and resized); where that conversion is refused (La), its `ImageError`."""
    exif = img.getexif()
    data = _saved(img, exif)
    if data is not None:
        return data
    from mmpipe.images.load import has_transparency, located, to_rgb_image

    if has_transparency(img):  # its RGB pixels depend on the collate's transparency rule: not fixed here
        raise ImageError(f"a mode {img.mode} image with transparency cannot be stored as a lossless file",
                         where=where, expected="a mode PNG or TIFF stores (RGB, RGBA, L, LA, P, ...)",
                         found=f"mode {img.mode} with transparency",
                         fix="convert the image to RGBA first, or encode it with pixels='uint8'")
    try:
        rgb = to_rgb_image(img)
    except ImageError as e:
        raise located(e, where)
    return _saved(rgb, exif)


def _saved(img: Image.Image, exif) -> Optional[bytes]:
    """``img`` as a PNG file, else a TIFF file, else None (a mode neither writes)."""
    for fmt in ("PNG", "TIFF"):
        out = io.BytesIO()
        try:
            img.save(out, fmt, exif=exif) if len(exif) else img.save(out, fmt)
            return out.getvalue()
        except (OSError, ValueError, KeyError):  # PIL: "cannot write mode ... as PNG"
            continue
    return None


def decode_sources(sources: list, grids: np.ndarray, spec, *, row: Any = None) -> np.ndarray:
    """A row's ``image_sources`` -> its uint8 patches [N, 3*p*p] (`encode_image` per image),
    checked against the row's stored grids int64 [I, 3]."""
    from mmpipe.images.pixels import encode_image

    blocks = []
    for i, data in enumerate(sources):
        u8, grid = encode_image({"bytes": bytes(data), "path": None}, spec, where=f"row {row}, image {i}")
        if tuple(int(x) for x in grids[i]) != tuple(grid):
            raise ImageError(f"image {i}'s source decodes to grid {tuple(grid)} but the row stores "
                             f"{tuple(int(x) for x in grids[i])}", where=f"row {row}", expected="the stored grid",
                             found=str(tuple(grid)), fix="collate with the processor (min/max_pixels) the rows were encoded with")
        blocks.append(u8)
    return np.concatenate(blocks) if blocks else np.zeros((0, 3 * spec.patch_size**2), np.uint8)


def with_pixels(rec, spec, row: Any = None):
    """A ``pixels="source"`` record -> the same record with uint8 pixels (other records as they
    are): what collate runs, in the DataLoader worker that builds the batch."""
    if rec.image_sources is None:
        return rec
    import dataclasses

    row_spec = spec.for_rows([rec.image_backend])  # the backend the row was encoded for
    u8 = decode_sources(rec.image_sources, rec.image_grid_thw, row_spec, row=row)
    return dataclasses.replace(rec, image_sources=None, pixel_values_u8=u8)
