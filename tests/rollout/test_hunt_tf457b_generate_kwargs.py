"""`mmpipe.rollout.inputs.to_generate_kwargs` called directly (outside `TransformersEngine`) on
transformers 4.57 (scripts/envs/tf457.sh).

4.57's ``generate`` never extends passed ``position_ids`` while decoding: Qwen2-VL / Qwen2.5-VL
raised an untyped RuntimeError (a size mismatch at the first decoding step), Qwen3-VL silently
drops them; ``position_ids=True`` is now refused there with an `ArgumentError`. Without positions
``generate`` numbers the prompt with the model's ``get_rope_index`` (its
``prepare_inputs_for_generation``), whose Qwen2.5-VL rule casts ``second_per_grid_ts`` to int64:
for videos sampled at 3 fps that is not the rows' numbering, and the direct caller was not told;
now a UserWarning names the rows and `mmpipe.rollout.tf4_positions.training_positions`, inside which
the model numbers the prompt as the rows do.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import mmpipe
from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.inputs import to_generate_kwargs
from mmpipe.rollout.tf4_positions import tf4_video_mismatches, training_positions
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from helpers import VIDEO_BOUNDS, video_frames_list

tf457 = pytest.mark.needs_env("tf457")


def _video_batch(proc, fps: float):
    raws = [{"messages": [{"role": "user", "content": "no video here"}]}] + [
        {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}],
         "videos": [{"frames": video_frames_list(n, 40, 56, seed=n), "fps": fps}]} for n in (8, 2)]
    rows = [mmpipe.encode_row(r, proc, labels=False, video_options=VIDEO_BOUNDS) for r in raws]
    return rows, mmpipe.collate(rows, processor=proc, padding_side="left")


def _generate_positions(model, kw):
    """int64 [3, B, L] (0 at pads): the prompt positions 4.57's Qwen2.5-VL generate uses (its
    prepare_inputs_for_generation calls model.model.get_rope_index with these arguments)."""
    pos, _ = model.model.get_rope_index(kw["input_ids"], image_grid_thw=kw.get("image_grid_thw"),
                                        video_grid_thw=kw.get("video_grid_thw"),
                                        second_per_grid_ts=kw.get("second_per_grid_ts"),
                                        attention_mask=kw["attention_mask"])
    return pos * kw["attention_mask"].bool()  # 4.57 puts 1 at pads, the rows 0


def _ours(record) -> list:
    return [w for w in record if "second_per_grid_ts cast to an integer" in str(w.message)]


@tf457
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_position_ids_true_is_refused_on_4x(family):
    """Before: the kwargs came back and generate raised RuntimeError (size mismatch) for Qwen2-VL /
    Qwen2.5-VL, or dropped the positions (Qwen3-VL); now an ArgumentError saying why and the fix."""
    assert not is_transformers_5()
    proc, model = processor_for(family), model_for(family)
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}],
           "images": [mmpipe.testing.tiny_image(40, 56)]}
    batch = mmpipe.collate([mmpipe.encode_row(raw, proc, labels=False)], processor=proc, padding_side="left")
    with pytest.raises(ArgumentError, match=r"position_ids=True.*transformers 4\.57.*position_ids=False"):
        to_generate_kwargs(batch, model=model, position_ids=True)
    assert "position_ids" not in to_generate_kwargs(batch, model=model)


@tf457
def test_direct_kwargs_warn_where_4_57_numbers_videos_otherwise():
    """fps 3 (second_per_grid_ts 0.667): 4.57's generate numbers the 8-frame video's prompt otherwise
    than the rows; the warning names that row (1) and not the 2-frame one (one grid: equal), and
    inside training_positions the model numbers it as the rows do (no warning there). Before: no
    warning."""
    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")
    rows, batch = _video_batch(proc, 3.0)
    assert tf4_video_mismatches(batch.fam, batch) == [0]
    with pytest.warns(UserWarning, match=r"rows \[1\] \(videos \[0\].*training_positions"):
        kw = to_generate_kwargs(batch, model=model)
    rows_pos = batch.model_inputs(positions="mrope")["position_ids"]
    assert not torch.equal(_generate_positions(model, kw)[:, 1], rows_pos[:, 1])  # what the warning says
    assert torch.equal(_generate_positions(model, kw)[:, 2], rows_pos[:, 2])
    tok = proc.tokenizer
    with training_positions(model, batch.fam, tok), warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        kw = to_generate_kwargs(batch, model=model)
        assert torch.equal(_generate_positions(model, kw), rows_pos)
    assert not _ours(rec)
    with warnings.catch_warnings(record=True) as rec:  # the engine numbers them itself: no warning
        warnings.simplefilter("always")
        TransformersEngine(model, proc).generate(rows, SamplingParams(max_new_tokens=2))
    assert not _ours(rec)


@tf457
def test_no_warning_where_4_57_numbers_videos_as_the_rows():
    """Guard: fps 2 (second_per_grid_ts 1.0): 4.57's numbering is the rows'; no warning."""
    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")
    _, batch = _video_batch(proc, 2.0)
    assert tf4_video_mismatches(batch.fam, batch) == []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        kw = to_generate_kwargs(batch, model=model)
    assert not _ours(rec)
    assert torch.equal(_generate_positions(model, kw), batch.model_inputs(positions="mrope")["position_ids"])


def test_position_ids_true_still_passes_positions_on_5x():
    """Guard (main env): transformers 5 extends passed positions; position_ids=True gives [4, B, L]
    and the fps-3 video batch no warning (no 4.x check there)."""
    if not is_transformers_5():
        pytest.skip("transformers 4.x refuses position_ids=True (the tests above)")
    proc = processor_for("qwen2_5_vl")
    _, batch = _video_batch(proc, 3.0)
    assert tf4_video_mismatches(batch.fam, batch) == []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        kw = to_generate_kwargs(batch, position_ids=True)
    assert tuple(kw["position_ids"].shape[:2]) == (4, 3) and not _ours(rec)


@tf457
def test_video_time_transformers_stays_5x_arithmetic_on_4_57():
    """Guard (decision): mmpipe.rope's video_time="transformers" is 5.x's float32 rule on 4.57 too,
    not 4.57's int64 cast of second_per_grid_ts (fps 3: the rows' positions, not the model's)."""
    from mmpipe.rope import get_rope_index

    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")
    _, batch = _video_batch(proc, 3.0)
    kw = batch.model_inputs(labels=False)
    pos, _ = get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], kw.get("image_grid_thw"), kw["video_grid_thw"],
                            kw["second_per_grid_ts"], kw["attention_mask"], family="qwen2_5_vl",
                            video_time="transformers")
    assert torch.equal(pos, kw["position_ids"])
    assert not torch.equal(pos, _generate_positions(model, kw))
