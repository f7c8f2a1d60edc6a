"""The README's "Rollouts (RL)" example, as written (same calls), at the settings the issue
ran it with: n=8, temperature 1.0, 512 new tokens, on the three tiny families.

Before the vision-token ban, 16 of 48 sampled responses held ``<|image_pad|>`` and the policy
forward crashed ("Image features and image tokens do not match"). Two prompts per family (one
with an image, one without; the README's ``world_size`` is 3 here, so ``pad_to_multiple`` adds
one dummy row that ``trim`` removes): 16 responses per family, 48 in all (the issue's count),
so the file stays under a minute on a 2-core CPU.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.results import unbatch_rollout
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.testing.invariants import assert_logprobs_match, policy_logprobs

from conftest import model_for, processor_for
from helpers import readme_block

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
PARAMS = dict(max_new_tokens=512, n=8, temperature=1.0)


def _raws():
    return [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}],
         "images": [testing.tiny_image(56, 72, seed=3)]},
        {"messages": [{"role": "user", "content": "Count to five."}]},
    ]


def _readme_rollout(family: str) -> dict:
    """Run the README's RL block as written (only its ``family = ...`` line is set per test)."""
    block = readme_block("## Rollouts (RL)")
    line = 'family = "qwen2_vl"'
    assert line in block, "the README block no longer sets the family on one line"
    namespace: dict = {}
    exec(compile(block.replace(line, f'family = "{family}"'), "README.md", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("family", FAMILIES)
def test_readme_rl_example_runs_at_n8_t1_512_tokens(family):
    t0 = time.perf_counter()
    ns = _readme_rollout(family)
    took = time.perf_counter() - t0
    model, proc, samples, policy, out = ns["model"], ns["processor"], ns["samples"], ns["policy"], ns["out"]
    assert "SamplingParams(max_new_tokens=512, n=8, temperature=1.0" in readme_block("## Rollouts (RL)")
    vt = VisionTokens.from_processor(proc)
    assert len(vt.ids) == 4
    assert len(samples) == 2 * 8 and ns["n_real"] == 2 and len(ns["padded"]) == 3
    assert all(len(vt.find(s.response_ids)) == 0 for s in samples), "a response holds a vision token"
    assert torch.isfinite(out.loss)
    gap = assert_logprobs_match(policy_logprobs(model, policy), [s.logprobs for s in samples], atol=1e-4)
    print(f"\n{family}: {len(samples)} responses x <=512 tokens in {took:.1f}s; "
          f"{sum(len(s.response_ids) for s in samples)} tokens; rollout/training logprob gap {gap:.2e}")


@pytest.mark.parametrize("family", FAMILIES)
def test_unconstrained_sampling_emits_vision_tokens_and_to_row_refuses_them(family):
    """The same run with the ban lifted: the tiny models do sample vision tokens (what the issue
    hit), and the README's ``to_row`` now refuses them by name instead of the model crashing."""
    proc, model = processor_for(family), model_for(family)
    engine = TransformersEngine(model, proc)
    vt = VisionTokens.from_processor(proc)
    raws = _raws()
    prompts = [mmpipe.encode_row(raw, proc, labels=False) for raw in raws]
    gens = engine.generate(prompts, SamplingParams(**PARAMS, seed=11, allow_vision_tokens=True))
    samples = unbatch_rollout(prompts, gens, processor=proc)
    hit = [s for s in samples if len(vt.find(s.response_ids))]
    n_tokens = sum(len(vt.find(s.response_ids)) for s in samples)
    kinds = {name: sum(int((s.response_ids == i).sum()) for s in samples) for i, name in zip(vt.ids, vt.names)}
    print(f"\n{family}: unconstrained, {len(hit)} of {len(samples)} responses hold {n_tokens} vision token(s) {kinds}")
    assert hit, "the unconstrained tiny model sampled no vision token: this test shows nothing"
    with pytest.raises(mmpipe.errors.PlaceholderError, match=r"prompt \d, sample \d: the response holds") as e:
        [s.to_row() for s in samples]
    assert e.value.stage == "rollout" and e.value.column == "input_ids"
    # the "mask" policy trains on the rest: no vision token reaches the model, the loss ignores the slots
    masked = unbatch_rollout(prompts, gens, processor=proc, on_vision_token="mask")
    policy = mmpipe.collate([s.to_row() for s in masked], processor=proc, padding_side="right")
    assert not np.isin(policy.input_ids[policy.mm_token_type_ids == 0].numpy(), vt.pad_ids).any()
    assert torch.isfinite(model(**policy.model_inputs(model.device)).loss)
    assert sum(int((s.response_mask == 0).sum()) for s in masked) == n_tokens
