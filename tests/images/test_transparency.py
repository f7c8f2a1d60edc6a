"""Transparent images (RGBA, LA, a palette PNG with a transparent index) become RGB as the
INSTALLED transformers' processors do it (mmpipe/images/transparency.py): composited onto white on
transformers >= 5.21, ``convert("RGB")`` (alpha dropped) on 4.57 ... 5.20, the rule found by
running transformers' own ``convert_to_rgb`` on a probe pixel. Checked bit for bit against the
stock processor's ``pixel_values`` for every natively encoded family that builds offline, in
every environment that has a transformers line: main (5.24), tf457 (4.57), verl (5.10) and vllm
(5.19). Rows encoded for an engine (``image_backend="vllm"``) follow the engine's rule instead:
vLLM composites every image onto white before its processor, whatever its transformers does."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError, ImageError
from mmpipe.families import get_family
from mmpipe.images import transparency
from mmpipe.images.backends import engine_transparency, resolve_backend
from mmpipe.images.load import to_rgb_array, to_rgb_image
from mmpipe.images.transparency import (ENGINE_TRANSPARENCY, TRANSPARENCY_ENV, has_transparency, installed_transparency,
                                        rule_of)
from mmpipe.images.spec import VisionSpec

from conftest import current_test_env

EVERYWHERE = pytest.mark.needs_env("main", "tf457", "verl", "vllm")  # every transformers line we test on
# every family mmpipe encodes natively: Qwen patch grids, GLM's, and the tiled families
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "glm46v", "gemma3", "internvl", "llava_onevision")
MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in it?"}]}]


def _png(img: Image.Image) -> bytes:
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def _transparent_pngs() -> dict[str, bytes]:
    """name -> PNG bytes: matplotlib's two RGBA sample PNGs, a palette PNG with a transparent
    index (a tRNS chunk) and an LA PNG."""
    import matplotlib

    root = Path(matplotlib.get_data_path()) / "sample_data"
    out = {p.stem: p.read_bytes() for p in (root / "logo2.png", root / "Minduka_Present_Blue_Pack.png")}
    pal = testing.tiny_image(50, 62, seed=2).convert("P", palette=Image.ADAPTIVE, colors=16)
    idx = int(np.bincount(np.asarray(pal).ravel()).argmax())  # the most used index: many transparent pixels
    buf = io.BytesIO()
    pal.save(buf, "PNG", transparency=idx)
    out["palette_trns"] = buf.getvalue()
    rgba = np.asarray(testing.tiny_image(48, 80, seed=3, mode="RGBA"))
    grey = np.asarray(Image.fromarray(rgba[..., :3]).convert("L"))
    out["la"] = _png(Image.fromarray(np.dstack([grey, rgba[..., 3]]), "LA"))
    return out


PNGS = _transparent_pngs()


def _open(name: str) -> Image.Image:
    return Image.open(io.BytesIO(PNGS[name]))


_PROCESSORS: dict = {}


def _processor(family: str):
    """The family's offline processor; skipped (with the reason) where this environment's
    transformers cannot build it, except in the main environment, where every family must."""
    if family not in _PROCESSORS:
        try:
            _PROCESSORS[family] = testing.build_processor(family)
        except Exception as e:  # noqa: BLE001 - the builder's own error names what is missing
            if current_test_env() == "main":
                raise
            _PROCESSORS[family] = e
    got = _PROCESSORS[family]
    if isinstance(got, Exception):
        import transformers

        pytest.skip(f"{family}'s offline processor does not build on transformers {transformers.__version__}: "
                    f"{type(got).__name__}: {str(got)[:160]}")
    return got


def _stock(proc, img: Image.Image) -> np.ndarray:
    text = proc.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return np.asarray(proc(text=[text], images=[img], return_tensors="np")["pixel_values"])


def _collated(proc, value, **kw) -> np.ndarray:
    row = mmpipe.encode_row({"messages": MESSAGES, "images": [value]}, proc, labels=False, **kw)
    return np.asarray(mmpipe.collate([row], processor=proc).pixel_values)


@EVERYWHERE
def test_the_images_carry_transparency_that_matters():
    """Each test image has transparency, and the two rules give different RGB for it."""
    assert {_open(n).mode for n in PNGS} == {"RGBA", "P", "LA"}
    for name in PNGS:
        img = _open(name)
        assert has_transparency(img), name
        white, drop = to_rgb_array(img, "white"), to_rgb_array(img, "drop")
        assert white.shape == drop.shape and not np.array_equal(white, drop), name


@EVERYWHERE
def test_the_rule_is_what_the_installed_convert_to_rgb_does():
    """Feature detection: transformers' own convert_to_rgb run on a probe pixel. The releases
    checked: 4.57, 5.10 and 5.19 drop the alpha, 5.21+ (5.24 here) composite onto white."""
    import transformers
    from packaging.version import Version
    from transformers.image_transforms import convert_to_rgb

    want = "white" if Version(transformers.__version__).release >= (5, 21) else "drop"
    assert installed_transparency() == want, transformers.__version__
    for name in PNGS:  # and the function itself gives those bytes on the test images
        got = np.asarray(convert_to_rgb(_open(name), **({"return_numpy": True} if want == "white" else {})))
        assert np.array_equal(got, to_rgb_array(_open(name))), name
    assert rule_of(lambda im: im.convert("RGB")) == "drop"
    assert rule_of(lambda im: np.zeros((1, 2, 3), np.uint8)) is None  # neither rule (a black background)


@EVERYWHERE
@pytest.mark.parametrize("name", sorted(PNGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_collated_pixel_values_equal_the_stock_processor(family, name):
    """The stock processor's pixel_values for a transparent PNG == mmpipe's collated
    pixel_values, bit for bit, on this environment's transformers."""
    proc = _processor(family)
    ref = _stock(proc, _open(name))
    got = _collated(proc, {"bytes": PNGS[name], "path": None})
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert np.array_equal(got, ref), (family, name, float(np.abs(got - ref).max()))


@EVERYWHERE
def test_explicit_rules_env_override_and_unknown_rule(monkeypatch):
    img = _open("logo2")
    white, drop = to_rgb_array(img, "white"), to_rgb_array(img, "drop")
    assert np.array_equal(white[np.asarray(img)[..., 3] == 0], np.full(((np.asarray(img)[..., 3] == 0).sum(), 3), 255))
    assert np.array_equal(drop, np.asarray(img)[..., :3])
    monkeypatch.setenv(TRANSPARENCY_ENV, "drop")
    assert np.array_equal(to_rgb_array(img), drop) and np.array_equal(to_rgb_array(img, "white"), white)
    monkeypatch.setenv(TRANSPARENCY_ENV, "white")
    assert np.array_equal(to_rgb_array(img), white)
    monkeypatch.setenv(TRANSPARENCY_ENV, "black")
    with pytest.raises(ArgumentError, match=TRANSPARENCY_ENV):
        to_rgb_image(img)
    monkeypatch.delenv(TRANSPARENCY_ENV)
    with pytest.raises(ArgumentError, match="transparency must be"):
        to_rgb_image(img, "black")
    with pytest.raises(ArgumentError, match="transparency must be"):  # checked for opaque images too
        to_rgb_image(Image.new("RGB", (2, 2)), "black")
    monkeypatch.setattr(transparency, "_INSTALLED", [None])  # a transformers whose rule mmpipe does not know
    with pytest.raises(ImageError, match="does not reproduce") as info:
        to_rgb_image(img)
    assert TRANSPARENCY_ENV in info.value.fix
    opaque = testing.tiny_image(8, 9)
    assert to_rgb_image(opaque) is opaque  # an opaque image never asks for the rule


@EVERYWHERE
def test_the_vllm_option_fixes_the_engine_rule():
    proc = _processor("qwen2_vl")
    assert resolve_backend("vllm", proc) == "torchvision" and engine_transparency("vllm") == "white"
    assert engine_transparency("auto") is None and engine_transparency("torchvision") is None
    spec = VisionSpec.from_processor(proc, backend="vllm")
    assert spec.backend == "torchvision" and spec.transparency == ENGINE_TRANSPARENCY["vllm"] == "white"
    assert VisionSpec.from_processor(proc).transparency is None  # the installed rule
    assert VisionSpec.from_processor(proc, backend="vllm", transparency="drop").transparency == "drop"
    assert VisionSpec.from_family(get_family("qwen2_vl"), "vllm").transparency == "white"
    with pytest.raises(ArgumentError, match="transparency must be"):
        VisionSpec.from_processor(proc, transparency="black")


@EVERYWHERE
@pytest.mark.parametrize("family", ("qwen2_vl", "glm4v"))
def test_rows_encoded_for_vllm_follow_vllms_rule(family):
    """``image_backend="vllm"``: the row's pixels are what vLLM's processor (torchvision
    backend) gets from vLLM's conversion (onto white), whatever the installed transformers does."""
    proc = _processor(family)
    for name in PNGS:
        got = _collated(proc, {"bytes": PNGS[name], "path": None}, image_backend="vllm")
        want = _collated(proc, to_rgb_image(_open(name), "white"), image_backend="torchvision")
        assert np.array_equal(got, want), (family, name)


def _vllm_or_skip():
    import os

    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"no vLLM environment on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")


@pytest.mark.needs_env("vllm")
def test_vllm_converts_as_the_engine_rule_says():
    """vLLM's own conversion (``convert_image_mode``, applied to every PIL image its parser
    takes and to every image it loads) == mmpipe's rule for the engine, on every test image,
    while this environment's transformers (5.19) drops the alpha."""
    _vllm_or_skip()
    from vllm.multimodal.image import convert_image_mode

    for name in PNGS:
        img = _open(name)
        assert np.array_equal(np.asarray(convert_image_mode(img, "RGB")),
                              to_rgb_array(img, ENGINE_TRANSPARENCY["vllm"])), name


@pytest.mark.needs_env("vllm")
def test_vllm_rows_equal_what_vllms_processor_gets():
    """Rows encoded with ``image_backend="vllm"`` == the real torchvision-backend processor on
    the image vLLM hands it (``convert_image_mode``), bit for bit."""
    _vllm_or_skip()
    import transformers
    from vllm.multimodal.image import convert_image_mode

    from mmpipe.images.pixels import encode_image, u8_to_pixel_values

    pil_ip = testing.build_image_processor("qwen2_vl")
    tv_ip = transformers.Qwen2VLImageProcessor(  # vLLM's processor: the torchvision backend
        size=dict(pil_ip.size), patch_size=pil_ip.patch_size, temporal_patch_size=pil_ip.temporal_patch_size,
        merge_size=pil_ip.merge_size, image_mean=list(pil_ip.image_mean), image_std=list(pil_ip.image_std))
    assert tv_ip.backend == "torchvision"
    spec = VisionSpec.from_processor(_processor("qwen2_vl"), backend="vllm")
    for name in PNGS:
        ref = tv_ip(images=[convert_image_mode(_open(name), "RGB")], return_tensors="np")
        u8, grid = encode_image({"bytes": PNGS[name], "path": None}, spec)
        got = u8_to_pixel_values(u8, spec.lut(), spec.temporal_patch_size)
        assert list(grid) == ref["image_grid_thw"][0].tolist(), name
        assert np.array_equal(got, ref["pixel_values"]), (name, float(np.abs(got - ref["pixel_values"]).max()))


@EVERYWHERE
def test_spec_takes_the_rows_recorded_rule():
    from mmpipe.errors import PixelDataError

    spec = VisionSpec.from_processor(_processor("qwen2_vl"))
    assert spec.for_transparency([None, None]) is spec
    assert spec.for_transparency([None, "drop", "drop"]).transparency == "drop"
    assert spec.for_transparency(["white"]).backend == spec.backend
    with pytest.raises(PixelDataError, match="different transparency rules") as info:
        spec.for_transparency(["white", None, "drop"])
    assert info.value.row == 2 and info.value.column == "image_transparency"
