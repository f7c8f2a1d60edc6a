"""A `RolloutSample` holding a bf16 model's logprobs (a bfloat16 torch tensor; numpy has no such
dtype) describes itself and renders in Jupyter, its logprobs read as float32 (exact).

Before the fix ``describe()`` and ``_repr_html_()`` raised a bare ``TypeError: Got unsupported
ScalarType BFloat16``.
"""

from __future__ import annotations

import numpy as np
import torch

from mmpipe.records.rollout import RolloutSample
from mmpipe.records.row import MultiModalInputs


def _sample() -> RolloutSample:
    prompt = MultiModalInputs.from_dict({"input_ids": [1, 2, 3], "attention_mask": [1] * 3,
                                         "mm_token_type_ids": [0] * 3, "position_ids": [list(range(3))] * 3,
                                         "rope_delta": 0, "image_grid_thw": np.zeros((0, 3), np.int64),
                                         "family": "qwen2_vl"})
    return RolloutSample(prompt=prompt, prompt_index=0, sample_index=0, response_ids=np.array([5, 6]),
                         logprobs=torch.tensor([-0.5, -1.25], dtype=torch.bfloat16), finish_reason="stop")


def test_describe_reads_bfloat16_logprobs():
    assert "logprobs mean -0.8750 min -1.2500" in _sample().describe()


def test_html_shows_bfloat16_logprobs():
    html = _sample()._repr_html_()
    assert "logprob -0.5000" in html and "logprob -1.2500" in html
