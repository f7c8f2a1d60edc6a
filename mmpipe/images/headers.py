"""The size of a plain PNG or WebP from its header bytes, without PIL (the layout-only batch path,
beside `mmpipe.images.jpeg_header` for JPEG; `plain_image_hw` asks the one the bytes start like).

As for JPEG, each reader answers only for files PIL certainly opens with that size and no EXIF
orientation; for anything else it returns None and the caller asks PIL, which reads the file or
raises the error the row reports. `tests/images/test_headers.py` checks them against PIL on
encoder variants and on mutated bytes.

- **PNG**: the signature, then a 13-byte ``IHDR`` (a bit depth / colour type pair PIL knows, no
  interlace method but 0 or 1, compression and filter 0), then only chunks PIL reads without
  anything that can fail or change the size (``PLTE``, ``tRNS``, ``gAMA``, ``cHRM``, ``sRGB``,
  ``pHYs``, ``tEXt``, ``bKGD``, ``tIME``, ``sBIT``) up to the first ``IDAT``, every one complete with
  its CRC right (PIL checks them; it stops at ``IDAT`` without reading it); then complete chunks up
  to ``IEND`` with no APNG chunk and nothing that can give an orientation, anywhere: no ``eXIf`` and
  no text chunk keyed as EXIF or XMP (`PNG_ORIENTATION_KEYS`: Pillow's
  ``getexif`` reads them, after ``IDAT`` too once the image is loaded, as ``datasets`` decodes it).
- **WebP**: a RIFF whose size is the file's, holding one ``VP8 `` (lossy: a key frame tag of
  version 0-3, shown, its first partition inside the chunk, the start code, 14-bit sizes) or
  ``VP8L`` (lossless: the signature byte, version 0) chunk and nothing else: the extended format
  (``VP8X``: animation, alpha, EXIF) is PIL's to read.

Sizes must be non-empty and within ``PIL.Image.MAX_IMAGE_PIXELS`` (PIL warns above it).

A header says nothing of the rest of the file: `certainly_whole` tells a file that reaches its
format's end from its first and last bytes, and `decoded_unless_whole` decodes the others (as the
pixel route does), so the layout-only route refuses the cut files the pixel route refuses.
`unreadable_error` / `bomb_error`: the `ImageError` of a file PIL cannot decode, for both routes.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Optional

from mmpipe.errors import ImageError
from mmpipe.images.jpeg_header import jpeg_ends, plain_jpeg_hw

__all__ = ["bomb_error", "certainly_whole", "decoded_unless_whole", "file_ends", "open_whole", "plain_image_hw",
           "plain_png_hw", "plain_webp_hw", "unreadable_error"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# colour type -> the bit depths PIL maps to a mode
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_PLAIN = {b"PLTE", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"pHYs", b"tEXt", b"bKGD", b"tIME", b"sBIT"}
_PNG_REFUSED = {b"eXIf", b"acTL", b"fcTL", b"fdAT"}
_PNG_TEXT = {b"tEXt", b"zTXt", b"iTXt"}  # refused when their key is one getexif reads (XMP, raw EXIF)
# the PNG text keys Pillow's getexif reads ("xmp": its copy of the XMP iTXt's bytes; a tEXt or zTXt of
# that key makes getexif fail, so it is no plain file either)
PNG_ORIENTATION_KEYS = frozenset({b"exif", b"Raw profile type exif", b"XML:com.adobe.xmp", b"xmp"})


def _png_text_key(data: bytes, start: int, end: int) -> bytes:
    """A PNG text chunk's key: its data up to the first NUL (all of it without one)."""
    nul = data.find(b"\0", start, min(end, start + 80))
    return data[start:nul if nul >= 0 else end]


def _within_limits(h: int, w: int) -> Optional[tuple[int, int]]:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return (h, w) if h > 0 and w > 0 and (limit is None or h * w <= limit) else None


def plain_png_hw(data: bytes) -> Optional[tuple[int, int]]:
    """(height, width) of a plain PNG (module doc) as PIL reports it, or None (ask PIL)."""
    if not data.startswith(_PNG_SIGNATURE):
        return None
    pos, end, size, seen_idat = 8, len(data), None, False
    while pos + 12 <= end:
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body_end = pos + 8 + length
        if length > 0x7FFFFFFF or body_end + 4 > end:
            return None
        if ctype in _PNG_REFUSED:
            return None
        if ctype in _PNG_TEXT and _png_text_key(data, pos + 8, body_end) in PNG_ORIENTATION_KEYS:
            return None
        if seen_idat:  # after the image data PIL reads nothing at open; only the orientation matters (above)
            pos = body_end + 4
            if ctype == b"IEND":
                return size
            continue
        if ctype == b"IDAT" and size is not None:  # PIL stops at the first IDAT without reading it
            seen_idat, pos = True, body_end + 4
            continue
        body = data[pos + 8:body_end]
        if zlib.crc32(ctype + body) != struct.unpack(">I", data[body_end:body_end + 4])[0]:
            return None
        if size is None:
            if ctype != b"IHDR" or length != 13:
                return None
            w, h, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
            if depth not in _PNG_DEPTHS.get(colour, ()) or compression or filtering or interlace > 1:
                return None
            size = _within_limits(h, w)
            if size is None:
                return None
        elif ctype not in _PNG_PLAIN:
            return None
        pos = body_end + 4
    return None  # no IEND (truncated, or data after it PIL would not read): PIL decides


def plain_webp_hw(data: bytes) -> Optional[tuple[int, int]]:
    """(height, width) of a simple-format WebP (module doc) as PIL reports it, or None (ask PIL)."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    riff = struct.unpack("<I", data[4:8])[0]
    fourcc, length = data[12:16], struct.unpack("<I", data[16:20])[0]
    if riff + 8 != len(data) or 20 + length + (length & 1) != len(data):
        return None
    body = data[20:20 + min(length, 10)]  # the frame header only: slicing the whole chunk copied the file
    if fourcc == b"VP8 " and len(body) >= 10:
        tag = body[0] | (body[1] << 8) | (body[2] << 16)
        key, version, shown, first = not (tag & 1), (tag >> 1) & 7, (tag >> 4) & 1, tag >> 5
        if not key or version > 3 or not shown or first > length - 10 or body[3:6] != b"\x9d\x01\x2a":
            return None
        w, h = struct.unpack("<HH", body[6:10])
        if (w >> 14) or (h >> 14):  # upscaling bits: libwebp reports the size, PIL too; kept out
            return None
        return _within_limits(h & 0x3FFF, w & 0x3FFF)
    if fourcc == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        bits = struct.unpack("<I", body[1:5])[0]
        if bits >> 29:  # version must be 0
            return None
        return _within_limits(((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1)
    return None


def plain_image_hw(data: bytes) -> Optional[tuple[int, int]]:
    """(height, width) of a plain JPEG, PNG or WebP from its bytes, or None (ask PIL)."""
    if data[:3] == b"\xff\xd8\xff":
        return plain_jpeg_hw(data)
    if data[:8] == _PNG_SIGNATURE:
        return plain_png_hw(data)
    if data[:4] == b"RIFF":
        return plain_webp_hw(data)
    return None


_PNG_IEND = b"\0\0\0\0IEND\xaeB`\x82"  # the whole IEND chunk: length 0, type, CRC
TAIL_BYTES = len(_PNG_IEND)  # what `certainly_whole` reads of a file's end


def certainly_whole(head: bytes, tail: bytes, size: int) -> bool:
    """Whether a file of ``size`` bytes that starts with ``head`` (its first 12 bytes or more) and
    ends with ``tail`` (its last `TAIL_BYTES`) certainly reaches its format's end; False where only
    a decode can tell (the layout-only route then decodes it as the pixel route does,
    `mmpipe.images.load.image_hw`): a cut file is never laid out, and nothing the pixel route
    accepts is refused, since a False refuses nothing by itself. Measured against PIL on every cut
    offset of each format (`tests/images/test_hunt_layout_cuts_images.py`):

    - JPEG: ends with the EOI marker ``FF D9`` (entropy-coded data cannot hold that pair). A file
      with bytes after its EOI is decoded (PIL reads it whole).
    - PNG: ends with the whole ``IEND`` chunk (`decoded_unless_whole` also walks the chunk headers
      of one with bytes after it). PIL also decodes a PNG cut in its last checksums or without
      ``IEND``: decoded.
    - WebP: its RIFF size is within the file (PIL decodes a WebP at open: checked twice, cheaply).
    - anything else (GIF: PIL decodes only the first frame, so a GIF cut after it passes, and a
      trailer byte ``;`` can end a cut one): decoded.
    """
    if head[:3] == b"\xff\xd8\xff":
        return tail.endswith(b"\xff\xd9")
    if head[:8] == _PNG_SIGNATURE:
        return tail.endswith(_PNG_IEND)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return struct.unpack("<I", head[4:8])[0] + 8 <= size
    return False


def decoded_unless_whole(img, where: str):
    """``img`` (a PIL image just opened: its header read), decoded (``img.load()``) where its file
    may be cut: one whose end its format does not certainly reach (`certainly_whole`, from its
    first and last bytes); PIL's error is then this image's `ImageError`, as `encode_image` (the
    pixel route) reports it. So a layout-only encode (a length filter) refuses a cut file as the
    pixel route does, not training later; a whole file is not read past its header and its last
    `TAIL_BYTES`."""
    from PIL import Image, ImageFile

    from mmpipe.images.orientation import file_lock, read_pixels

    fp = getattr(img, "fp", None)
    if fp is None or not isinstance(img, ImageFile.ImageFile):
        return img  # decoded already (or not from a file)
    try:
        with file_lock(img):  # a user's PIL image may be read by another thread: its file position
            pos = fp.tell()
            fp.seek(0)
            head = fp.read(12)
            size = fp.seek(0, 2)
            fp.seek(max(0, size - TAIL_BYTES))
            tail = fp.read(TAIL_BYTES)
            whole = certainly_whole(head, tail, size) or (head[:8] == _PNG_SIGNATURE and _png_file_ends(fp, size))
            fp.seek(pos)
    except (OSError, ValueError):  # a closed or unseekable file: decoded
        whole = False
    if whole:
        return img
    try:
        return read_pixels(img)
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:  # PIL: truncated data, bad chunks
        raise unreadable_error(e, where, img.format and f"a {img.format} image") from e


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
    from PIL import Image

    return ImageError(
        f"the image is larger than PIL's decompression-bomb limit ({e})", where=where,
        expected=f"at most {2 * Image.MAX_IMAGE_PIXELS} pixels (2 x PIL.Image.MAX_IMAGE_PIXELS)",
        fix="downscale the file before encoding, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the "
            "source (decoding takes about 3 bytes per pixel)",
    )


def _png_file_ends(fp, size: int) -> bool:
    """Whether a PNG file's chunks run whole to ``IEND`` (bytes may follow it: PIL reads none of
    them), read from ``fp`` chunk header by chunk header (8 bytes each)."""
    pos = 8
    while pos + 12 <= size:
        fp.seek(pos)
        length, ctype = struct.unpack(">I4s", fp.read(8))
        pos += 12 + length
        if ctype == b"IEND":
            return pos <= size
    return False


def _png_ends(data: bytes) -> bool:
    """Whether a PNG's chunks run whole from its signature to ``IEND`` (`_png_file_ends` on the bytes)."""
    import io

    return _png_file_ends(io.BytesIO(data), len(data))


def file_ends(data: bytes) -> bool:
    """Whether encoded image bytes reach their format's end marker (JPEG EOI, PNG IEND); True for
    other formats (not checked here)."""
    if data[:2] == b"\xff\xd8":
        return jpeg_ends(data)
    if data[:8] == _PNG_SIGNATURE:
        return _png_ends(data)
    return True


def open_whole(data: bytes, where: str):
    """``PIL.Image.open`` of encoded image bytes. While ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is
    set (a line many training scripts carry) PIL decodes a cut JPEG / PNG without a word, its
    missing part gray or black: such a file is refused here (`file_ends`) as PIL refuses it with
    the flag unset, so a row never trains on half an image. mmpipe never sets the flag."""
    import io

    from PIL import Image, ImageFile

    if ImageFile.LOAD_TRUNCATED_IMAGES and not file_ends(data):
        raise ImageError("the image file is truncated (PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: PIL would "
                         "decode its missing part as gray)", where=where,
                         expected="a complete file (a JPEG up to its EOI marker, a PNG up to its IEND chunk)",
                         found=f"{len(data)} bytes that end before it",
                         fix="re-export or re-download the image, or drop the row (on_error='skip'); mmpipe "
                             "refuses cut files whatever LOAD_TRUNCATED_IMAGES says")
    return Image.open(io.BytesIO(data))
