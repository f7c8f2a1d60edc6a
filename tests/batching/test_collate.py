"""collate / Collator / unbatch: ragged image counts, padding, DataLoader workers, exact inverse."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_positions_match_rows, assert_roundtrip

from conftest import processor_for
from strategies import raw_rows


def _encode_all(raws, proc, **kw):
    return [mmpipe.encode_row(r, proc, **kw) for r in raws]


def _rows(proc, counts=(2, 0, 1, 3)):
    raws = []
    for i, k in enumerate(counts):
        content = [{"type": "text", "text": f"row {i}"}]
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f" image {j}"}]
        raws.append({"messages": [{"role": "user", "content": content}],
                     "images": [testing.tiny_image(40 + 13 * j, 60 + 7 * i, seed=10 * i + j) for j in range(k)]})
    return raws


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    st.lists(raw_rows(max_turns=2, max_images=2), min_size=1, max_size=4),
    st.sampled_from(["left", "right"]),
    st.sampled_from([None, 8]),
    st.lists(st.sampled_from(["uint8", "float32", "none"]), min_size=4, max_size=4),
    st.sampled_from(["qwen2_vl", "qwen3_vl"]),
)
def test_unbatch_inverts_collate(raws, side, multiple, formats, family):
    """unbatch(collate(rows)) == rows for any rows, storage formats mixed (layout-only rows with
    images alone: a text-only batch, asked for with allow_layout_only=True)."""
    proc = processor_for(family)
    rows = [mmpipe.encode_row(r, proc, pixels=formats[i]) for i, r in enumerate(raws)]
    if any(r.pixel_format == "none" and r.num_images for r in rows) and any(r.has_pixels for r in rows):
        rows = [mmpipe.encode_row(r, proc) for r in raws]  # layout-only rows make a text-only batch
    batch = mmpipe.collate([r.to_dict() for r in rows], processor=proc, padding_side=side, pad_to_multiple_of=multiple,
                           allow_layout_only=True)
    assert_roundtrip(rows, batch=batch)
    assert_positions_match_rows(batch, rows)
    if multiple:
        assert batch.input_ids.shape[1] % multiple == 0


def test_offsets_slice_each_rows_images():
    proc = processor_for("qwen2_vl")
    rows = _encode_all(_rows(proc), proc)
    batch = mmpipe.collate(rows, processor=proc)
    assert batch.sample_to_image_indices == [[0, 1], [], [2], [3, 4, 5]]
    assert batch.image_to_sample.tolist() == [0, 0, 2, 3, 3, 3]
    ref = torch.cat([mmpipe.collate([r], processor=proc).pixel_values for r in rows if r.num_images])
    assert torch.equal(batch.pixel_values, ref)
    for b, r in enumerate(rows):
        sl = slice(int(batch.patch_offsets[b]), int(batch.patch_offsets[b + 1]))
        assert sl.stop - sl.start == r.num_image_patches
        assert torch.equal(batch.image_grid_thw[batch.sample_to_image_indices[b]], torch.from_numpy(r.image_grid_thw))


def test_text_only_batch_has_no_pixel_keys_and_runs():
    proc = processor_for("qwen2_vl")
    model = testing.build_model("qwen2_vl")
    rows = _encode_all(_rows(proc, counts=(0, 0)), proc)
    batch = mmpipe.collate(rows, processor=proc)
    kw = batch.model_inputs()
    assert "pixel_values" not in kw and "image_grid_thw" not in kw
    assert model(**kw).logits.shape[:2] == batch.input_ids.shape


def test_model_inputs_forms():
    proc = processor_for("qwen2_5_vl")
    rows = _encode_all(_rows(proc), proc)
    batch = mmpipe.collate(rows, processor=proc)
    kw = batch.model_inputs(device="cpu")
    assert set(kw) == {"input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "pixel_values", "image_grid_thw"}
    assert kw["position_ids"].shape == (3,) + tuple(batch.input_ids.shape)
    assert kw["pixel_values"].dtype == torch.float32 and kw["image_grid_thw"].dtype == torch.int64
    verl = batch.model_inputs(positions="verl")["position_ids"]
    assert verl.shape[0] == 4
    assert torch.equal(verl[1:], kw["position_ids"])
    mask = batch.attention_mask.bool()
    assert torch.equal(verl[0][mask], torch.cat([torch.arange(int(n)) for n in batch.seq_lengths]))


def test_dataloader_with_workers_over_arrow_rows(tmp_path):
    proc = processor_for("qwen2_vl")
    # an all-black image: its compact bytes are all NUL, which numpy/torch formatting of a
    # binary column would strip without the end marker
    black = {"messages": [{"role": "user", "content": [{"type": "text", "text": "dark"}, {"type": "image"}]}],
             "images": [np.zeros((56, 84, 3), np.uint8)]}
    raw = datasets.Dataset.from_list(_rows(proc) * 2 + [black])
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    expected = [mmpipe.MultiModalInputs.from_dict(r) for r in enc]
    for fmt in (None, "numpy", "torch"):
        ds = enc.with_format(fmt) if fmt else enc
        loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=mmpipe.Collator(proc), num_workers=2)
        assert_roundtrip(expected, batch=list(loader), label=str(fmt))


@pytest.mark.parametrize("family", ["qwen2_vl", "glm4v", "internvl"])
def test_pandas_format_rows_collate_exactly(family):
    """``with_format("pandas")`` hands nested lists (position_ids [3, L], grids [I, 3]) as 1-D
    object arrays of arrays: collate stacks them (same values, same dtype), so a DataLoader over
    the pandas format, a pandas slice and a list of one-row frames give the rows back exactly."""
    proc = processor_for(family)
    raw = datasets.Dataset.from_list(_rows(proc, counts=(1, 0, 2, 1)))
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    expected = [mmpipe.MultiModalInputs.from_dict(r) for r in enc]
    pandas = enc.with_format("pandas")
    loader = torch.utils.data.DataLoader(pandas, batch_size=2, collate_fn=mmpipe.Collator(proc))
    assert_roundtrip(expected, batch=list(loader), label="pandas loader")
    assert_roundtrip(expected, batch=mmpipe.collate(pandas[0:4], processor=proc), label="pandas slice")
    assert_roundtrip(expected, batch=mmpipe.collate([pandas[i] for i in range(4)], processor=proc),
                     label="one-row frames")


def test_layout_only_rows_with_images_are_refused_unless_allowed():
    """Layout-only rows (pixels="none") holding image tokens: collate refuses them (the model
    would train on image tokens without pixels); ``allow_layout_only=True`` is the explicit
    opt-in for ids without pixels; a layout-only row without images collates either way."""
    from mmpipe.errors import PixelDataError

    proc = processor_for("qwen2_vl")
    rows = _encode_all(_rows(proc, counts=(1, 0)), proc, pixels="none")
    for build in (lambda: mmpipe.collate(rows, processor=proc), lambda: mmpipe.Collator(proc)(rows),
                  lambda: mmpipe.Collator(proc)([r.to_dict() for r in rows])):
        with pytest.raises(PixelDataError) as info:
            build()
        e = info.value
        assert (e.row, e.column, e.stage) == (0, "pixel_values_u8", "collate")
        assert "1 image(s)" in e.expected and "pixels='none'" in e.found
        assert "pixels='uint8'" in e.fix and "allow_layout_only=True" in e.fix
    batch = mmpipe.collate(rows, processor=proc, allow_layout_only=True)
    assert "pixel_values" not in batch.model_inputs()
    assert_roundtrip(rows, batch=batch)
    assert mmpipe.Collator(proc, allow_layout_only=True)(rows).pixel_values is None
    text_only = mmpipe.collate(rows[1:], processor=proc)  # no image tokens: nothing is missing
    assert_roundtrip(rows[1:], batch=text_only)


def test_pixel_grid_mismatch_names_the_row():
    proc = processor_for("qwen2_vl")
    rows = [r.to_dict() for r in _encode_all(_rows(proc, counts=(0, 1)), proc)]
    rows[1]["pixel_values_u8"] = rows[1]["pixel_values_u8"][: -588]
    with pytest.raises(ValueError, match=r"row 1, column 'pixel_values_u8': .*the pixel data and the grids disagree"):
        mmpipe.collate(rows, processor=proc)
    rows = [r.to_dict() for r in _encode_all(_rows(proc, counts=(1,)), proc, pixels="none")]
    rows[0]["image_grid_thw"] = np.array([[1, 4, 4]])
    with pytest.raises(ValueError, match="row 0: .* image tokens in input_ids but image_grid_thw"):
        mmpipe.collate(rows, processor=proc)


def test_family_mismatch_is_an_error():
    rows = _encode_all(_rows(processor_for("qwen2_vl"), counts=(1,)), processor_for("qwen2_vl"))
    with pytest.raises(ValueError, match="encoded for model family 'qwen2_vl' but this batch is for 'qwen3_vl'"):
        mmpipe.Collator(processor_for("qwen3_vl"))(rows)


def test_collator_pickles():
    import pickle

    c = mmpipe.Collator(processor_for("qwen3_vl"), padding_side="right", pad_to_multiple_of=16)
    c2 = pickle.loads(pickle.dumps(c))
    assert c2.spec == c.spec and c2.padding_side == "right" and len(pickle.dumps(c)) < 2000


def test_keep_columns_ride_along_in_row_order():
    """keep_columns: dict rows, Arrow rows (ArrowRows, workers) and a missing column."""
    from mmpipe.batching.collate import ArrowRows

    proc = processor_for("qwen2_vl")
    rows = [dict(r.to_dict(), id=f"r{i}", reward_model={"ground_truth": str(i)}, data_source="toy")
            for i, r in enumerate(_encode_all(_rows(proc), proc))]
    col = mmpipe.Collator(proc, keep_columns=["id", "reward_model"])
    batch = col(rows[::-1])
    assert batch.columns == {"id": ["r3", "r2", "r1", "r0"],
                             "reward_model": [{"ground_truth": str(i)} for i in (3, 2, 1, 0)]}
    assert "id" not in batch.model_inputs() and mmpipe.Collator(proc)(rows).columns is None
    ds = datasets.Dataset.from_list(rows)
    loader = torch.utils.data.DataLoader(ArrowRows(ds), batch_size=3, collate_fn=col, num_workers=2)
    assert [b.columns["id"] for b in loader] == [["r0", "r1", "r2"], ["r3"]]
    with pytest.raises(mmpipe.errors.InputError, match="no column 'uid'") as e:
        mmpipe.collate(rows, processor=proc, keep_columns=["uid"])
    assert e.value.row == 0 and e.value.column == "uid" and "keep_columns" in str(e.value)
    with pytest.raises(mmpipe.errors.ArgumentError, match="list of column names"):
        mmpipe.Collator(proc, keep_columns="id")
