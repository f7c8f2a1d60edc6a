"""The layout-only route (``pixels="none"``: `image_grid` per row, the batched path's header
readers) refuses exactly the cut image files the pixel route (`encode_image`) refuses, with the
same `ImageError`, and accepts every file the pixel route accepts. Swept over cut offsets of
small real photos (matplotlib's sample data) saved in each format and variant: baseline,
progressive, EXIF-rotated, CMYK and trailing-bytes JPEGs; RGB, palette, 16-bit and IEND-less PNGs
and one with bytes after IEND; lossy, lossless and animated WebPs; still and animated GIFs; as
bytes and as files. Before the
fix the layout route read the header alone: a JPEG / PNG / GIF cut anywhere after it was laid out
(all but the first few hundred bytes of a JPEG), so a length filter kept the row and training failed
on it later."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile

import mmpipe
from mmpipe.errors import ImageError, InputError
from mmpipe.images.headers import plain_image_hw
from mmpipe.images.pixels import encode_image, image_grid
from mmpipe.images.spec import VisionSpec
from mmpipe.testing import build_processor, sample_photos

SPEC = VisionSpec(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=56 * 56,
                  max_pixels=28 * 28 * 1280, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)


def _photo() -> Image.Image:
    name, img = next((n, im) for n, im in sample_photos() if n.endswith("grace_hopper.jpg"))
    return img.convert("RGB").resize((72, 90))


def _save(img, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _files() -> dict:
    photo = _photo()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: the layout swaps the sides
    frames = [photo, photo.rotate(90), photo.rotate(180)]
    gray16 = Image.fromarray(np.asarray(photo.convert("L")).astype(np.uint16))  # I;16, values 0..255

    def anim(fmt: str) -> bytes:
        buf = io.BytesIO()
        frames[0].save(buf, fmt, save_all=True, append_images=frames[1:])
        return buf.getvalue()

    return {
        "jpeg": _save(photo, "JPEG", quality=80),
        "jpeg_progressive": _save(photo, "JPEG", progressive=True),
        "jpeg_exif_rotated": _save(photo, "JPEG", exif=exif.tobytes()),
        "jpeg_cmyk": _save(photo.convert("CMYK"), "JPEG"),
        "jpeg_trailing": _save(photo, "JPEG") + b"\0trailer" * 4,
        "png": _save(photo, "PNG"),
        "png_palette": _save(photo.convert("P"), "PNG"),
        "png_16bit": _save(gray16, "PNG"),
        "png_no_iend": _save(photo, "PNG")[:-12],
        "png_after_iend": _save(photo, "PNG") + b"\0\0\0\4tEXt" + b"a\0b!" + b"\0" * 4 + b"junk",
        "webp_lossy": _save(photo, "WEBP", quality=80),
        "webp_lossless": _save(photo, "WEBP", lossless=True),
        "webp_animated": anim("WEBP"),
        "gif": _save(photo.convert("P"), "GIF"),
        "gif_animated": anim("GIF"),
    }


FILES = _files()


def _decision(fn, value):
    """The grid a route gives ``value``, or the error class it raises (any other error: a bug)."""
    try:
        return fn(value)
    except InputError as e:
        assert "row 3, image 0" in str(e), str(e)  # located
        return type(e).__name__


def _pixel(value):
    return encode_image(value, SPEC, where="row 3, image 0")[1]


def _layout(value):
    return image_grid(value, SPEC, where="row 3, image 0")


def _batched(value):
    """The batched layout path's rule (`layout_batch._grid`): the header readers, else `image_grid`."""
    hw = plain_image_hw(value) if isinstance(value, bytes) else None
    if hw is None:
        return _layout(value)
    th, tw = SPEC.target_size(*hw)
    return 1, th // SPEC.patch_size, tw // SPEC.patch_size


def _offsets(n: int) -> list:
    """Cut offsets: spread over the file, every one of its last 40 bytes, and the whole file."""
    return sorted(set(range(0, n, max(1, n // 60))) | set(range(max(0, n - 40), n + 1)))


@pytest.mark.parametrize("name", sorted(FILES))
def test_layout_route_refuses_the_cuts_the_pixel_route_refuses(name, tmp_path):
    data = FILES[name]
    refused = 0
    for k in _offsets(len(data)):
        cut = data[:k]
        want = _decision(_pixel, cut)
        refused += want == "ImageError"
        assert _decision(_layout, cut) == want, (name, k, len(data))
        assert _decision(_batched, cut) == want, (name, k, len(data))
        assert _decision(_layout, {"bytes": cut, "path": None}) == want, (name, k)
        if k % 7 == 0 or k >= len(data) - 20:  # as a file too (fewer: one write each)
            path = tmp_path / f"cut{k}"
            path.write_bytes(cut)
            assert _decision(_layout, str(path)) == want, (name, k, "path")
    assert _decision(_pixel, data) != "ImageError", name  # the whole file is accepted
    assert refused > 20, name  # the sweep met cut files


def test_whole_files_are_not_decoded_by_the_layout_route(monkeypatch, tmp_path):
    """The check reads a whole JPEG's / PNG's / WebP's first and last bytes only: no decode."""
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.format) or real(self))
    for name in ("jpeg", "jpeg_progressive", "jpeg_exif_rotated", "jpeg_cmyk", "png", "png_palette",
                 "png_16bit", "png_after_iend", "webp_lossy", "webp_lossless"):
        path = tmp_path / name
        path.write_bytes(FILES[name])
        for value in (FILES[name], {"bytes": FILES[name], "path": None}, str(path)):
            _layout(value)
    assert [f for f in loads if f != "WEBP"] == [], loads  # PIL's WebP plugin decodes at open itself


def _rows(images: list) -> dict:
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{i}"}]},
                          {"role": "assistant", "content": "a"}], "images": [im]} for i, im in enumerate(images)]
    return {k: [r[k] for r in rows] for k in rows[0]}


@pytest.mark.parametrize("batched", [True, False])
def test_layout_only_encode_refuses_a_cut_jpeg_like_the_pixel_encode(batched, monkeypatch):
    """A length filter (``pixels="none"``) meets the cut row as the training encode does."""
    from mmpipe.encoding import mapping

    if not batched:
        monkeypatch.setattr(mapping, "takes_layout_batch", lambda enc: False)
    proc = build_processor("qwen2_vl")
    whole = FILES["jpeg"]
    batch = _rows([{"bytes": whole, "path": None}, {"bytes": whole[: len(whole) * 2 // 3], "path": None}])
    errors = []
    for pixels in ("uint8", "none"):
        with pytest.raises(ImageError) as e:
            mmpipe.encode(batch, processor=proc, pixels=pixels)
        errors.append(e.value)
    assert "truncated" in str(errors[1]) and str(errors[1]) == str(errors[0])  # same row, image, words
    out = mmpipe.encode(_rows([{"bytes": whole, "path": None}] * 2), processor=proc, pixels="none")
    assert len(out["input_ids"]) == 2
