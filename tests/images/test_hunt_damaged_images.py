"""Damaged and unusual image files (damaged-media hunt).

Finding: many training scripts set ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True``; PIL then decodes a
JPEG or PNG cut mid-scan with its missing part gray, and mmpipe encoded such rows without a word on
every route. They are refused now whatever the flag says (`mmpipe.images.headers.open_whole`: the
file must reach its JPEG EOI / PNG IEND), and mmpipe never sets the flag itself.

Guards: a PNG with a bad IDAT CRC (PIL does not check it; the pixels are whole), 1x1 and 1x100000
images, CMYK / 16-bit / palette-with-transparency / animated GIF / multi-frame TIFF files, and a
directory given as an image path: the same as the processor's decode or a typed error naming the row."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError
from mmpipe.images.headers import file_ends

from conftest import processor_for

ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
       {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _photo(h: int = 64, w: int = 96, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _jpeg_variants() -> dict:
    photo = _photo()
    exif = Image.Exif()
    exif[0x0112] = 1
    out = {"baseline": _save(photo, "JPEG"), "progressive": _save(photo, "JPEG", progressive=True),
           "optimized 4:4:4": _save(photo, "JPEG", optimize=True, subsampling=0),
           "restart markers": _save(photo, "JPEG", restart_marker_blocks=1),
           "grayscale": _save(photo.convert("L"), "JPEG"), "CMYK": _save(photo.convert("CMYK"), "JPEG"),
           "EXIF": _save(photo, "JPEG", exif=exif.tobytes())}
    # an EXIF thumbnail is a whole JPEG (its own EOI) inside APP1; trailing bytes after EOI are allowed
    thumb = _save(_photo(8, 8, 1), "JPEG")
    app1 = b"Exif\0\0" + thumb
    base = out["baseline"]
    out["thumbnail in APP1"] = base[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + base[2:]
    out["trailer after EOI"] = base + b"\0" * 32
    out.update({name: _save(im, "JPEG") for name, im in testing.sample_photos()})
    return out


@pytest.fixture
def truncated_allowed(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)


# ---------------------------------------------------------------- finding
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("pixels", ["uint8", "source"])
def test_a_cut_file_is_refused_while_the_user_allows_truncated_images(truncated_allowed, fmt, pixels):
    """With LOAD_TRUNCATED_IMAGES set, a JPEG / PNG cut in half encoded (its bottom gray) on every
    pixel route. Before: encode_row returned the row."""
    data = _save(_photo(), fmt)
    cut = data[: len(data) // 2]
    with pytest.raises(ImageError, match="truncated") as e:
        mmpipe.encode_row({"messages": ASK, "images": [cut]}, processor_for("qwen2_vl"), 5, pixels=pixels)
    assert e.value.row == 5 and e.value.column == "images"
    assert "EOI" in e.value.expected and f"{len(cut)} bytes" in e.value.found and "LOAD_TRUNCATED_IMAGES" in e.value.fix
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the user's setting left alone


def test_a_cut_path_and_a_cut_frame_are_refused_too(truncated_allowed, tmp_path):
    from mmpipe.images.load import decoded_rgb

    data = _save(_photo(), "JPEG", progressive=True)
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ImageError, match="truncated"):
        decoded_rgb(str(path), where="row 0, image 0")
    with pytest.raises(ImageError, match="truncated"):
        decoded_rgb({"bytes": data[:-2], "path": None}, where="row 0, image 0")


# ---------------------------------------------------------------- the end-marker walk
@pytest.mark.parametrize("name,data", list(_jpeg_variants().items()))
def test_whole_jpegs_reach_their_end_and_every_cut_does_not(name, data):
    assert file_ends(data)
    eoi = data.rindex(b"\xff\xd9") + 2
    for cut in sorted({*range(2, eoi, max(1, eoi // 97)), eoi - 1}):
        assert not file_ends(data[:cut]), cut


def test_whole_jpegs_still_encode_with_the_flag_set(truncated_allowed):
    proc = processor_for("qwen2_vl")
    for name, data in _jpeg_variants().items():
        mmpipe.encode_row({"messages": ASK, "images": [data]}, proc)  # none refused


def test_pngs_reach_their_end_and_cuts_do_not():
    for img in (_photo(), _photo().convert("P"), Image.new("I;16", (9, 7))):
        data = _save(img, "PNG")
        assert file_ends(data)
        assert not any(file_ends(data[:cut]) for cut in range(8, len(data), 7))


# ---------------------------------------------------------------- guards
def _pixels(data, proc) -> np.ndarray:
    return mmpipe.encode_row({"messages": ASK, "images": [data]}, proc).pixel_values_u8


def test_a_bad_idat_crc_with_whole_data_encodes_as_the_good_file():
    """PIL checks no IDAT CRC (neither does transformers' decode): the pixels are the file's."""
    png = _save(_photo(), "PNG")
    i = png.find(b"IDAT")
    crc = i + 4 + int.from_bytes(png[i - 4:i], "big")
    bad = png[:crc] + bytes([png[crc] ^ 0xFF]) + png[crc + 1:]
    assert zlib.crc32(bad[i:crc]) != int.from_bytes(bad[crc:crc + 4], "big")
    proc = processor_for("qwen2_vl")
    assert np.array_equal(_pixels(bad, proc), _pixels(png, proc))


@pytest.mark.parametrize("name", ["1x1", "CMYK jpeg", "16-bit png in 8-bit range", "palette with tRNS",
                                  "animated gif", "multi-frame tiff", "la png"])
def test_unusual_files_encode_as_their_first_frame_converted(name):
    """The image the processor's chat path sees (``Image.open(...).convert('RGB')``, the first frame of
    an animation) gives the same pixels as the file."""
    frames = [_photo(32, 32, s) for s in range(3)]
    pal = _photo().convert("P")
    files = {"1x1": _save(Image.new("RGB", (1, 1), (9, 200, 30)), "PNG"),
             "CMYK jpeg": _save(_photo().convert("CMYK"), "JPEG"),
             "16-bit png in 8-bit range": _save(Image.fromarray(np.arange(64 * 96, dtype=np.uint16).reshape(64, 96) % 256), "PNG"),
             "palette with tRNS": _save(pal, "PNG", transparency=0),
             "animated gif": _save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
             "multi-frame tiff": _save(frames[0], "TIFF", save_all=True, append_images=frames[1:]),
             "la png": _save(_photo().convert("LA"), "PNG")}
    proc = processor_for("qwen2_vl")
    got = _pixels(files[name], proc)
    from mmpipe.images.load import decoded_rgb

    first = decoded_rgb(files[name])  # the first frame, RGB by the installed processor's rule
    assert np.array_equal(got, _pixels(np.asarray(first), proc))


@pytest.mark.parametrize("pixels", ["uint8", "none", "source"])
def test_thin_images_and_directories_are_the_rows_errors(tmp_path, pixels):
    proc = processor_for("qwen2_vl")
    for value, words in ((_save(Image.new("RGB", (1, 100000)), "PNG"), "aspect ratio"), (str(tmp_path), "directory")):
        with pytest.raises(ImageError, match=words) as e:
            mmpipe.encode_row({"messages": ASK, "images": [value]}, proc, 2, pixels=pixels)
        assert e.value.row == 2 and e.value.fix
