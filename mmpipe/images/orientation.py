"""The orientation an image is shown in, decided as ``datasets.Image()`` decoding decides it:
``image.load()``, then ``image.getexif()``'s Orientation tag (1..8), applied by
``PIL.ImageOps.exif_transpose``. Pillow's ``getexif`` reads the EXIF block and, when that has no
Orientation, an XMP packet's ``tiff:Orientation``.

A PNG may hold both after its image data (an ``eXIf`` chunk, or an ``iTXt`` / ``tEXt`` / ``zTXt``
chunk with XMP or an ImageMagick "Raw profile type exif"), which Pillow reads only when it decodes
the pixels. Header-only reads (the layout path: ``pixels="none"``, the grids of
``pixels="source"`` rows) must not decode, so `png_orientation` walks the chunk list instead:
chunk headers only, skipping each chunk's data by its length, and the data of the few metadata
chunks, handed to Pillow's own chunk handlers - the same dictionary ``load()`` leaves in
``img.info``, then Pillow's ``getexif`` on it. The pixel routes load the image first
(`upright`), so there Pillow itself decides, as in ``datasets``.
"""

from __future__ import annotations

import io
import os
import re
import struct
from typing import Any, Callable, Optional

from PIL import Image, ImageFile, ImageOps, PngImagePlugin

from mmpipe._fork import ForkSafeLock

__all__ = ["ORIENTATION_TAG", "SWAPS_AXES", "exif_orientation", "upright", "read_pixels",
           "png_orientation", "png_loaded_info", "orientation_of_info"]

ORIENTATION_TAG = 0x0112
SWAPS_AXES = (5, 6, 7, 8)  # orientations that swap width and height (transpose / rotate by 90 degrees)
_PNG_META = {b"tEXt", b"zTXt", b"iTXt", b"eXIf"}  # the chunks that can carry EXIF or XMP into img.info
_HEAD = struct.Struct(">I4s")  # a chunk's length and type
_IS_CID = re.compile(rb"\w\w\w\w").match  # Pillow's chunk-type test: load() stops at another


def orientation_of_info(info: dict) -> int:
    """The orientation (1..8; 1 also for none or a broken block) ``Image.getexif`` reports for
    an image whose ``info`` is ``info`` (its EXIF block, else its XMP ``tiff:Orientation``)."""
    probe = Image.Image()
    probe.info = info
    try:
        o = probe.getexif().get(ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block: read as no orientation
        return 1
    return int(o) if isinstance(o, int) and 1 <= o <= 8 else 1


def exif_orientation(img: Image.Image) -> int:
    """The orientation tag (1..8; 1 = upright) ``datasets.Image()`` decoding applies to ``img``,
    without decoding its pixels: PIL's ``getexif`` (EXIF, else XMP), and for a PNG not yet
    decoded, `png_orientation` (metadata after the image data counts, as PIL reads it on load)."""
    if img.format == "PNG" and getattr(img, "tile", None):
        return png_orientation(img)
    try:
        o = img.getexif().get(ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block: PIL itself ignores it when decoding
        return 1
    return int(o) if isinstance(o, int) and 1 <= o <= 8 else 1


# A PIL image from ``Image.open`` reads its file lazily, through its ONE file object: two threads
# reading it at once (rows sharing an image object, encoded on threads sharing an Encoder) interleaved
# their seeks and reads - wrong pixels without an error, or truncated / closed-file errors. Every read
# of such an image's file here holds that image's lock (striped by object id; renewed in a forked child).
_FILE_LOCKS = tuple(ForkSafeLock() for _ in range(61))


def file_lock(img: Image.Image) -> ForkSafeLock:
    """The lock every read of ``img``'s file holds (see above)."""
    return _FILE_LOCKS[(id(img) >> 4) % len(_FILE_LOCKS)]


def read_pixels(img: Image.Image) -> Image.Image:
    """``img`` with its pixels read (``img.load()``: PIL decodes lazily), one thread at a time per
    image object; PIL's own errors pass (the callers locate them)."""
    if isinstance(img, ImageFile.ImageFile):
        with file_lock(img):
            img.load()
    return img


def upright(img: Image.Image) -> Image.Image:
    """The image as displayed: its orientation applied (``PIL.ImageOps.exif_transpose``, as
    ``datasets.Image()`` decoding does); the image itself when already upright. The image is
    decoded first (`read_pixels`), so PIL reads what follows a PNG's image data, as ``datasets``
    does (load, then getexif)."""
    read_pixels(img)
    if exif_orientation(img) == 1:
        return img
    return ImageOps.exif_transpose(img)


def png_orientation(img: Image.Image) -> int:
    """The orientation PIL's ``getexif`` reports for PNG ``img`` once it is loaded, from its file's
    chunk list (module doc): what ``img.info`` holds after ``load()``. An image whose file is gone
    (closed) gets what its header gave."""
    try:
        with file_lock(img):  # not while another thread decodes (and then closes) the file
            reads = _positional(getattr(img, "fp", None))
            info = None if reads is None else png_loaded_info(*reads, animated=bool(getattr(img, "is_animated", False)))
    except (OSError, ValueError):  # the file cannot be read again: what its header gave
        info = None
    return orientation_of_info(dict(img.info) if info is None else info)


def png_loaded_info(read_at: Callable[[int, int], Any], size: int, *, animated: bool = False) -> dict:
    """The metadata entries of ``img.info`` PIL leaves after loading the PNG whose bytes
    ``read_at(offset, n)`` returns (``size`` bytes in all): its ``tEXt`` / ``zTXt`` / ``iTXt`` /
    ``eXIf`` chunks, in file order, through PIL's own chunk handlers, up to where PIL's load stops
    (``IEND``, a chunk type PIL refuses, the end of the data, the next frame of an animation, a
    chunk PIL fails to read)."""
    stream = PngImagePlugin.PngStream(io.BytesIO())
    pos, in_data, head = 8, False, _HEAD.unpack
    while pos + 8 <= size:
        length, cid = head(read_at(pos, 8))
        if cid == b"IDAT":  # most chunks: skipped first
            in_data = True
        elif not _IS_CID(cid) or cid == b"IEND":
            break
        elif cid == b"fdAT":
            in_data = True
        elif cid == b"fcTL" and in_data and animated:  # load() decodes the first frame only
            break
        elif cid in _PNG_META:
            if pos + 8 + length > size:  # PIL's read fails: load() raises
                break
            stream.fp = io.BytesIO(read_at(pos + 8, length))
            try:
                stream.call(cid, pos + 8, length)
            except Exception:  # noqa: BLE001 - PIL's load() stops (or fails) here too
                break
        pos += 12 + length
    return stream.im_info


def _positional(fp) -> Optional[tuple[Callable[[int, int], Any], int]]:
    """``(read_at(offset, n), size)`` over a PIL image's file, reads that leave its position alone
    (PIL decodes from it later); None when there is no open file to read."""
    if fp is None or getattr(fp, "closed", False) or not hasattr(fp, "seek"):
        return None
    if isinstance(fp, io.BytesIO):  # PIL's stream over bytes: getvalue() is those bytes, no copy
        data = fp.getvalue()
        return (lambda o, n: data[o:o + n]), len(data)
    try:
        fd = fp.fileno()
        size = os.fstat(fd).st_size
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is not None and hasattr(os, "pread"):  # a chunk header a system call (~1 us)
        return (lambda o, n: os.pread(fd, n, o)), size
    here = fp.tell()
    size = fp.seek(0, os.SEEK_END)
    fp.seek(here)

    def read_at(o: int, n: int) -> bytes:
        back = fp.tell()
        fp.seek(o)
        try:
            return fp.read(n)
        finally:
            fp.seek(back)
    return read_at, size
