"""`plain_jpeg_hw`: a plain JPEG's size from its bytes equals what PIL (through
`mmpipe.images.load.image_hw`, the per-row layout path) reads; everything else - EXIF, ICC,
other formats, damaged headers - is left to PIL (None). Where it answers for mutated bytes,
PIL opens them with the same size."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from mmpipe import testing
from mmpipe.images.jpeg_header import plain_jpeg_hw
from mmpipe.images.load import image_hw


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", **kw)
    return buf.getvalue()


def _photo(w=96, h=64, seed=0) -> Image.Image:
    return testing.tiny_image(w, h, seed=seed).convert("RGB")


def plain_variants() -> list[bytes]:
    im = _photo()
    return [_jpeg(im), _jpeg(im, quality=95, subsampling=0), _jpeg(im, progressive=True),
            _jpeg(im, optimize=True), _jpeg(im.convert("L")), _jpeg(_photo(1, 1)), _jpeg(_photo(20, 3000, 1)), _jpeg(_photo(333, 17, 2)), _jpeg(im, comment=b"a comment"), _jpeg(im, dpi=(300, 300))]


@pytest.mark.parametrize("k", range(10))
def test_plain_jpegs_read_as_pil_reads_them(k):
    data = plain_variants()[k]
    assert plain_jpeg_hw(data) == image_hw({"bytes": data, "path": None}) == Image.open(io.BytesIO(data)).size[::-1]


def test_the_sample_photo_file():
    import matplotlib

    with open(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"), "rb") as f:
        data = f.read()
    hw = plain_jpeg_hw(data)
    assert hw is None or hw == image_hw(data)


def test_left_to_pil():
    im = _photo()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: width and height swap
    rotated = _jpeg(im, exif=exif.tobytes())
    assert plain_jpeg_hw(rotated) is None  # EXIF: PIL reads the orientation
    assert plain_jpeg_hw(_jpeg(im, icc_profile=b"\0" * 200)) is None  # APP2
    assert plain_jpeg_hw(_jpeg(im.convert("CMYK"))) is None  # APP14 (Adobe)
    png = io.BytesIO()
    im.save(png, format="PNG")
    assert plain_jpeg_hw(png.getvalue()) is None
    data = _jpeg(im)
    assert plain_jpeg_hw(data[:200]) is None  # cut inside the header
    assert plain_jpeg_hw(b"") is None and plain_jpeg_hw(b"\xff\xd8\xff") is None


def test_mutated_bytes_agree_with_pil():
    """Flipped, cut and inserted bytes in the header: wherever the fast read answers, PIL opens
    the bytes with that size and no rotation (its answer would be the per-row path's)."""
    rng = np.random.default_rng(0)
    answered = 0
    for base in plain_variants()[:6]:
        sos = base.index(b"\xff\xda")
        for _ in range(60):
            b = bytearray(base)
            kind = rng.integers(3)
            at = int(rng.integers(2, sos + 12))
            if kind == 0:
                b[at] = int(rng.integers(256))
            elif kind == 1:
                del b[at:at + int(rng.integers(1, 6))]
            else:
                b[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 4)), dtype=np.uint8))
            data = bytes(b)
            hw = plain_jpeg_hw(data)
            if hw is None:
                continue
            answered += 1
            assert image_hw({"bytes": data, "path": None}) == hw
    assert answered > 50  # most mutations of the entropy-free header bytes still answer
