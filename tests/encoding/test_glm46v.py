"""GLM-4.6V (transformers 5 ``glm46v``) as a native family (`mmpipe.families.GLM46V`): encode ==
the real Glm46VProcessor's chat path and call (ids, token types, grids; compact uint8 pixels
expanded at collate == its float32 bit for bit), layout-only == full path, positions ==
Glm46VModel.get_rope_index, batched and packed logits == per-row logits (0..3 images, left and
right padding). transformers 4.57 has no glm46v: the row still resolves there (names only),
the tests that build the processor or model skip."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError
from mmpipe.families import GLM4V, GLM46V, family_of, get_family, resolve_family, takes_generic_path
from mmpipe.images.spec import VisionSpec, glm4v_smart_resize
from mmpipe.offline import glm46v
from mmpipe.testing import invariants

from helpers import processor_reference, image_chat as _chat

FAM = GLM46V.name
COUNTS = [0, 1, 2, 3]  # images per row
needs_glm46v = pytest.mark.skipif(not glm46v.available(), reason="transformers 4.x has no GLM-4.6V (glm46v)")


@pytest.fixture(scope="module")
def proc():
    if not glm46v.available():
        pytest.skip("transformers 4.x has no GLM-4.6V (glm46v)")
    return testing.build_processor(FAM)


@pytest.fixture(scope="module")
def model():
    if not glm46v.available():
        pytest.skip("transformers 4.x has no GLM-4.6V (glm46v)")
    return testing.build_model(FAM)


@pytest.fixture(scope="module")
def photos():
    return [im.convert("RGB") for _, im in testing.sample_photos()][:3]


def _rows(proc, counts, *, seed=0):
    rows = []
    for i, k in enumerate(counts):
        imgs = [testing.tiny_image(40 + 16 * j + 8 * i, 56 + 24 * i, seed=seed + 5 * i + j) for j in range(k)]
        msgs = _chat(k, answer=f"Answer {i}.")
        if i % 2:
            msgs[0]["content"].insert(0, {"type": "text", "text": "Please look carefully. "})
        rows.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc))
    return rows


def _assert_matches_processor(row, proc, msgs, images, model=None):
    ref = processor_reference(proc, msgs, images)
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
    np.testing.assert_array_equal(row.mm_token_type_ids, ref["mm_token_type_ids"][0])
    np.testing.assert_array_equal(row.image_grid_thw, ref["image_grid_thw"].reshape(-1, 3))
    if images:  # compact uint8 storage expanded at collate == the processor's float32, bit for bit
        batch = mmpipe.collate([row], processor=proc)
        assert batch.pixel_values.dtype == torch.float32
        np.testing.assert_array_equal(batch.pixel_values.numpy(), ref["pixel_values"])
    invariants.assert_row_positions(row, model=model)  # == mmpipe's rule and Glm46VModel.get_rope_index


def test_the_row_resolves_without_transformers_glm46v():
    """Names only: the row resolves by name and model type on every transformers line (4.57
    has no glm46v classes); it is GLM-4.1V's row apart from its names and videos."""
    assert get_family(FAM) is GLM46V and family_of(types.SimpleNamespace(model_type="glm46v")) is GLM46V
    assert GLM46V.media is GLM4V.media and GLM46V.kind == "patches" and GLM46V.video_rule == "glm46v"
    same = ("rope", "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "image_token",
            "video_token", "vision_start_token", "vision_end_token", "min_pixels", "max_pixels", "resize_rule",
            "processor_bounds", "mrope_section", "no_packing")
    assert all(getattr(GLM46V, k) == getattr(GLM4V, k) for k in same)
    assert not GLM4V.accepts(FAM) and not GLM46V.accepts(GLM4V.name)  # each takes only its own rows


@needs_glm46v
def test_family_comes_from_the_classes(proc, model):
    import transformers

    assert resolve_family(proc) is GLM46V and family_of(proc) is GLM46V and not takes_generic_path(proc)
    assert family_of(model) is GLM46V and family_of(model.config) is GLM46V
    assert VisionSpec.from_processor(proc).resize_rule == "glm4v"
    assert proc.image_token == GLM46V.image_token and proc.video_token == GLM46V.video_token
    # transformers' stock GLM-4.6V image processor has the row's settings (sizes, bounds, mean/std)
    ip = transformers.Glm46VImageProcessorPil()
    assert (ip.patch_size, ip.temporal_patch_size, ip.merge_size) == (14, 2, 2) == (
        GLM46V.patch_size, GLM46V.temporal_patch_size, GLM46V.merge_size)
    assert (ip.size.shortest_edge, ip.size.longest_edge) == (GLM46V.min_pixels, GLM46V.max_pixels)
    assert tuple(ip.image_mean) == GLM46V.image_mean and tuple(ip.image_std) == GLM46V.image_std
    assert GLM46V.model_class == type(model).__name__


@needs_glm46v
def test_resize_rule_equals_transformers():
    from transformers.models.glm46v.image_processing_pil_glm46v import smart_resize as hf_resize

    sizes = list(itertools.product([1, 14, 27, 28, 29, 97, 333, 2999], repeat=2)) + [(4000, 6000), (17, 3000)]
    for (h, w), (mn, mx) in itertools.product(sizes, [(112 * 112, 28 * 28 * 15000), (4 * 1568, 64 * 1568)]):
        try:
            want = hf_resize(num_frames=2, height=h, width=w, temporal_factor=2, factor=28, min_pixels=mn, max_pixels=mx)
        except ValueError:
            with pytest.raises(ImageError):
                glm4v_smart_resize(h, w, 28, mn, mx)
            continue
        assert glm4v_smart_resize(h, w, 28, mn, mx) == want, (h, w, mn, mx)


def test_encode_equals_processor_on_real_photos(proc, model, photos):
    msgs = _chat(len(photos), answer="Three pictures.")
    row = mmpipe.encode_row({"messages": msgs, "images": photos}, proc)
    assert row.family == FAM and row.pixel_format == "uint8"
    _assert_matches_processor(row, proc, msgs, photos, model)
    # the labels: the answer as the template renders it after the generation prompt "<|assistant|>\n"
    assert proc.tokenizer.decode(row.input_ids[row.labels != -100]) == "<think></think>\nThree pictures."


@pytest.mark.parametrize("h,w", [(13, 200), (27, 27), (97, 211), (512, 128), (300, 31)])
def test_encode_equals_processor_on_odd_sizes(proc, h, w):
    img = testing.tiny_image(h, w, seed=h * 7 + w)
    _assert_matches_processor(mmpipe.encode_row({"messages": _chat(1), "images": [img]}, proc), proc, _chat(1), [img])


def test_layout_only_equals_full_path(proc, photos):
    imgs = photos + [testing.tiny_image(13, 200)]
    raw = {"messages": _chat(len(imgs), answer="ok"), "images": imgs}
    full, lay = mmpipe.encode_row(raw, proc), mmpipe.encode_row(raw, proc, pixels="none")
    assert lay.pixel_format == "none" and lay.pixel_values_u8 is None
    for f in ("input_ids", "image_grid_thw", "position_ids", "mm_token_type_ids", "labels"):
        np.testing.assert_array_equal(getattr(lay, f), getattr(full, f))
    assert lay.rope_delta == full.rope_delta


def test_compact_bytes_vs_float32(proc, photos):
    msgs = _chat(len(photos))
    u8 = mmpipe.encode_row({"messages": msgs, "images": photos}, proc)
    f32 = mmpipe.encode_row({"messages": msgs, "images": photos}, proc, pixels="float32")
    assert u8.pixel_values_u8.dtype == np.uint8 and u8.pixel_values_u8.shape[1] == GLM46V.patch_dim_u8 == 588
    assert u8.pixel_values_u8.nbytes * 8 == f32.pixel_values.nbytes  # one temporal copy, 1 byte vs 4
    np.testing.assert_array_equal(f32.pixel_values, processor_reference(proc, msgs, photos)["pixel_values"])


def _gap(a, b) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_logits_equal_per_row_logits(proc, model, padding_side):
    """Measured max-abs: 3.0e-7 (the one-image row), 0.0 the others, both sides (eager, fp32)."""
    rows = _rows(proc, COUNTS)
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=padding_side)
    invariants.assert_positions_match_rows(batch, rows, model=model)
    logits = invariants.assert_batched_logits_match(model, rows, proc, batch=batch, rtol=0, atol=1e-4)
    with torch.no_grad():
        alone = [model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0] for r in rows]
    n = batch.seq_lengths
    gaps = [_gap(logits[b, -int(n[b]):] if padding_side == "left" else logits[b, :int(n[b])], alone[b])
            for b in range(len(rows))]
    assert max(gaps) < 1e-4, gaps


def test_row_alone_equals_the_processor_forward(proc, model, photos):
    msgs = _chat(2, answer="Two.")
    row = mmpipe.encode_row({"messages": msgs, "images": photos[:2]}, proc)
    ref = processor_reference(proc, msgs, photos[:2])
    invariants.assert_batched_logits_match(model, [row], proc, references=[ref], atol=1e-6, rtol=1e-6)


def test_packed_logits_equal_per_row_logits(proc, model):
    """PackingCollator with the model (its layers: full attention only) == each row alone."""
    rows = _rows(proc, [2, 0, 1, 3], seed=11)
    collator = mmpipe.PackingCollator(proc, model=model)
    assert collator.family is GLM46V and collator.layers.kinds == ("full_attention",)
    packed = collator(rows)
    invariants.assert_pack_roundtrip(rows, packed=packed)
    out = invariants.assert_packed_logits_match(model, rows, proc, packed=packed, rtol=0, atol=1e-4)
    with torch.no_grad():
        alone = [model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0] for r in rows]
    assert max(_gap(p, a) for p, a in zip(packed.split(out.logits), alone)) < 1e-4
