"""Precision hunt: Qwen2.5-VL video positions from low-precision ``second_per_grid_ts`` (a
DeepSpeed bf16 Trainer casts every float input to bf16, the seconds included).
``mmpipe.rope.get_rope_index(video_time="transformers")`` computes the temporal index in the
seconds' dtype, as transformers does; bfloat16 seconds leaked torch's bare ``TypeError: Got
unsupported ScalarType BFloat16`` (the rule's numpy arithmetic has no bf16) and are now an
`ArgumentError` naming them and the fix. float16 seconds give transformers' own positions."""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError

from helpers import encode_mixed


@pytest.fixture(scope="module")
def video_row():
    proc = testing.build_processor("qwen2_5_vl")
    r = encode_mixed(["vIv"], proc)[0]
    return (torch.as_tensor(r.input_ids)[None], torch.as_tensor(r.mm_token_type_ids)[None],
            torch.as_tensor(r.image_grid_thw), torch.as_tensor(r.video_grid_thw), torch.tensor([0.4, 1 / 3]))


def _ours(video_row, sec, rule):
    ids, tt, ig, vg, _ = video_row
    return mmpipe.rope.get_rope_index(ids, tt, ig, vg, second_per_grid_ts=sec, family="qwen2_5_vl", video_time=rule)[0]


def test_bfloat16_seconds_under_the_transformers_rule_are_refused_by_name(video_row):
    with pytest.raises(ArgumentError, match="second_per_grid_ts is bfloat16") as e:
        _ours(video_row, video_row[-1].bfloat16(), "transformers")
    assert "float32" in str(e.value) and "video_time='vllm'" in str(e.value)
    # the vLLM rule reads each value as a Python float: bf16 seconds as their float32 values
    sec = video_row[-1].bfloat16()
    assert torch.equal(_ours(video_row, sec, "vllm"), _ours(video_row, sec.float(), "vllm"))


def test_float16_seconds_give_transformers_positions(video_row):
    ids, tt, ig, vg, sec = video_row
    model = testing.build_model("qwen2_5_vl")
    for s in (sec, sec.half()):
        want, _ = model.model.get_rope_index(ids, tt, image_grid_thw=ig, video_grid_thw=vg, second_per_grid_ts=s,
                                             attention_mask=torch.ones_like(ids))
        assert torch.equal(_ours(video_row, s, "transformers"), want), s.dtype
