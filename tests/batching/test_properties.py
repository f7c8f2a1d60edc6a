"""The five correctness properties of the design document, as hypothesis tests."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe.compat import hf_get_rope_index, is_transformers_5
from mmpipe.testing.invariants import assert_roundtrip

from conftest import model_for, processor_for
from strategies import image_pool, raw_rows, user_content

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
families = st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
sides = st.sampled_from(["left", "right"])
batches = st.lists(raw_rows(max_turns=2, max_images=2), min_size=1, max_size=4)


def _encode(raws, family, **kw):
    proc = processor_for(family)
    return proc, [mmpipe.encode_row(r, proc, **kw) for r in raws]


@SETTINGS
@given(batches, families, sides)
def test_property_1_pixels_reach_the_forward(raws, family, side):
    """Feature: multimodal-data-passing-fix, Property 1: pixel data reaches the model's
    forward for any batch with images (the vision tower receives exactly the batch's
    pixel_values and image_grid_thw)."""
    proc, rows = _encode(raws, family)
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    model = model_for(family)
    seen = []
    hook = model.model.visual.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"],
                                               kwargs.get("grid_thw", args[1] if len(args) > 1 else None))),
        with_kwargs=True)
    try:
        with torch.no_grad():
            model(**batch.model_inputs())
    finally:
        hook.remove()
    n_images = sum(r.num_images for r in rows)
    if n_images == 0:
        assert seen == [] and batch.pixel_values is None
        return
    assert len(seen) == 1
    pixels, grid = seen[0]
    assert torch.equal(pixels, batch.pixel_values)
    assert torch.equal(grid, batch.image_grid_thw) and grid.shape[0] == n_images


@SETTINGS
@given(batches, families, sides)
def test_property_2_positions_match_transformers(raws, family, side):
    """Feature: multimodal-data-passing-fix, Property 2: positions from image_grid_thw match
    transformers' get_rope_index (batched, padded, per family)."""
    proc, rows = _encode(raws, family)
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    model = model_for(family)
    ref_pos, ref_delta = hf_get_rope_index(
        model, batch.input_ids, batch.mm_token_type_ids,
        image_grid_thw=batch.image_grid_thw if batch.image_grid_thw.shape[0] else None,
        attention_mask=batch.attention_mask)
    real = batch.attention_mask.bool()[None].expand_as(ref_pos)
    if is_transformers_5():
        assert torch.equal(batch.position_ids, ref_pos)
    else:  # 4.x gives pads position 1 in batches without images (5.x and mmpipe: 0); pads are masked
        assert torch.equal(batch.position_ids[real], ref_pos[real])
        ref_pos = torch.where(real, ref_pos, batch.position_ids)
        # and 4.x's delta is max + 1 - padded length (5.x and mmpipe: - real length)
        ref_delta = ref_delta + batch.input_ids.shape[1] - batch.attention_mask.sum(1, keepdim=True)
    assert torch.equal(batch.rope_deltas, ref_delta)
    # and the vectorised function on the whole batch agrees with both
    pos, delta = mmpipe.get_rope_index(batch.input_ids, batch.mm_token_type_ids,
                                       image_grid_thw=batch.image_grid_thw, attention_mask=batch.attention_mask,
                                       family=family)
    assert torch.equal(pos, ref_pos) and torch.equal(delta, ref_delta)


@SETTINGS
@given(batches, families, sides, st.sampled_from(["uint8", "float32"]))
def test_property_3_encode_output_is_consumable(raws, family, side, pixels):
    """Feature: multimodal-data-passing-fix, Property 3: encode output (as stored, Arrow
    python rows) is consumable by collate, unbatch and the model without transformation
    errors."""
    proc = processor_for(family)
    stored = [mmpipe.encode(r, processor=proc, pixels=pixels) for r in raws]
    batch = mmpipe.Collator(proc, padding_side=side)(stored)
    with torch.no_grad():
        out = model_for(family)(**batch.model_inputs())
    assert out.logits.shape[:2] == batch.input_ids.shape
    assert torch.isfinite(out.logits).all()
    assert_roundtrip(stored, batch=batch)  # exact, so every row keeps its num_tokens


@SETTINGS
@given(st.lists(user_content(max_images=3), min_size=1, max_size=4), families)
def test_property_4_multi_turn_first_dims_equal_total_images(turns, family):
    """Feature: multimodal-data-passing-fix, Property 4: concatenating a row's inputs over
    several turns gives image_grid_thw / pixel first dimensions equal to the total image
    count (and patch count) of all turns."""
    proc = processor_for(family)
    msgs, imgs, per_turn = [], [], []
    for content, turn_imgs in turns:
        msgs += [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
        imgs += turn_imgs
        per_turn.append(mmpipe.encode_row({"messages": [{"role": "user", "content": content}], "images": turn_imgs}, proc))
    whole = mmpipe.encode_row({"messages": msgs, "images": imgs}, proc)
    grids = np.concatenate([t.image_grid_thw for t in per_turn])
    u8 = np.concatenate([t.pixel_values_u8 for t in per_turn])
    assert whole.image_grid_thw.shape[0] == len(imgs) == grids.shape[0]
    np.testing.assert_array_equal(whole.image_grid_thw, grids)
    np.testing.assert_array_equal(whole.pixel_values_u8, u8)
    assert whole.pixel_values_u8.shape[0] == int(grids.prod(axis=1).sum()) if len(grids) else True
    whole.validate()


@SETTINGS
@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), families, sides)
def test_property_5_ragged_image_counts_batch_and_unbatch(counts, family, side):
    """Feature: multimodal-data-passing-fix, Property 5: batches with different image counts
    per row, zero included, batch and unbatch without index errors."""
    proc = processor_for(family)
    pool = image_pool()
    raws = []
    for i, k in enumerate(counts):
        content = [{"type": "text", "text": f"r{i}"}]
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": "."}]
        raws.append({"messages": [{"role": "user", "content": content}],
                     "images": [pool[(i + j) % len(pool)] for j in range(k)]})
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    assert [len(ix) for ix in batch.sample_to_image_indices] == counts
    assert batch.image_grid_thw.shape[0] == sum(counts)
    assert_roundtrip(rows, batch=batch)
