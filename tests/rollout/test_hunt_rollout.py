"""RL rollout surfaces under what RL users bring: long temperature-1.0 generations with mixed
image counts (labels, positions, rollout/training logprob gap), agent loops whose tool returns
an image mid-conversation, and bad inputs (engine outputs of the wrong shape or type, bad
sampling settings, bad response ids, a token budget below every prompt) -> typed errors."""

from __future__ import annotations

import asyncio
import numpy as np
import pytest

import mmpipe
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError, ParseError
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.records.trajectory import ToolCall
from mmpipe.rollout import AgentLoop, MultiTurnBatch, TransformersEngine, append_response, logprob_gaps, start, unbatch_rollout
from mmpipe.testing import tiny_image
from mmpipe.testing.invariants import assert_row_positions, logprob_gap, policy_logprobs

from conftest import model_for, processor_for
from helpers import prompt_rows

IGNORE = mmpipe.IGNORE_INDEX


@pytest.fixture(scope="module")
def qwen():
    return processor_for("qwen2_vl"), model_for("qwen2_vl")


@pytest.fixture(scope="module")
def prompts(qwen):
    return prompt_rows(qwen[0], (1, 0, 2), vary_length=True)


def _gens(*completions):
    """One Generation per completion list, in prompt order."""
    return [Generation(prompt_index=i, completions=list(cs)) for i, cs in enumerate(completions)]


# ---- long sampled rollouts -> policy batch ----------------------------------------------------
def test_long_sampled_group_policy_batch(qwen, prompts):
    """n=2 at temperature 1.0, 120 tokens, prompts with 1/0/2 images: every sample's labels are
    exactly its response, positions continue the rule, and the teacher-forced logprobs equal the
    engine's under both paddings (measured 9.5e-7)."""
    proc, model = qwen
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=120, n=2, temperature=1.0, seed=0))
    samples = unbatch_rollout(prompts, gens, processor=proc)
    assert len(samples) == 6 and {s.finish_reason for s in samples} <= {"stop", "length"}
    for s in samples:
        row, R = s.to_row(), len(s.response_ids)
        assert (row.labels[:-R] == IGNORE).all() and (row.labels[-R:] == s.response_ids).all()
        assert len(s.logprobs) == R
        assert_row_positions(row)
    for side in ("left", "right"):
        batch = mmpipe.collate([s.to_row() for s in samples], processor=proc, padding_side=side)
        assert int((np.asarray(batch.labels) != IGNORE).sum()) == sum(len(s.response_ids) for s in samples)
        assert logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples]) <= 1e-4


def test_agent_loop_image_tool_long_sampling(qwen):
    """A tool returning an image every turn, 100 sampled tokens per reply: each turn adds one
    image, and rollout logprobs equal teacher forcing of the final rows (measured 9.5e-7)."""
    proc, model = qwen
    raw = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
            "images": [tiny_image(48, 64, seed=1)]}]
    loop = AgentLoop(TransformersEngine(model, proc), proc, {"look": lambda: ("here:", [tiny_image(40, 56, seed=5)])},
                     parser=lambda text: [ToolCall("look", {}, "look")], max_turns=3)
    trajs = loop.run(raw, SamplingParams(max_new_tokens=100, n=2, temperature=1.0, seed=0))
    assert [t.row.num_images for t in trajs] == [3, 3] and {t.finish_reason for t in trajs} == {"max_turns"}
    assert logprob_gaps(model, trajs, proc).max() <= 1e-4


# ---- engine outputs handed to unbatch_rollout -------------------------------------------------
def test_unbatch_refuses_logprobs_of_another_length(qwen, prompts):
    """Old: 3 ids with 1 logprob became a sample whose logprobs pair with the wrong tokens."""
    gens = _gens([Completion([5, 6, 7], [-0.1])], [], [])
    with pytest.raises(InputError, match="one logprob per token id") as e:
        unbatch_rollout(prompts, gens, processor=qwen[0])
    assert (e.value.row, e.value.column, e.value.stage) == (0, "logprobs", "rollout")


@pytest.mark.parametrize("ids", [[1.5, 2.7], [-5], ["a"], [None]], ids=["float", "negative", "str", "none"])
def test_unbatch_refuses_ids_that_are_not_token_ids(qwen, prompts, ids):
    """Old: floats floored to ints, -5 kept (out of the embedding later), a str a raw ValueError."""
    gens = _gens([], [Completion(ids, None)], [])
    with pytest.raises(InputError) as e:
        unbatch_rollout(prompts, gens, processor=qwen[0])
    assert (e.value.row, e.value.column, e.value.stage) == (1, "token_ids", "rollout")
    assert "prompt 1, sample 0" in str(e.value)


def test_unbatch_keeps_empty_and_high_ids(qwen, prompts):
    """An empty response and ids past the tokenizer (inside a padded embedding) are legal."""
    samples = unbatch_rollout(prompts, _gens([Completion([], [])], [Completion([10_000], [-1.0])], []), processor=qwen[0])
    assert [len(s.response_ids) for s in samples] == [0, 1]


@pytest.mark.parametrize("gens", [None, [{"completions": []}] * 3], ids=["none", "dicts"])
def test_unbatch_refuses_non_generations(prompts, gens):
    with pytest.raises(ArgumentError, match="Generation"):
        unbatch_rollout(prompts, gens)


def test_unbatch_refuses_rows_of_another_family(qwen, prompts):
    """Old: qwen2_vl rows unbatched with a qwen3_vl processor passed silently."""
    with pytest.raises(FamilyMismatchError) as e:
        unbatch_rollout(prompts, _gens([], [], []), processor=processor_for("qwen3_vl"))
    assert e.value.row == 0 and e.value.column == "family"


# ---- sampling settings ------------------------------------------------------------------------
@pytest.mark.parametrize("params", [
    {"max_new_tokens": 3}, SamplingParams(n=0), SamplingParams(max_new_tokens=0), SamplingParams(stop_token_ids=("</s>",))],
    ids=["dict", "n0", "max_new_tokens0", "stop-string"])
def test_engine_refuses_bad_sampling_params(qwen, prompts, params):
    """Old: AttributeError / 'collate got an empty list' / transformers ValueError / TypeError."""
    with pytest.raises(ArgumentError, match="SamplingParams"):
        TransformersEngine(qwen[1], qwen[0]).generate(prompts, params)


_BAD_VALUES = [dict(temperature=-1.0), dict(temperature=float("nan")), dict(temperature="1"), dict(top_p=0.0),
               dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5), dict(seed="0"), dict(max_new_tokens=2.5)]
_BAD_IDS = ["temperature-1", "temperature-nan", "temperature-str", "top_p0", "top_p1.5", "top_k-1", "top_k2.5",
            "seed-str", "max_new_tokens2.5"]


@pytest.mark.parametrize("kw", _BAD_VALUES, ids=_BAD_IDS)
def test_every_engine_refuses_bad_sampling_values(qwen, prompts, kw):
    """Old: a negative temperature and top_p=0 sampled greedily in transformers without a word
    (vLLM refuses the first and keeps no token for the second); the vLLM engine and the
    OpenAI-wire engine passed every value on unchecked. One rule now, for every engine."""
    from mmpipe.rollout.openai_engine import OpenAIEngine
    from mmpipe.rollout.vllm_engine import VLLMEngine

    params = SamplingParams(**kw)
    with pytest.raises(ArgumentError, match="SamplingParams the engine cannot run") as e:
        TransformersEngine(qwen[1], qwen[0]).generate(prompts, params)
    assert next(iter(kw)) in str(e.value)
    llm = type("LLM", (), {"generate": lambda self, *a, **k: []})()
    with pytest.raises(ArgumentError, match="SamplingParams the engine cannot run"):
        VLLMEngine(llm, processor=qwen[0], sampling_params_factory=dict).generate(prompts, params)
    engine = OpenAIEngine("http://127.0.0.1:9/v1", model="m", processor=qwen[0])
    with pytest.raises(ArgumentError, match="SamplingParams the engine cannot run"):
        asyncio.run(engine.generate(prompts, params))


def test_engines_return_nothing_for_no_rows(qwen):
    """Old: generate([]) raised collate's 'got an empty list' (a filtered-out step is empty)."""
    from mmpipe.rollout.vllm_engine import VLLMEngine

    assert TransformersEngine(qwen[1], qwen[0]).generate([], SamplingParams()) == []
    llm = type("LLM", (), {"generate": lambda self, *a, **k: []})()
    assert VLLMEngine(llm, processor=qwen[0], sampling_params_factory=dict).generate([], SamplingParams()) == []


# ---- multi-turn ------------------------------------------------------------------------------
@pytest.mark.parametrize("ids", ["hello", [-1], [None], [3.7]], ids=["str", "negative", "none", "float"])
def test_append_response_refuses_bad_ids(qwen, ids):
    """Old: ValueError / OverflowError / TypeError, and 3.7 silently appended as id 3."""
    conv = start({"messages": [{"role": "user", "content": "hi"}]}, qwen[0])
    with pytest.raises(ParseError) as e:
        append_response(conv, ids)
    assert e.value.column == "token_ids" and e.value.stage == "rollout"


def test_multiturn_batch_start_refuses_non_list(qwen):
    with pytest.raises(ArgumentError, match="list of raw rows"):
        MultiTurnBatch.start(None, qwen[0])


class _NeverCalled:
    def generate(self, rows, params):
        raise AssertionError("no trajectory has room for a reply: the engine must not be called")


def test_agent_loop_every_prompt_over_budget(qwen):
    """max_tokens below every prompt: old run() leaked StopIteration (arun: RuntimeError); now
    each trajectory ends 'max_tokens' with no turns and no labels."""
    raw = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
            "images": [tiny_image(48, 64, seed=1)]}]
    loop = AgentLoop(_NeverCalled(), qwen[0], max_tokens=10)
    for trajs in (loop.run(raw, SamplingParams(n=2, temperature=1.0)),
                  asyncio.run(loop.arun(raw, SamplingParams(n=2, temperature=1.0)))):
        assert [(t.finish_reason, len(t.turns)) for t in trajs] == [("max_tokens", 0)] * 2
        assert all((t.row.labels == IGNORE).all() for t in trajs)


# ---- data-parallel padding ----------------------------------------------------------------------
@pytest.mark.parametrize("n_real", [-1, 2.7, 0], ids=["negative", "float", "zero"])
def test_trim_refuses_bad_n_real(n_real):
    """Old: trim(outputs, -1) returned outputs[:-1] (a real row dropped), 2.7 floored to 2, 0 gave []."""
    from mmpipe.rollout import trim

    with pytest.raises(ArgumentError, match="n_real"):
        trim([Generation(prompt_index=i) for i in range(3)], n_real)


def test_pad_to_multiple_refuses_none():
    from mmpipe.rollout import pad_to_multiple

    with pytest.raises(ArgumentError, match="list of rows"):
        pad_to_multiple(None, 2)
