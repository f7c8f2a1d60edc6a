"""transformers ``generate`` with videos (`mmpipe.rollout.to_generate_kwargs`): a left-padded
batch of prompts holding 0..2 videos and images generates, token for token, what each prompt
generates alone, on the three tiny models; the engine (`TransformersEngine`) sees the videos.
Clips are short (temporal extent within max(h, w)/merge), where transformers' own positions
and the original Qwen rule agree, so both position modes are checked."""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.inputs import to_generate_kwargs
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import FAMILIES, model_for, processor_for
from helpers import encode_mixed

LAYOUT = ["v", "", "vIv", "I"]


def _greedy(model, kw, n=5):
    with torch.no_grad():
        out = model.generate(**kw, max_new_tokens=n, do_sample=False, output_scores=True, return_dict_in_generate=True)
    return out.sequences[:, kw["input_ids"].shape[1]:], torch.stack(out.scores, 1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("position_ids", [False, True])
def test_batched_generate_with_videos_equals_each_prompt_alone(family, position_ids):
    proc, model = processor_for(family), model_for(family)
    rows = encode_mixed(LAYOUT, proc, labels=False, answer=False)
    kw = to_generate_kwargs(mmpipe.collate(rows, processor=proc, padding_side="left"), position_ids=position_ids,
                            model=model)
    assert kw["video_grid_thw"].shape[0] == 3 and kw["pixel_values_videos"].dtype == torch.float32
    assert ("second_per_grid_ts" in kw) == mmpipe.family_of(family).takes_second_per_grid_ts
    seqs, scores = _greedy(model, kw)
    for b, r in enumerate(rows):
        alone = to_generate_kwargs(mmpipe.collate([r], processor=proc, padding_side="left"),
                                   position_ids=position_ids, model=model)
        s1, sc1 = _greedy(model, alone)
        assert torch.equal(seqs[b], s1[0]), f"row {b}"
        torch.testing.assert_close(scores[b], sc1[0], rtol=1e-4, atol=1e-4)


def test_engine_sees_the_videos():
    """The same prompts with the video pixels withheld (``see_images=False`` drops images AND
    videos; the video tokens then read as plain embeddings) give other logprobs on every row."""
    family = "qwen2_vl"
    proc, model = processor_for(family), model_for(family)
    rows = encode_mixed(["v", "vv"], proc, labels=False, answer=False)
    params = SamplingParams(max_new_tokens=3)
    seen = TransformersEngine(model, proc).generate(rows, params)
    blind = TransformersEngine(model, proc, see_images=False).generate(rows, params)
    for s, b in zip(seen, blind):
        assert s.n == b.n == 1
        assert abs(float(s.completions[0].logprobs[0]) - float(b.completions[0].logprobs[0])) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_long_clip_rollout_logprobs_equal_training(family):
    """A clip whose temporal extent exceeds max(h, w)/merge (grid t=7 over 4x6 patches), where
    transformers 5's own get_rope_index departs from the original Qwen rule: the engine passes
    mmpipe's positions, so the sampled tokens' logprobs equal the training forward's on the
    policy batch (without that, 1e-3 on Qwen2-VL / Qwen2.5-VL, measured)."""
    import numpy as np

    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    from helpers import VIDEO_BOUNDS, video_frames_list

    proc, model = processor_for(family), model_for(family)
    raws = [{"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}],
             "videos": [{"frames": video_frames_list(n, 40, 56, seed=n), "fps": 2.0}]} for n in (14, 4)]
    rows = [mmpipe.encode_row(r, proc, labels=False, video_options=VIDEO_BOUNDS) for r in raws]
    assert rows[0].video_grid_thw.tolist() == [[7, 4, 6]]
    gens = TransformersEngine(model, proc).generate(rows, SamplingParams(max_new_tokens=8, temperature=1.0, seed=1))
    samples = unbatch_rollout(rows, gens, processor=proc)
    batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
    assert logprob_gap(policy_logprobs(model, batch), [np.asarray(s.logprobs) for s in samples]) < 1e-5
