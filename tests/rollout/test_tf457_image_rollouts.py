"""Guards: TransformersEngine rollouts of image rows on transformers 4.57's model classes
(scripts/envs/tf457.sh). InternVL, LLaVA-OneVision (per-conversation and flat multi-image rows)
and GLM-4.1V under sdpa attention (eager measured equal too): temperature 1.0, up to 32 new tokens, up to three
images a row; the sampled tokens' logprobs == a training forward over the same ids (both
padding sides), and the training rows unbatch to `rollout_rows`'. A multi-turn GLM-4.1V
loop with a tool image each turn is consistent the same way. (Measured gaps <= 1e-6.) A 40-token
draft of this file found 7cad596 (unbatch_rollout without a processor refused a sampled text token
as a LLaVA-OneVision "vision end")."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout import unbatch_rollout
from mmpipe.rollout.multiturn_batch import MultiTurnBatch
from mmpipe.rollout.results import rollout_rows
from mmpipe.rollout.transformers_engine import TransformersEngine, response_logprobs, teacher_forced_logprobs
from mmpipe.testing.invariants import logprob_gap, policy_logprobs

from helpers import multiturn_logprobs

pytestmark = pytest.mark.needs_env("tf457")

IMAGES = [testing.tiny_image(h, w, seed=i) for i, (h, w) in enumerate([(40, 56), (70, 30), (33, 97)])]
CASES = {"internvl": ("internvl", {}), "llava_onevision": ("llava_onevision", {}),
         "llava_onevision_flat": ("llava_onevision", {"images_kwargs": {"multi_image": "flat"}}),
         "glm4v": ("glm4v", {})}


@pytest.mark.parametrize("case", list(CASES))
def test_sampled_logprobs_equal_a_training_forward(case, attn="sdpa"):
    name, kw = CASES[case]
    proc, model = testing.build_processor(name), testing.build_model(name)
    model.set_attn_implementation(attn)
    prompts = [mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}] * n
                                                + [{"type": "text", "text": "describe" + " it" * (3 * k)}]}],
                                  "images": IMAGES[:n]}, proc, labels=False, **kw) for k, n in enumerate((1, 0, 3))]
    gens = TransformersEngine(model, proc).generate(
        prompts, SamplingParams(max_new_tokens=32, n=2, temperature=1.0, seed=3, logprobs=True))
    rows = rollout_rows(prompts, gens, proc)
    lengths = [len(c.token_ids) for g in gens for c in g.completions]
    want = [np.asarray(c.logprobs, np.float32) for g in gens for c in g.completions]
    for side in ("right", "left"):
        tf = teacher_forced_logprobs(model, mmpipe.Collator(proc, padding_side=side)(rows)).numpy()
        got = response_logprobs(tf, rows, lengths, side)
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) < 1e-4
    samples = [s.to_row() for s in unbatch_rollout(prompts, gens)]
    assert [s.diff(r) for s, r in zip(samples, rows)] == [[]] * len(rows)


def test_glm4v_multi_turn_with_tool_images(attn="sdpa"):
    proc, model = testing.build_processor("glm4v"), testing.build_model("glm4v")
    model.set_attn_implementation(attn)
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                       {"type": "text", "text": "Find the answer."}]}],
             "images": IMAGES[:2]},
            {"messages": [{"role": "user", "content": "Search for a picture of a cat."}]}]
    mt = MultiTurnBatch.start(raws, proc)
    lps = multiturn_logprobs(mt, TransformersEngine(model, proc), 3, 24, lambda turn, i: None if turn == 2 else (
        [{"type": "text", "text": "Result: "}, {"type": "image"}],
        [testing.tiny_image(40 + 7 * turn, 44, seed=10 + i + turn)]))
    rows = mt.rows()
    assert [r.num_images for r in rows] == [4, 2]
    for side in ("left", "right"):
        batch = mmpipe.Collator(proc, padding_side=side)(rows)
        assert logprob_gap(policy_logprobs(model, batch), [np.concatenate(lps[b]) for b in range(len(rows))]) < 1e-4
