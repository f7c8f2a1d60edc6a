"""The size of a plain JPEG from its header bytes, without PIL (the layout-only batch path).

``PIL.Image.open`` reads a JPEG header in Python (every quantization table unpacked, each marker
through a handler): ~15 us per photo, most of a layout-only encode's header time.
`plain_jpeg_hw` walks the markers of the bytes itself, and answers only for the JPEGs where
PIL certainly opens the file with that size and reports no EXIF orientation; for anything else
it returns None and the caller asks PIL (`mmpipe.images.load.image_hw`), which reads it or
raises the error the row reports. "Plain" means: SOI, then only APP0, DQT, DHT, DRI, COM and one
8-bit SOF0/1/2 segment (1, 3 or 4 components), each complete and laid out as PIL's handlers read
it (quantization tables whole, JFIF fields present, no fill bytes between markers), up to a
complete SOS header; no APP1 (EXIF / XMP: orientation), no APP2 (ICC, MPO), no other segment;
a non-empty size within ``PIL.Image.MAX_IMAGE_PIXELS``; the file ends with its EOI marker (a cut
file, or one with bytes after its EOI, is PIL's: `mmpipe.images.load.image_hw` decodes it). `tests/images/test_jpeg_header.py`
checks it against PIL on encoder variants and on mutated bytes.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["jpeg_ends", "plain_jpeg_hw"]

_SKIP = {0xC4, 0xDD, 0xFE}  # DHT, DRI, COM: PIL reads and stores them, nothing can fail
_SOF = {0xC0, 0xC1, 0xC2}  # baseline, extended sequential, progressive


def _dqt_ok(s: bytes) -> bool:
    """PIL's DQT handler reads whole tables (1 + 64 or 1 + 128 bytes each) or raises."""
    while s:
        n = 1 + (64 if s[0] // 16 == 0 else 128)
        if len(s) < n:
            return False
        s = s[n:]
    return True


def plain_jpeg_hw(data: bytes) -> Optional[tuple[int, int]]:
    """(height, width) of a plain JPEG (module doc) as PIL reports it, or None (ask PIL)."""
    if not data.startswith(b"\xff\xd8\xff") or not data.endswith(b"\xff\xd9"):
        return None  # a file cut before its EOI (or with bytes after it): PIL decodes it (`image_hw`)
    size, pos, end = None, 2, len(data)
    while True:
        if pos + 4 > end or data[pos] != 0xFF:
            return None
        marker, length = data[pos + 1], int.from_bytes(data[pos + 2:pos + 4], "big")
        if length < 2 or pos + 2 + length > end:
            return None  # PIL reads past the end (an error) or re-reads a short segment
        s = data[pos + 4:pos + 2 + length]
        if marker == 0xDA:  # start of scan: PIL stops here
            break
        if marker in _SOF:
            if size is not None or len(s) < 6 or (len(s) - 6) % 3 or s[0] != 8 or s[5] not in (1, 3, 4):
                return None
            size = (int.from_bytes(s[1:3], "big"), int.from_bytes(s[3:5], "big"))
        elif marker == 0xE0:
            if s.startswith(b"JFIF") and len(s) < 12:
                return None
        elif marker == 0xDB:
            if not _dqt_ok(s):
                return None
        elif marker not in _SKIP:
            return None
        pos += 2 + length
    if size is None or not (size[0] > 0 and size[1] > 0):
        return None
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is not None and size[0] * size[1] > limit else size


def jpeg_ends(data: bytes) -> bool:
    """Whether a JPEG's markers run from SOI to EOI within ``data``: segments by their lengths (an
    EXIF thumbnail's own EOI is inside its APP1), scan data up to the next marker (``FF 00``
    stuffing, ``RSTn`` and fill bytes skipped). False for a file cut before its end."""
    pos, end = 2, len(data)
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= end:
            return False
        m = data[pos + 1]
        if m == 0xD9:
            return True
        if m in (0x00, 0x01, 0xFF) or 0xD0 <= m <= 0xD7:  # scan data, TEM, fill: no length follows
            pos += 1 if m == 0xFF else 2
            continue
        if pos + 4 > end:
            return False
        pos += 2 + max(2, int.from_bytes(data[pos + 2:pos + 4], "big"))
