"""Batches of encoded rows holding any mix of images and videos (0, 1 or 2 videos per row,
images between them, rows with no media): collate / unbatch, packing, Arrow rows, and the
model seeing every video in a batch, through the invariant harness (`mmpipe.testing.invariants`).

Rows are encoded by `mmpipe.encode_row` from frame-list videos (no decoder needed;
`helpers.mixed_media_raws`); their pixels are checked against the processors in
tests/encoding/test_video_encode.py and tests/rollout/test_video_pixel_oracle.py.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.images.spec import VisionSpec
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing.invariants import (assert_batched_logits_match, assert_pack_roundtrip, assert_packed_logits_match,
                                       assert_positions_match_rows, assert_roundtrip, assert_unbatched_rows_valid)

from conftest import FAMILIES, model_for, processor_for
from helpers import encode_mixed, mixed_media_raws, VIDEO_BOUNDS

LAYOUT = ["vIv", "", "I", "v", "IvI", "vv"]  # per row: its media in order (v video, I image)


@pytest.fixture(scope="module", params=FAMILIES)
def encoded(request):
    proc = processor_for(request.param)
    return request.param, proc, encode_mixed(LAYOUT, proc)


def _owners(kind: str) -> list[list[int]]:
    """Per row, the batch-wide indices of its images / videos (row order, item order)."""
    out, k = [], 0
    for kinds in LAYOUT:
        n = kinds.count(kind)
        out.append(list(range(k, k + n)))
        k += n
    return out


def test_collate_unbatch_round_trip_both_padding_sides(encoded):
    family, proc, rows = encoded
    assert [r.num_videos for r in rows] == [k.count("v") for k in LAYOUT]
    assert [r.num_images for r in rows] == [k.count("I") for k in LAYOUT]
    for side in ("left", "right"):
        batch = assert_roundtrip(rows, processor=proc, padding_side=side)
        assert batch.sample_to_video_indices == _owners("v")
        assert batch.sample_to_image_indices == _owners("I")
        assert batch.pixel_values_videos.dtype == torch.float32
        assert batch.pixel_values_videos.shape == (sum(r.num_video_patches for r in rows), batch.fam.patch_dim)
        assert len(batch.second_per_grid_ts) == batch.video_grid_thw.shape[0] == 6
        assert_unbatched_rows_valid(batch)
        assert_positions_match_rows(batch, rows, model=model_for(family))


def test_storage_formats_mix_and_come_back_as_they_went_in(encoded):
    """Compact and float32 rows (and a text row) in one batch: each row unbatches in its own
    storage; the float32 rebuilt from compact video rows equals the float32 rows' values."""
    family, proc, rows = encoded
    f32 = encode_mixed(LAYOUT[:4], proc, pixels="float32")
    mixed = [rows[0], f32[0], rows[1], f32[3], rows[3]]
    batch = assert_roundtrip(mixed, processor=proc)
    assert [r.pixel_format for r in assert_unbatched_rows_valid(batch)] == ["uint8", "float32", "uint8", "float32", "uint8"]
    vpo = batch.video_patch_offsets.tolist()
    assert torch.equal(batch.pixel_values_videos[vpo[0]:vpo[1]], batch.pixel_values_videos[vpo[1]:vpo[2]])


def test_arrow_rows_collate_like_the_records(encoded, tmp_path):
    family, proc, rows = encoded
    ds = datasets.Dataset.from_list([r.to_dict() for r in rows], features=MultiModalInputs.features("uint8"))
    ds.save_to_disk(str(tmp_path / "enc"))
    back = datasets.load_from_disk(str(tmp_path / "enc"))
    a, b = mmpipe.collate(rows, processor=proc), mmpipe.collate(list(back), processor=proc)
    for name in ("input_ids", "position_ids", "video_grid_thw", "second_per_grid_ts", "pixel_values_videos",
                 "pixel_values", "video_offsets", "video_patch_offsets"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_pack_round_trip_and_packed_logits(encoded):
    family, proc, rows = encoded
    packed = assert_pack_roundtrip(rows, processor=proc)
    kw = packed.model_inputs()
    assert kw["video_grid_thw"].shape[0] == 6 and kw["image_grid_thw"].shape[0] == 4
    assert ("second_per_grid_ts" in kw) == mmpipe.family_of(family).takes_second_per_grid_ts
    assert_packed_logits_match(model_for(family), rows, proc, packed=packed, rtol=1e-5, atol=1e-5)
    # the DataLoader form: PackingCollator over stored dicts
    p2 = mmpipe.PackingCollator(proc)([r.to_dict() for r in rows])
    kw2 = p2.model_inputs()
    assert kw2.keys() == kw.keys()
    assert all(torch.equal(kw2[k], kw[k]) if torch.is_tensor(kw[k]) else kw2[k] == kw[k] for k in kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_model_sees_every_video_batched_like_alone(family):
    """Batched logits == each row alone (0..2 videos with images between), and editing one
    frame of one video changes that row's logits and no other row's."""
    proc, model = processor_for(family), model_for(family)
    raws = mixed_media_raws(LAYOUT)
    rows = [mmpipe.encode_row(r, proc, idx=i, video_options=VIDEO_BOUNDS) for i, r in enumerate(raws)]
    batch = mmpipe.collate(rows, processor=proc, padding_side="left")
    assert_batched_logits_match(model, rows, proc, batch=batch, rtol=1e-5, atol=1e-5)
    edited = [dict(r) for r in raws]
    frames = [f.copy() for f in raws[5]["videos"][1]["frames"]]
    frames[1] = 255 - frames[1]  # the second video's second frame of the last row
    edited[5]["videos"] = [raws[5]["videos"][0], {"frames": frames, "fps": 2.0}]
    rows2 = rows[:5] + [mmpipe.encode_row(edited[5], proc, idx=5, video_options=VIDEO_BOUNDS)]
    assert np.array_equal(rows2[5].input_ids, rows[5].input_ids)
    with torch.no_grad():
        a = model(**batch.model_inputs()).logits
        b = model(**mmpipe.collate(rows2, processor=proc, padding_side="left").model_inputs()).logits
    assert torch.equal(a[:5], b[:5])
    start = batch.input_ids.shape[1] - rows[5].num_tokens  # left padding
    first = start + int(np.flatnonzero(rows[5].mm_token_type_ids == 2)[0])
    assert torch.equal(a[5, start:first], b[5, start:first])  # causal: tokens before the videos cannot see them
    assert not torch.allclose(a[5, first:], b[5, first:])


def test_compact_and_float_video_rows_give_the_same_model_inputs(encoded):
    family, proc, rows = encoded
    spec = VisionSpec.from_processor(proc)
    f32 = [mmpipe.encode_row(r, proc, idx=i, video_options=VIDEO_BOUNDS, pixels="float32")
           for i, r in enumerate(mixed_media_raws(LAYOUT))]
    a = mmpipe.collate(rows, processor=proc).model_inputs()
    b = mmpipe.collate(f32, processor=proc).model_inputs()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(mmpipe.compact(r, spec) == c for r, c in zip(f32, rows))


@pytest.mark.parametrize("cut", ["dropped", "short"])
def test_a_row_without_its_seconds_per_grid_step_is_refused_at_collate(cut):
    """Qwen2.5-VL's model reads one ``second_per_grid_ts`` value per video (its video time scale,
    whenever it computes positions itself): a stored row whose column was dropped or cut collated
    into a batch with 0 values for 1 video (unbatch then refused it, the model raised IndexError
    with ``positions="none"``). Collate now names the row and the column, as validate_dataset does."""
    proc = processor_for("qwen2_5_vl")
    text, video = (r.to_dict() for r in encode_mixed(["", "v"], proc))
    if cut == "dropped":
        del video["second_per_grid_ts"]
    else:
        video["second_per_grid_ts"] = video["second_per_grid_ts"][:0]
    with pytest.raises(mmpipe.errors.PixelDataError) as err:
        mmpipe.collate([text, video], processor=proc)
    assert err.value.row == 1 and err.value.column == "second_per_grid_ts"
    assert "one value per video" in str(err.value) and "re-encode" in str(err.value)
