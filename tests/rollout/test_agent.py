"""The agent loop: tool calls with 0/1/2 images per call, error turns, budgets, concurrency;
final rows equal a from-scratch encode of the whole conversation (ids, positions, grids,
pixels, labels = the model's tokens only), and rollout logprobs equal teacher forcing."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

import mmpipe
from mmpipe.batching.collate import collate
from mmpipe.offline.chat_templates import QWEN2_VL_CHAT_TEMPLATE
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.trajectory import ToolCall
from mmpipe.rollout.agent import AgentLoop, logprob_gaps, run_agent
from mmpipe.rollout.tool_calls import parse_qwen_tool_calls, tool_role_of
from mmpipe.rollout.transformers_engine import TransformersEngine, teacher_forced_logprobs
from mmpipe.testing import invariants, tiny_image

from conftest import model_for, processor_for

IGNORE = mmpipe.IGNORE_INDEX
LONG = SamplingParams(max_new_tokens=256)


def call(name, **args):
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


# Trajectory k's replies, turn by turn (the engine finds k from "question k" in the prompt).
SCRIPTS = {
    0: [call("search", q="one"), "Let me look again. " + call("search", q="two"), "It is a cat."],
    1: [call("search", q="none"), '<tool_call>{"name": "search", "arguments": {q: }}</tool_call>',
        call("nope") + call("boom", x=1), "Done."],
    2: ["Plain answer."],
    3: [call("search", q="two") + call("search", q="one"), "Three pictures seen."],
}


def search(q):
    """0, 1 or 2 images per call, as text, a (text, images) pair or a list."""
    if q == "none":
        return f"no pictures of {q}"
    if q == "one":
        return f"one picture of {q}:", [tiny_image(40, 60, seed=1)]
    return [f"two pictures of {q}:", tiny_image(64, 48, seed=2), " and ", tiny_image(56, 56, seed=3)]


def boom(x):
    raise RuntimeError(f"tool broke on {x}")


TOOLS = {"search": search, "boom": boom}


class ScriptedEngine:
    """Our test double of a `RolloutEngine`: replies from SCRIPTS as token ids (+ <|im_end|>),
    logprobs from a teacher-forced forward of prompt + reply (None without a model)."""

    def __init__(self, processor, model=None, scripts=SCRIPTS):
        self.processor, self.model, self.scripts = processor, model, scripts
        self.tok = processor.tokenizer
        self.batch_sizes = []

    def reply_ids(self, row):
        text = self.tok.decode(row.input_ids.tolist())
        k = int(re.search(r"question (\d+)", text).group(1))
        turn = text.count("<|im_start|>assistant") - 1
        return self.tok(self.scripts[k][turn], add_special_tokens=False)["input_ids"] + [
            self.tok.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, rows, params):
        self.batch_sizes.append(len(rows))
        replies = [self.reply_ids(r) for r in rows]
        lps = [None] * len(rows)
        if self.model is not None:
            full = [RolloutSample(r, 0, 0, np.asarray(ids), None, "stop").to_row() for r, ids in zip(rows, replies)]
            lp = teacher_forced_logprobs(self.model, collate(full, processor=self.processor, padding_side="right"))
            lps = [lp[b, f.num_tokens - len(ids):f.num_tokens].tolist() for b, (f, ids) in enumerate(zip(full, replies))]
        m = params.max_new_tokens
        return [Generation(i, [Completion(ids[:m], None if lp is None else lp[:m], "stop" if len(ids) <= m else "length")])
                for i, (ids, lp) in enumerate(zip(replies, lps))]


def question(k, n_images=1):
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"question {k}: what is it?"}]
    return {"messages": [{"role": "user", "content": content}],
            "images": [tiny_image(48, 48, seed=10 + k + j) for j in range(n_images)]}


def expected_conversation(k, traj):
    """The whole conversation built from the script and the tools themselves (error texts
    from the trajectory), roles "tool", assistant content = the raw reply text."""
    raw = question(k)
    msgs, images = list(raw["messages"]), list(raw["images"])
    for turn, reply in zip(traj.turns, SCRIPTS[k]):
        msgs.append({"role": "assistant", "content": reply})
        for c, out, err in zip(turn.tool_calls, turn.tool_outputs, turn.tool_errors):
            if err:
                msgs.append({"role": "tool", "content": out})
                continue
            result = search(**c.arguments)
            items = [result] if isinstance(result, str) else (
                [result[0], *result[1]] if isinstance(result, tuple) else result)
            ims = [x for x in items if not isinstance(x, str)]
            images += ims
            msgs.append({"role": "tool", "content": items[0] if not ims else
                         [{"type": "text", "text": x} if isinstance(x, str) else {"type": "image"} for x in items]})
    return {"messages": msgs, "images": images}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_scripted_loop_equals_whole_encode(family):
    """4 trajectories (2 finish early), calls with 0/1/2 images, bad JSON, unknown tool, a
    raising tool: one engine call per turn over the running ones; every final row equals
    encode_row of the whole conversation; batch logits and logprobs equal the from-scratch
    rows' and the engine's."""
    proc, model = processor_for(family), model_for(family)
    engine = ScriptedEngine(proc, model)
    loop = AgentLoop(engine, proc, TOOLS, max_turns=8)
    trajs = loop.run([question(k) for k in range(4)], LONG)
    assert loop.engine_calls == 4 and engine.batch_sizes == [4, 3, 2, 1]
    assert [t.num_turns for t in trajs] == [3, 4, 1, 2] and {t.finish_reason for t in trajs} == {"stop"}
    assert [t.row.num_images for t in trajs] == [4, 1, 1, 4]
    errors = [o for t in trajs for turn in t.turns for o, e in zip(turn.tool_outputs, turn.tool_errors) if e]
    assert len(errors) == 3 and "not valid JSON" in errors[0] and "unknown tool 'nope'" in errors[1]
    assert "RuntimeError: tool broke on 1" in errors[2]
    scratch = [mmpipe.encode_row(expected_conversation(k, t), proc) for k, t in enumerate(trajs)]
    invariants.assert_rows_equal([t.row for t in trajs], scratch, what="the agent loop")
    for t in trajs:
        t.row.validate()
        assert np.array_equal(t.row.labels != IGNORE, t.response_mask.astype(bool))
        assert np.array_equal(t.row.labels[t.response_mask == 1], np.concatenate([x.token_ids for x in t.turns]))
        invariants.assert_row_positions(t.row, model=model)
    batch = invariants.assert_roundtrip([t.row for t in trajs], processor=proc, padding_side="left")
    refs = [collate([r], processor=proc).model_inputs() for r in scratch]
    invariants.assert_batched_logits_match(model, [t.row for t in trajs], proc, batch=batch, references=refs)
    train = invariants.policy_logprobs(model, batch)
    invariants.assert_logprobs_match(train, [t.logprobs for t in trajs], atol=1e-4)
    assert np.nanmax(logprob_gaps(model, trajs, proc)) < 1e-4


def test_every_turn_is_a_valid_row():
    """Image tokens == image features at every turn: each prompt the engine receives validates
    and runs through the model. Tools on threads, and an async engine (``run`` and ``arun``),
    give the same rows."""
    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")

    class Checking(ScriptedEngine):
        def generate(self, rows, params):
            for r in rows:
                r.validate()
            invariants.assert_batched_logits_match(model, rows, proc)
            return super().generate(rows, params)

    trajs = run_agent([question(0), question(3)], Checking(proc), proc, TOOLS, LONG)
    assert [t.row.num_images for t in trajs] == [4, 4]
    threaded = run_agent([question(0), question(3)], ScriptedEngine(proc), proc, TOOLS, LONG, tool_workers=3)
    invariants.assert_rows_equal([t.row for t in threaded], [t.row for t in trajs], what="threaded tools")

    class Async(ScriptedEngine):  # an AsyncRolloutEngine: generate is a coroutine
        async def generate(self, rows, params):
            return ScriptedEngine.generate(self, rows, params)

    sync_loop, async_loop = AgentLoop(Async(proc), proc, TOOLS), AgentLoop(Async(proc), proc, TOOLS)
    by_run = sync_loop.run([question(0), question(3)], LONG)
    by_arun = asyncio.run(async_loop.arun([question(0), question(3)], LONG))
    assert sync_loop.engine_calls == async_loop.engine_calls == 3
    for got in (by_run, by_arun):
        invariants.assert_rows_equal([t.row for t in got], [t.row for t in trajs], what="an async engine")


def test_budgets():
    proc = processor_for("qwen2_vl")
    engine = ScriptedEngine(proc)
    t = AgentLoop(engine, proc, TOOLS, max_turns=2).run([question(0)])[0]
    assert (t.finish_reason, t.num_turns, t.row.num_images) == ("max_turns", 2, 2)
    assert t.turns[-1].tool_outputs == ()  # the last reply's call is not run
    assert t.row.input_ids[-2:].tolist() == proc.tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    t = AgentLoop(engine, proc, TOOLS, max_images=3).run([question(0)])[0]
    assert (t.finish_reason, t.num_turns, t.row.num_images) == ("max_images", 2, 2)
    t = AgentLoop(engine, proc, TOOLS, max_images=0).run([question(0, n_images=0)])[0]
    assert (t.finish_reason, t.row.num_images) == ("max_images", 0)
    first = AgentLoop(engine, proc, TOOLS).run([question(1)])[0]
    for budget in (first.turns[0].span[1] - 5, first.turns[1].span[0] + 3, first.row.num_tokens - 2):
        t = AgentLoop(engine, proc, TOOLS, max_tokens=budget).run([question(1)])[0]
        assert t.finish_reason == "max_tokens" and t.row.num_tokens <= budget, (budget, t)
        t.row.validate()
        assert np.array_equal(t.row.labels != IGNORE, t.response_mask.astype(bool))
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        AgentLoop(engine, proc, TOOLS, max_turns=0)


def test_sampled_vision_token_is_cut_and_ends_the_trajectory():
    proc = processor_for("qwen3_vl")
    scripts = {0: [call("search", q="one"), "a cat <|image_pad|> more"], 1: ["<|vision_start|>x"]}
    t, first = run_agent([question(0), question(1)], ScriptedEngine(proc, scripts=scripts), proc, TOOLS)
    assert t.finish_reason == "vision_token" and t.turns[-1].text == "a cat "
    assert first.finish_reason == "vision_token" and first.num_model_tokens == 0 and first.turns[0].text == ""
    for r in (t.row, first.row):
        r.validate()
        assert int((r.mm_token_type_ids == 1).sum()) == r.fam.num_tokens(r.image_grid_thw)
    assert t.row.num_images == 2


def test_template_without_tool_role_falls_back_to_user_turns():
    """A template that drops 'tool' messages: results go in a user turn inside
    <tool_response> tags, and the row still equals the whole encode."""
    proc = processor_for("qwen2_vl")
    template = QWEN2_VL_CHAT_TEMPLATE.replace("{% for message in messages %}",
                                              "{% for message in messages if message['role'] != 'tool' %}")
    opts = dict(chat_template_kwargs={"chat_template": template})
    trajs = run_agent([question(0), question(3)], ScriptedEngine(proc), proc, TOOLS, LONG, **opts)
    assert tool_role_of(mmpipe.Encoder(proc, **opts)) == "user" and tool_role_of(mmpipe.Encoder(proc)) == "tool"
    assert [m["role"] for m in trajs[0].messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    two_calls = trajs[1].messages[2]["content"]  # one user turn, one tag pair per call
    assert "".join(x.get("text", "<img>") for x in two_calls) == (
        "<tool_response>\ntwo pictures of two:<img> and <img>\n</tool_response>\n"
        "<tool_response>\none picture of one:<img>\n</tool_response>")
    assert trajs[1].row.num_images == 4
    invariants.assert_rows_equal([t.row for t in trajs], [mmpipe.encode_row(t.to_raw_row(), proc, **opts) for t in trajs])


def test_tool_specs_reach_the_template():
    proc = processor_for("qwen3_vl")
    specs = [{"type": "function", "function": {"name": "search", "description": "image search",
                                                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    t = run_agent([question(0)], ScriptedEngine(proc), proc, TOOLS, LONG, tool_specs=specs)[0]
    assert '"name": "search"' in proc.tokenizer.decode(t.row.input_ids[:t.turns[0].span[0]].tolist())
    opts = dict(chat_template_kwargs={"tools": specs})
    invariants.assert_rows_equal([t.row], [mmpipe.encode_row(expected_conversation(0, t), proc, **opts)])
    in_row = run_agent([{**question(0), "tools": specs}], ScriptedEngine(proc), proc, TOOLS, LONG)[0]  # a tools column
    assert in_row.tools == specs and in_row.to_raw_row()["tools"] == specs
    invariants.assert_rows_equal([in_row.row, mmpipe.encode_row(in_row.to_raw_row(), proc)], [t.row, t.row])


def test_parser():
    calls = parse_qwen_tool_calls('x <tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>'
                                  '<tool_call>[1]</tool_call><tool_call>{"name": "b", "arguments": 3}</tool_call>'
                                  '<tool_call>{"name": "c"')
    assert [(c.name, c.arguments, c.ok) for c in calls] == [("a", {"k": 1}, True), (None, {}, False),
                                                            ("b", {}, False), (None, {}, False)]
    assert "not closed" in calls[-1].error and parse_qwen_tool_calls("final answer") == []


def _runs(labels):
    on = np.concatenate([[0], (labels != IGNORE).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(on))
    return list(zip(edges[::2], edges[1::2]))


def assert_equal_up_to_reply_tokenization(row, scratch, tok):
    """``row`` (replies as sampled) vs ``scratch`` (the whole conversation encoded, replies
    re-tokenized from their text): same images, grids and pixels; the same ids, token types
    and (shifted) positions between the replies; each reply decodes to the same text."""
    assert np.array_equal(row.image_grid_thw, scratch.image_grid_thw)
    assert np.array_equal(row.pixel_values_u8, scratch.pixel_values_u8)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    got, want = _runs(row.labels), _runs(scratch.labels)
    assert len(got) == len(want)
    a_prev = b_prev = 0
    for (a0, a1), (b0, b1) in zip(got + [(row.num_tokens,) * 2], want + [(scratch.num_tokens,) * 2]):
        if b1 > b0 and scratch.input_ids[b1 - 1] == eos and row.input_ids[a1 - 1] != eos:
            b1 -= 1  # a reply cut before <|im_end|>: the loop closes it unlabelled, the whole encode labels it
        seg_a, seg_b = slice(a_prev, a0), slice(b_prev, b0)
        assert np.array_equal(row.input_ids[seg_a], scratch.input_ids[seg_b])
        assert np.array_equal(row.mm_token_type_ids[seg_a], scratch.mm_token_type_ids[seg_b])
        assert np.array_equal(row.position_ids[:, seg_a] - (a_prev - b_prev), scratch.position_ids[:, seg_b])
        assert tok.decode(row.input_ids[a0:a1].tolist()) == tok.decode(scratch.input_ids[b0:b1].tolist())
        a_prev, b_prev = a1, b1


def _check_sampled(trajs, proc, model, max_turns):
    vision = set(proc.tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                       "<|vision_end|>"]))
    for t in trajs:
        t.row.validate()
        assert t.finish_reason in ("stop", "length", "max_turns", "vision_token") and 1 <= t.num_turns <= max_turns
        assert np.array_equal(t.row.labels != IGNORE, t.response_mask.astype(bool))
        assert not vision & set(t.row.input_ids[t.response_mask == 1].tolist())
        assert t.row.num_images == 1 + sum(turn.num_images for turn in t.turns)
        assert_equal_up_to_reply_tokenization(t.row, mmpipe.encode_row(t.to_raw_row(), proc), proc.tokenizer)
    invariants.assert_roundtrip([t.row for t in trajs], processor=proc)
    assert np.nanmax(logprob_gaps(model, trajs, proc)) < 1e-4


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_real_engine_sampling(family):
    """The transformers engine at temperature 1.0. A random model rarely calls a tool, so
    with Qwen's parser trajectories mostly end (stop / length / vision token); with a parser
    that reads every reply as a call (1 or 2 images back) they run to max_turns. Rows stay
    valid, equal the whole encode up to the replies' re-tokenization (sampled ids rarely
    re-tokenize the same), and the engine's logprobs equal teacher forcing of the final rows."""
    proc, model = processor_for(family), model_for(family)
    engine = TransformersEngine(model, proc)
    params = SamplingParams(max_new_tokens=10, n=2, temperature=1.0, seed=0)
    loop = AgentLoop(engine, proc, TOOLS, max_turns=3)
    trajs = loop.run([question(k) for k in range(3)], params)
    assert len(trajs) == 6 and [(t.prompt_index, t.sample_index) for t in trajs][:3] == [(0, 0), (0, 1), (1, 0)]
    assert 1 <= loop.engine_calls <= 3
    _check_sampled(trajs, proc, model, 3)

    def every_reply_calls(text):
        return [ToolCall("search", {"q": "one" if len(text) % 2 else "two"}, text)]

    loop = AgentLoop(engine, proc, TOOLS, parser=every_reply_calls, max_turns=3)
    trajs = loop.run([question(k) for k in range(2)], params)
    assert loop.engine_calls == 3 and all(t.finish_reason in ("max_turns", "vision_token") for t in trajs)
    assert sum(t.num_turns == 3 and t.row.num_images >= 3 for t in trajs) >= 2
    _check_sampled(trajs, proc, model, 3)
