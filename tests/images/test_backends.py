"""The two transformers image-processor backends (mmpipe/images/backends.py): detection, the
torchvision backend's resize and float table without torchvision, encode/collate under either
backend, and (in the vLLM environment, where torchvision's transforms exist) the oracle:
mmpipe's pixel_values == the real processor's, bit for bit, for both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import ArgumentError
from mmpipe.images.backends import processor_backend, resize_u8_torch, resolve_backend
from mmpipe.images.pixels import encode_image, pixel_values_to_u8, u8_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.testing.invariants import assert_roundtrip

from conftest import FAMILIES, processor_for


def _odd_images():
    """Random noise (the worst case for resampling) at odd sizes, an RGBA and a grayscale image."""
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
             for h, w in [(37, 101), (120, 160), (5, 300), (333, 29), (600, 512), (57, 57)]]
    return noise + [testing.tiny_image(90, 70, seed=3, mode="RGBA"), testing.tiny_image(64, 130, seed=4, mode="L")]


def test_processor_backend_and_option():
    proc = processor_for("qwen2_vl")  # the offline processor is always the PIL backend
    assert processor_backend(proc) == processor_backend(proc.image_processor) == "pil"
    assert resolve_backend("auto", proc) == "pil" and resolve_backend("auto") == "pil"
    assert resolve_backend("torchvision", proc) == "torchvision"
    with pytest.raises(ArgumentError, match="image_backend must be one of"):
        resolve_backend("cv2", proc)
    with pytest.raises(ArgumentError, match="image_backend must be one of"):
        Encoder(proc, image_backend="fast")
    assert VisionSpec.from_processor(proc).backend == "pil"
    assert VisionSpec.from_processor(proc, backend="torchvision").backend == "torchvision"


@pytest.mark.parametrize("family", FAMILIES)
def test_torchvision_table(family):
    """The fused table: within 1 ulp-ish of PIL's, strictly increasing per channel (so stored
    float pixels invert exactly), and equal to doing the fused ops on a real image tensor."""
    spec = VisionSpec.from_processor(processor_for(family), backend="torchvision")
    pil, tv = VisionSpec.from_processor(processor_for(family)).lut(), spec.lut()
    assert tv.dtype == np.float32 and tv.shape == (3, 256)
    assert np.abs(tv - pil).max() <= 5e-7 and not np.array_equal(tv, pil)
    assert (np.diff(tv, axis=1) > 0).all()
    img = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).expand(3, 16, 16)
    mean = torch.tensor(spec.image_mean) * (1.0 / spec.rescale_factor)
    std = torch.tensor(spec.image_std) * (1.0 / spec.rescale_factor)
    fused = (img.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    assert np.array_equal(fused.reshape(3, 256).numpy(), tv)
    u8 = np.random.default_rng(1).integers(0, 256, (8, 3 * spec.patch_size ** 2), dtype=np.uint8)
    pv = u8_to_pixel_values(u8, tv, spec.temporal_patch_size)
    assert np.array_equal(pixel_values_to_u8(pv, tv, spec.temporal_patch_size), u8)
    assert not np.array_equal(pv, u8_to_pixel_values(u8, pil, spec.temporal_patch_size))


def test_torch_resize():
    img = np.asarray(_odd_images()[0])
    assert resize_u8_torch(img, *img.shape[:2]) is img  # same size: unchanged, as torchvision returns it
    out = resize_u8_torch(img, 28, 84)
    assert out.dtype == np.uint8 and out.shape == (28, 84, 3)
    flat = np.full((50, 70, 3), 77, np.uint8)
    assert (resize_u8_torch(flat, 28, 56) == 77).all()  # weights sum to one
    pil = np.asarray(Image.fromarray(img).resize((84, 28), resample=Image.BICUBIC))
    assert np.abs(out.astype(int) - pil).max() > 0  # a different filter (a = -0.75 vs PIL's -0.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_encoded_under_torchvision_collate_and_unbatch(family, photos):
    proc = processor_for(family)
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}] * k}],
             "images": ([photos[0]] + _odd_images())[:k]} for k in (1, 0, 2)]
    enc = Encoder(proc, labels=False, image_backend="torchvision")
    rows = [enc.encode_row(r, i) for i, r in enumerate(raws)]
    pil_rows = [mmpipe.encode_row(r, proc, labels=False) for r in raws]
    assert [r.image_grid_thw.tolist() for r in rows] == [r.image_grid_thw.tolist() for r in pil_rows]
    assert not np.array_equal(rows[2].pixel_values_u8, pil_rows[2].pixel_values_u8)  # another resize
    # the rows carry their backend: a PIL processor's collate still expands them with its table
    assert [r.image_backend for r in rows] == ["torchvision"] * 3
    batch = assert_roundtrip(rows, processor=proc)
    assert batch.spec.backend == "torchvision"
    want = np.concatenate([u8_to_pixel_values(r.pixel_values_u8, enc.spec.lut(), enc.spec.temporal_patch_size)
                           for r in rows if r.num_images])
    assert np.array_equal(batch.pixel_values.numpy(), want)
    assert np.array_equal(mmpipe.Collator(proc)([r.to_dict() for r in rows]).pixel_values.numpy(), want)
    assert pil_rows[0].image_backend == "pil" and "image_backend" not in pil_rows[0].to_dict()  # PIL rows unchanged
    with pytest.raises(mmpipe.errors.PixelDataError, match="different image backends"):
        mmpipe.collate([rows[0], pil_rows[2]], processor=proc)
    with pytest.raises(mmpipe.errors.InputError, match="unknown image backend 'cv2'"):
        mmpipe.MultiModalInputs.from_dict(dict(rows[0].to_dict(), image_backend="cv2"), row=0)
    floats = Encoder(proc, labels=False, pixels="float32", image_backend="torchvision")
    as_floats = floats.encode_row(raws[2], 2)
    assert as_floats.image_backend == "torchvision"
    assert np.array_equal(as_floats.pixel_values, want[len(rows[0].pixel_values_u8):])


def test_backend_survives_a_dataset(photos):
    """encode() on a datasets.Dataset -> Arrow -> collate: torchvision rows keep their backend
    (the stored image_backend column) and collate to its floats; skipped rows keep the columns."""
    import datasets

    proc = processor_for("qwen2_5_vl")
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
             "images": [im]} for im in _odd_images()[:3]]
    raws.append({"messages": [{"role": "user", "content": [{"type": "text", "text": "no image"}]}], "images": []})
    broken = dict(raws[0], images=raws[0]["images"] * 2)  # two images, one placeholder: skipped
    ds = datasets.Dataset.from_list(raws + [broken])
    enc = Encoder(proc, labels=False, image_backend="torchvision", on_error="skip")
    out = ds.map(enc, batched=True, remove_columns=ds.column_names)
    assert out["image_backend"] == ["torchvision"] * 5 and out["mmpipe_error"][-1]
    out, errors = mmpipe.drop_failed(out)
    assert len(errors) == 1 and len(out) == 4
    assert not mmpipe.validate_dataset(out).issues  # a known optional column
    bad = mmpipe.validate_dataset(out.map(lambda r: {"image_backend": "cv2"}))
    assert "unknown image backend 'cv2'" in str(bad) and not bad.ok
    rows = [enc.encode_row(r, i) for i, r in enumerate(raws)]
    batch = mmpipe.Collator(proc)(out.with_format("arrow")[:])
    assert np.array_equal(batch.pixel_values.numpy(), mmpipe.collate(rows, processor=proc).pixel_values.numpy())
    assert_roundtrip(rows, batch)


@pytest.mark.needs_env("vllm")
@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_real_processors_bit_for_bit(family):
    """mmpipe's pixel_values and grids == the real transformers processor's, bit for bit, for
    the torchvision backend (the real Qwen2VLImageProcessor over torchvision's transforms) and
    the PIL backend, on real photographs and odd-sized noise, RGBA and grayscale images.

    The RGBA image goes to the processors composited onto white: transformers 5.19 (vLLM's
    pin) converts RGBA with a plain ``Image.convert("RGB")`` in both backends, dropping the
    alpha, where 5.24 (the main environment) composites it onto white, as mmpipe does. vLLM
    prompts from `VLLMEngine` carry mmpipe's RGB images, so this never reaches the engine."""
    import os

    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"no vLLM environment on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    import transformers

    from mmpipe.images.load import to_rgb_image

    pil_ip = testing.build_image_processor(family)
    tv_ip = transformers.Qwen2VLImageProcessor(
        size=dict(pil_ip.size), patch_size=pil_ip.patch_size, temporal_patch_size=pil_ip.temporal_patch_size,
        merge_size=pil_ip.merge_size, image_mean=list(pil_ip.image_mean), image_std=list(pil_ip.image_std))
    assert processor_backend(tv_ip) == "torchvision" and processor_backend(pil_ip) == "pil"
    images = [im for _, im in testing.sample_photos()] + _odd_images()
    for ip in (tv_ip, pil_ip):
        # the offline processor has the same bounds and constants; only the backend differs
        spec = VisionSpec.from_processor(processor_for(family), backend=processor_backend(ip))
        for k, im in enumerate(images):
            ref = ip(images=[to_rgb_image(im) if im.mode == "RGBA" else im], return_tensors="np")
            u8, grid = encode_image(im, spec)
            got = u8_to_pixel_values(u8, spec.lut(), spec.temporal_patch_size)
            assert list(grid) == ref["image_grid_thw"][0].tolist(), (ip.backend, k)
            assert got.dtype == ref["pixel_values"].dtype and np.array_equal(got, ref["pixel_values"]), \
                (ip.backend, k, im.size, float(np.abs(got - ref["pixel_values"]).max()))


def test_readme_vllm_block_runs_as_written():
    from helpers import readme_block

    namespace: dict = {}
    exec(compile(readme_block("## vLLM"), "README.md", "exec"), namespace)
    assert namespace["batch"].pixel_values.dtype == torch.float32
