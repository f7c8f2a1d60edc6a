"""bfloat16 torch tensors (a bf16 model's logprobs or values; numpy has no such dtype) read as float32,
which holds each bf16 value exactly, as `mmpipe.rollout.results` reads a completion's logprobs:
`mmpipe.records.columns.to_numpy` / `as_array`, `mmpipe.testing.invariants.logprob_gap` /
`assert_logprobs_match`, and `Trajectory.logprobs` of turns holding bf16 logprobs.

Before the fix each raised a bare ``TypeError: Got unsupported ScalarType BFloat16``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmpipe.errors import InputError
from mmpipe.records.columns import as_array, to_numpy
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.trajectory import AgentTurn, Trajectory
from mmpipe.testing.invariants import assert_logprobs_match, logprob_gap

VALUES = [-0.5, -1.25, -3.015625, 0.0]  # exact in bfloat16


def _bf16(values=VALUES, requires_grad=False):
    return torch.tensor(values, dtype=torch.bfloat16, requires_grad=requires_grad)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_to_numpy_reads_bfloat16_as_exact_float32(requires_grad):
    got = to_numpy(_bf16(requires_grad=requires_grad))
    assert got.dtype == np.float32 and got.tolist() == VALUES


def test_as_array_reads_bfloat16_and_still_refuses_fractional_ids():
    got = as_array(_bf16(), np.float32, 1, "logprobs", row=0)
    assert got.dtype == np.float32 and got.tolist() == VALUES
    assert as_array(_bf16([3.0, 7.0]), np.int64, 1, "input_ids").tolist() == [3, 7]
    with pytest.raises(InputError, match="fractional"):
        as_array(_bf16([3.5]), np.int64, 1, "input_ids", row=2)


def test_logprob_gap_takes_bfloat16_rows():
    want = [np.asarray(VALUES, np.float32), np.asarray([-2.0], np.float32)]
    got = [_bf16(), _bf16([-2.015625])]
    assert logprob_gap(got, want) == pytest.approx(0.015625)
    assert assert_logprobs_match(got, want, atol=0.02) == pytest.approx(0.015625)
    assert logprob_gap(want, got) == pytest.approx(0.015625)


def test_trajectory_logprobs_of_bfloat16_turns():
    row = MultiModalInputs.from_dict({"input_ids": [1, 2, 3, 4, 5], "attention_mask": [1] * 5,
                                      "mm_token_type_ids": [0] * 5, "position_ids": [list(range(5))] * 3,
                                      "rope_delta": 0, "image_grid_thw": np.zeros((0, 3), np.int64),
                                      "family": "qwen2_vl", "labels": [-100, 2, 3, 4, 5]})
    turns = tuple(AgentTurn(token_ids=np.asarray(ids, np.int64), logprobs=lp, text="", finish_reason="stop", span=span)
                  for ids, lp, span in (([2, 3], _bf16(VALUES[:2]), (1, 3)), ([4, 5], [-3.015625, 0.0], (3, 5))))
    got = Trajectory(row=row, turns=turns, finish_reason="stop", prompt_index=0).logprobs
    assert got.dtype == np.float32 and got.tolist() == VALUES
