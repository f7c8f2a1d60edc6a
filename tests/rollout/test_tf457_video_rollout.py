"""`TransformersEngine` on transformers 4.57 (scripts/envs/tf457.sh) with Qwen2.5-VL videos sampled at
rates other than 1 or 2 fps: the sampled tokens' logprobs equal the training forward's on the policy
batch (`mmpipe.testing.invariants.policy_logprobs`, mmpipe's positions).

4.57's ``generate`` numbers the prompt with the model's ``get_rope_index``, whose Qwen2.5-VL rule casts
``second_per_grid_ts`` to int64 before scaling (0.667 -> 0: every frame group at one temporal
position). Before `mmpipe.rollout.tf4_positions`: a 1e-3 gap (fps 3) and 5.6e-4 (fps 1.5), measured;
Qwen2-VL / Qwen3-VL were already equal (their rules have no such scale)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.results import unbatch_rollout
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.testing.invariants import logprob_gap, policy_logprobs

from conftest import model_for, processor_for
from helpers import VIDEO_BOUNDS, video_frames_list

pytestmark = pytest.mark.needs_env("tf457")


@pytest.mark.parametrize("fps", [3.0, 1.5])
def test_qwen2_5_vl_video_rollout_logprobs_equal_training_on_4_57(fps):
    import transformers

    assert transformers.__version__.startswith("4.57")
    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")
    raws = [{"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}],
             "videos": [{"frames": video_frames_list(n, 40, 56, seed=n), "fps": fps}]} for n in (8, 4)]
    rows = [mmpipe.encode_row(r, proc, labels=False, video_options=VIDEO_BOUNDS) for r in raws]
    assert float(rows[0].second_per_grid_ts[0]) not in (1.0, 2.0)
    gens = TransformersEngine(model, proc).generate(rows, SamplingParams(max_new_tokens=8, temperature=1.0, seed=1))
    samples = unbatch_rollout(rows, gens, processor=proc)
    batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
    assert logprob_gap(policy_logprobs(model, batch), [np.asarray(s.logprobs) for s in samples]) < 1e-5
    assert "get_rope_index" not in vars(model.model)  # the model's own method is back
