"""Agent loops fed what sampling engines really return (hunt): every reply the loop appends is
checked as the other rollout routes check one (`mmpipe.rollout.results`): ids that are not
integers >= 0, a stop id before the last token (an engine's padded output, text sampled past
``<|im_end|>``, the completion's own int ``stop_reason``), logprobs that are NaN, infinite,
above 0, vLLM's ``{id: Logprob}`` dicts, or of another length than the ids are a typed error
naming prompt and sample, never a turn trained on or a bare TypeError."""

from __future__ import annotations

import numpy as np
import pytest

from mmpipe.errors import InputError
from mmpipe.records.generation import Completion, Generation
from mmpipe.rollout.agent import AgentLoop

from conftest import processor_for

QUESTION = {"messages": [{"role": "user", "content": "question 0"}]}


class FixedEngine:
    """Our test double: every row gets this completion (only row ``only`` when given; the others
    a clean one-token reply)."""

    def __init__(self, ids, logprobs=None, finish_reason="stop", stop_reason=None, only=None, clean=None):
        self.completion = Completion(list(ids), logprobs, finish_reason, stop_reason)
        self.only, self.clean = only, clean

    def generate(self, rows, params):
        return [Generation(i, [self.completion if self.only in (None, i) else self.clean]) for i in range(len(rows))]


@pytest.fixture(scope="module")
def reply():
    """(processor, a plain reply's ids, <|im_end|> id, pad id)."""
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    return proc, tok("The answer.", add_special_tokens=False)["input_ids"], tok.convert_tokens_to_ids("<|im_end|>"), \
        tok.pad_token_id


def run(proc, engine, prompts=(QUESTION,)):
    return AgentLoop(engine, proc).run(list(prompts))


def test_clean_reply_is_kept(reply):
    proc, ans, end, _ = reply
    lps = [-0.5] * (len(ans) + 1)
    t = run(proc, FixedEngine(ans + [end], lps))[0]
    assert t.finish_reason == "stop" and t.turns[0].token_ids.tolist() == ans + [end]
    assert np.allclose(t.logprobs, lps)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 2.0])
def test_bad_logprob_values_are_refused(reply, bad):
    """NaN / inf / > 0 logprobs were appended as the turn's logprobs (one NaN poisons every
    importance ratio of the batch)."""
    proc, ans, end, _ = reply
    lps = [-0.5] * len(ans) + [bad]
    with pytest.raises(InputError, match=r"prompt 1, sample 0.*finite log-probabilities") as info:
        run(proc, FixedEngine(ans + [end], lps, only=1, clean=Completion([end], [-0.1], "stop")), [QUESTION] * 2)
    assert "engine row 1 is prompt 1, sample 0, turn 0" in "".join(info.value.__notes__)


def test_logprobs_of_another_length_are_refused(reply):
    """Three logprobs for four ids were kept as the turn's logprobs: `Trajectory.logprobs` no
    longer lined up with the labelled tokens."""
    proc, ans, end, _ = reply
    with pytest.raises(InputError, match=r"one logprob per token id \(4\).*found 3 logprobs"):
        run(proc, FixedEngine(ans + [end], [-0.5] * 3))


def test_vllm_logprob_dicts_are_a_typed_error(reply):
    """vLLM's per-position ``{token_id: Logprob}`` dicts raised a bare TypeError."""
    proc, ans, end, _ = reply
    with pytest.raises(InputError, match=r"one float per sampled token.*\.logprob"):
        run(proc, FixedEngine(ans + [end], [{t: -0.5} for t in ans + [end]]))


def test_float_ids_are_refused(reply):
    """Float ids were floored into other tokens (271.7 -> 271) and trained on."""
    proc, ans, end, _ = reply
    with pytest.raises(InputError, match=r"prompt 0, sample 0: sampled token ids.*integer token ids"):
        run(proc, FixedEngine([t + 0.7 for t in ans] + [end]))


@pytest.mark.parametrize("tail", ["pad", "text"])
def test_stop_before_the_end_is_refused_naming_prompt_and_sample(reply, tail):
    proc, ans, end, pad = reply
    ids = ans + [end] + ([pad] * 5 if tail == "pad" else ans + [end])
    with pytest.raises(InputError, match=r"prompt 0, sample 0: a sampled response.*position 3"):
        run(proc, FixedEngine(ids))


def test_own_stop_reason_before_the_end_is_refused(reply):
    """A completion whose int ``stop_reason`` (the stop id the engine stopped on, e.g. one of
    ``stop_token_ids``) sits before its last token was appended whole."""
    proc, ans, end, _ = reply
    with pytest.raises(InputError, match=r"stop id %d at response position 1" % ans[1]):
        run(proc, FixedEngine(ans + [end], stop_reason=ans[1]))


# ---- the model's context -----------------------------------------------------------------
def test_trajectories_end_at_the_engine_context_instead_of_failing_the_batch():
    """VRAG-style: each tool turn adds an image; with no ``max_tokens`` the conversations grow
    past the model's context. `TransformersEngine` then refused the prompt (InputError "row 0",
    the running trajectory's index, not the prompt's) and the whole batch of trajectories was
    lost; now each ends ("max_tokens") within the context and stays a valid row."""
    from mmpipe import testing
    from mmpipe.records.generation import SamplingParams
    from mmpipe.records.trajectory import ToolCall
    from mmpipe.rollout.async_engine import AsyncTransformersEngine
    from mmpipe.rollout.transformers_engine import TransformersEngine

    proc = processor_for("qwen2_vl")
    model = testing.build_model("qwen2_vl")  # its own copy: the context is shortened below
    model.config.text_config.max_position_embeddings = 160
    engine = TransformersEngine(model, proc)

    def search(q):
        return "found:", [testing.tiny_image(56, 56, seed=1)]

    def every_reply_calls(text):
        return [ToolCall("search", {"q": "x"}, text)]

    loop = AgentLoop(engine, proc, {"search": search}, parser=every_reply_calls, max_turns=40)
    trajs = loop.run([QUESTION, {**QUESTION, "messages": [{"role": "user", "content": "a longer question 1"}]}],
                     SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    for t in trajs:
        assert t.finish_reason in ("max_tokens", "vision_token") and t.row.num_tokens <= 160, t
        t.row.validate()
    assert sum(t.finish_reason == "max_tokens" and t.row.num_images >= 2 for t in trajs) >= 1
    from mmpipe.rollout.sampling import engine_context

    assert engine_context(engine) == engine_context(AsyncTransformersEngine(model, proc)) == 160
    assert loop.token_budget == 160 and AgentLoop(engine, proc, max_tokens=100).token_budget == 100


def test_engine_error_names_the_trajectory(reply):
    """An engine's InputError names its row in the engine call (the k-th running trajectory):
    the loop adds which prompt, sample and turn that is."""
    proc, ans, end, _ = reply
    tok = proc.tokenizer
    call = tok('<tool_call>{"name": "t", "arguments": {}}</tool_call>', add_special_tokens=False)["input_ids"]

    class FailsOnTurnTwo:
        def generate(self, rows, params):
            if any("tool_call" in tok.decode(r.input_ids.tolist()) for r in rows):
                raise InputError("a rollout prompt", row=0, column="input_ids", stage="rollout", expected="x", found="y")
            return [Generation(i, [Completion((ans if i == 0 else call) + [end], None, "stop")]) for i in range(len(rows))]

    with pytest.raises(InputError) as info:
        AgentLoop(FailsOnTurnTwo(), proc, {"t": lambda: "ok"}).run([QUESTION, QUESTION])
    assert "engine row 0 is prompt 1, sample 0, turn 1" in "".join(info.value.__notes__)


# ---- chat-completions servers re-tokenize text ---------------------------------------------
def test_openai_engine_refuses_rows_whose_sampled_ids_the_server_would_retokenize():
    """A sampled reply's ids are often not the tokenizer's encoding of its text (byte-wise
    ``h,e,l,l,o`` where the vocabulary has merges). The request carried the decoded text; the
    server re-tokenized it (59 reply ids -> 30) and generated from another prompt than the
    training row's: vLLM reported a prompt mismatch telling the user to "serve the checkpoint the
    rows were encoded with", a text-only server nothing. Now the request is refused before it
    is sent, naming the prompt and the ids, and a canonical row still goes through."""
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.multiturn import append_observation, append_response, start
    from mmpipe.rollout.openai_engine import request_body

    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    text = "hello, the answer is yellow"
    bytewise = [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert tok.decode(bytewise) == text and len(tok(text, add_special_tokens=False)["input_ids"]) < len(bytewise)
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]}],
           "images": [_image()]}
    for ids, ok in ((tok(text, add_special_tokens=False)["input_ids"], True), (bytewise, False)):
        conv = append_observation(append_response(start(raw, proc), ids), "more?")
        if ok:
            body = request_body(conv.row, SamplingParams(), model="m", processor=proc, index=3)
            parts = [p for p in body["messages"][0]["content"] if p["type"] == "text"]
            assert "".join(p["text"] for p in parts).count(text) == 1
            continue
        with pytest.raises(InputError, match=r"prompt 3: a server prompt's text.*re-tokenize.*VLLMEngine"):
            request_body(conv.row, SamplingParams(), model="m", processor=proc, index=3)
        for server in ("vllm", "transformers"):  # the caller's choice: check_ids=False sends it as before
            request_body(conv.row, SamplingParams(allow_vision_tokens=True), model="m", processor=proc,
                         server=server, check_ids=False)


def _image():
    from mmpipe.testing import tiny_image

    return tiny_image(56, 56, seed=4)


def test_run_inside_an_event_loop_points_to_arun(reply):
    """``loop.run`` with an async engine from a running event loop (Jupyter, an async trainer)
    raised asyncio's bare RuntimeError and left the engine's coroutine never awaited."""
    import asyncio
    import warnings

    proc, _, end, _ = reply

    class Async:
        async def generate(self, rows, params):
            return [Generation(i, [Completion([end], None, "stop")]) for i in range(len(rows))]

    async def inside():
        with pytest.raises(ValueError, match=r"await loop.arun"):
            AgentLoop(Async(), proc).run([QUESTION])
        return (await AgentLoop(Async(), proc).arun([QUESTION]))[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        assert asyncio.run(inside()).finish_reason == "stop"


def test_engine_context_of_vllm_shaped_engines():
    """``vllm.LLM`` keeps ``max_model_len`` in ``llm_engine.model_config``, ``AsyncLLM`` in
    ``model_config``; an HTTP engine names none."""
    from types import SimpleNamespace as NS

    from mmpipe.rollout.sampling import engine_context
    from mmpipe.rollout.async_engine import AsyncVLLMEngine, ThreadedEngine
    from mmpipe.rollout.openai_engine import OpenAIEngine
    from mmpipe.rollout.vllm_engine import VLLMEngine

    proc = processor_for("qwen2_vl")
    llm = NS(llm_engine=NS(model_config=NS(max_model_len=2048)), generate=lambda *a: [])
    kw = dict(processor=proc, sampling_params_factory=dict)  # no vLLM here: params as a dict
    assert engine_context(VLLMEngine(llm, **kw)) == engine_context(ThreadedEngine(VLLMEngine(llm, **kw))) == 2048
    assert engine_context(AsyncVLLMEngine(NS(model_config=NS(max_model_len=512), generate=lambda *a: []), **kw)) == 512
    assert engine_context(OpenAIEngine("http://127.0.0.1:1/v1", "m", processor=proc)) is None
