"""Rollout/training consistency: generation-time logprobs == teacher-forced logprobs of the
policy batch (the check RL people trust), on all three tiny families."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.testing.invariants import assert_logprobs_match, assert_row_positions, logprob_gap, policy_logprobs
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.results import unbatch_rollout

from conftest import model_for, processor_for
from helpers import GREEDY_AND_SAMPLED, multiturn_logprobs, prompt_rows

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


def _prompts(proc, counts=(1, 0, 2)):
    return prompt_rows(proc, counts, vary_length=True, size=(48, 64), step=(20, 12), seed_step=7)


def _max_gap(model, proc, samples, padding_side="right"):
    batch = mmpipe.Collator(proc, padding_side=padding_side)([s.to_row() for s in samples])
    return logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples])


@pytest.mark.parametrize("family", FAMILIES)
@GREEDY_AND_SAMPLED
def test_generation_logprobs_equal_teacher_forcing(family, params):
    proc, model = processor_for(family), model_for(family)
    prompts = _prompts(proc)
    gens = TransformersEngine(model, proc).generate(prompts, params)
    samples = unbatch_rollout(prompts, gens)
    assert len(samples) == len(prompts) * params.n
    assert [s.prompt_index for s in samples] == [i for i in range(len(prompts)) for _ in range(params.n)]
    for side in ("left", "right"):
        assert _max_gap(model, proc, samples, side) <= 1e-4
    # a group shares its prompt, pixels included: no copies
    if params.n > 1:
        assert samples[0].prompt is samples[1].prompt
        assert samples[0].to_row().pixel_values_u8 is samples[1].to_row().pixel_values_u8


@pytest.mark.parametrize("family", FAMILIES)
def test_response_positions_equal_the_rule_over_prompt_plus_response(family):
    proc, model = processor_for(family), model_for(family)
    prompts = _prompts(proc)
    samples = unbatch_rollout(prompts, TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=5)))
    for s in samples:
        row = s.to_row()
        assert row.family == family
        assert_row_positions(row)
        row.validate()


def test_without_images_the_outputs_change_and_consistency_fails():
    """Cannot pass vacuously: a generation call that drops the images gives other outputs,
    and its logprobs disagree with the (image-seeing) training forward."""
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    prompts = _prompts(proc, counts=(2, 1))
    params = SamplingParams(max_new_tokens=6)
    seeing = unbatch_rollout(prompts, TransformersEngine(model, proc).generate(prompts, params))
    blind = unbatch_rollout(prompts, TransformersEngine(model, proc, see_images=False).generate(prompts, params))
    differs = any(not np.array_equal(a.response_ids, b.response_ids) or not np.allclose(a.logprobs, b.logprobs, atol=1e-4)
                  for a, b in zip(seeing, blind))
    assert differs
    assert _max_gap(model, proc, seeing) <= 1e-4
    assert _max_gap(model, proc, blind) > 1e-4


def test_finish_reasons_and_lengths():
    proc, model = processor_for("qwen3_vl"), model_for("qwen3_vl")
    prompts = _prompts(proc)
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=3))
    for g in gens:
        for c in g.completions:
            assert len(c.token_ids) <= 3 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason == ("stop" if c.token_ids[-1] in (555, 553) else "length")


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_with_an_image_appended_in_turn_2_is_consistent(family):
    """VRAG-style loop: generate, append the response and a tool turn carrying a new image,
    generate again; the final row's teacher-forced logprobs on both responses equal the
    generation-time logprobs."""
    from mmpipe.rollout.multiturn_batch import MultiTurnBatch

    proc, model = processor_for(family), model_for(family)
    raws = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the answer."}]}],
         "images": [testing.tiny_image(50, 60, seed=1)]},
        {"messages": [{"role": "user", "content": "Search for a picture of a cat."}]},
    ]
    mt = MultiTurnBatch.start(raws, proc)
    rollout_lps = multiturn_logprobs(mt, TransformersEngine(model, proc), 2, 5, lambda turn, i: None if turn else (
        [{"type": "text", "text": "Result: "}, {"type": "image"}], [testing.tiny_image(40, 44, seed=10 + i)]))
    rows = mt.rows()
    assert [r.num_images for r in rows] == [2, 1]
    batch = mmpipe.Collator(proc, padding_side="left")(rows)
    # appended closers (<|im_end|> after a cut reply) carry no label, so lengths agree
    assert_logprobs_match(policy_logprobs(model, batch), [np.concatenate(rollout_lps[b]) for b in range(len(rows))],
                          atol=1e-4)
