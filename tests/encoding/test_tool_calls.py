"""encode with tool use: assistant ``tool_calls``, ``tool`` turns with text and images and a
``tools`` list reach the chat template as transformers renders them (ids equal the
processor's), and labels equal transformers' assistant-token mask (``{% generation %}``
templates), also with a tokenizer that merges a reply's leading newline into its header."""

from __future__ import annotations

import functools
import json
import logging

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding import render
from mmpipe.errors import ParseError
from mmpipe.offline.chat_templates import chat_template
from mmpipe.offline.processors import build_image_processor, image_only_processor_class
from mmpipe.testing import invariants

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TOOLS = [
    {"type": "function", "function": {"name": "zoom", "description": "Zoom into the picture.",
                                      "parameters": {"type": "object", "properties": {"x": {"type": "number"}},
                                                     "required": ["x"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web for pictures.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
]


@functools.lru_cache(maxsize=None)
def _processor(family: str, merges: str = "default"):
    """The offline processor of ``family`` around ``build_tokenizer(family, merges=merges)``."""
    return image_only_processor_class(family)(
        image_processor=build_image_processor(family),
        tokenizer=testing.build_tokenizer(family, merges=merges),
        chat_template=chat_template(family),
    )


def _images(n, seed=0):
    return [testing.tiny_image(56 + 8 * i, 72, seed=seed + i) for i in range(n)]


def _call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _agent_chat(n_tool_images: int, lead: str = "", system: bool = True) -> list[dict]:
    """system? -> user (1 image) -> assistant with two tool calls -> two tool turns (the first
    with ``n_tool_images`` images) -> assistant -> user -> assistant. Images are placeholders."""
    msgs = [{"role": "system", "content": "You are a careful agent."}] if system else []
    msgs += [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is on the table?"}]},
        {"role": "assistant", "content": lead + "Let me look closer.",
         "tool_calls": [_call("zoom", {"x": 2}), _call("search", json.dumps({"query": "red box"}))]},
        {"role": "tool", "name": "zoom", "tool_call_id": "call_0",
         "content": [{"type": "image"}] * n_tool_images + [{"type": "text", "text": "zoomed view"}]},
        {"role": "tool", "name": "search", "content": "three results"},
        {"role": "assistant", "content": lead + "A small red box."},
        {"role": "user", "content": "Are you sure?"},
        {"role": "assistant", "content": lead + "Yes.", "tool_calls": [_call("zoom", {"x": 4})]},
    ]
    return msgs


def _inline(msgs, images):
    """The same messages with each image placeholder carrying its image (for the processor)."""
    it = iter(images)
    out = []
    for m in msgs:
        c = m["content"]
        if isinstance(c, list):
            c = [dict(i, image=next(it)) if i.get("type") == "image" else i for i in c]
        out.append(dict(m, content=c))
    return out


def _reference(processor, msgs, images, tools, generation=False):
    """transformers: the processor's chat template (optionally its {% generation %} version),
    tokenized with the images, with the assistant-token mask when ``generation``."""
    if generation:
        out = processor.apply_chat_template(
            _inline(msgs, images), chat_template=chat_template(_family(processor), generation=True), tools=tools,
            tokenize=True, return_dict=True, return_assistant_tokens_mask=True, return_tensors="np")
        return {k: np.asarray(v) for k, v in out.items()}
    text = processor.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False)
    out = processor(text=[text], images=images or None, return_tensors="np")
    return {k: np.asarray(v) for k, v in out.items()}


def _family(processor) -> str:
    return mmpipe.family_of(processor).name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n_tool_images", [0, 1, 2])
def test_ids_equal_processor_with_tool_calls_and_tool_images(family, n_tool_images):
    proc = _processor(family)
    images = _images(1 + n_tool_images)
    msgs = _agent_chat(n_tool_images)
    ref = _reference(proc, msgs, images, TOOLS)
    by_option = mmpipe.encode_row({"messages": msgs, "images": images}, proc, tools=TOOLS)
    by_column = mmpipe.encode_row({"messages": msgs, "images": images, "tools": json.dumps(TOOLS)}, proc,
                                  tools=[{"type": "function", "function": {"name": "ignored"}}])  # column wins
    for row in (by_option, by_column):
        np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
        np.testing.assert_array_equal(row.mm_token_type_ids, ref["mm_token_type_ids"][0])
        np.testing.assert_array_equal(row.image_grid_thw, ref["image_grid_thw"])
        # images in tool turns are inputs, never targets
        assert (row.labels[row.mm_token_type_ids == 1] == -100).all()
    tok = proc.tokenizer
    n_calls = int((by_option.input_ids == tok.convert_tokens_to_ids("<tool_call>")).sum())
    if mmpipe.family_of(proc).name == "qwen3_vl":
        # the template renders the tools (whose instructions show <tool_call> twice), the three
        # calls (labelled) and both tool responses
        call_pos = np.flatnonzero(by_option.input_ids == tok.convert_tokens_to_ids("<tool_call>"))
        assert n_calls == 2 + 3 and (by_option.labels[call_pos[2:]] != -100).all()
        assert (by_option.labels[call_pos[:2]] == -100).all()
        assert int((by_option.input_ids == tok.convert_tokens_to_ids("<tool_response>")).sum()) == 2
        without = mmpipe.encode_row({"messages": msgs, "images": images}, proc)
        assert len(without.input_ids) < len(by_option.input_ids)  # tools= reached the template
    else:  # Qwen2-VL's / Qwen2.5-VL's processor template renders no tool use, like the real one
        assert n_calls == 0
    batch = invariants.assert_roundtrip([by_option, by_column], processor=proc)
    n_patches = int(np.prod(ref["image_grid_thw"], axis=1).sum())
    np.testing.assert_array_equal(batch.pixel_values.numpy()[:n_patches], ref["pixel_values"])


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("lead", ["\n", " ", "\n\n", ""])
def test_labels_equal_transformers_assistant_mask(family, lead):
    proc = _processor(family, "qwen-like")
    tok = proc.tokenizer
    images = _images(2)
    msgs = _agent_chat(1, lead=lead)
    ref = _reference(proc, msgs, images, TOOLS, generation=True)
    row = mmpipe.encode_row({"messages": msgs, "images": images}, proc, tools=TOOLS)
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
    mask = ref["assistant_masks"][0].astype(bool)
    np.testing.assert_array_equal(row.labels != -100, mask)
    np.testing.assert_array_equal(row.labels[mask], row.input_ids[mask])
    merged = {"\n": "ĊĊ", "\n\n": "ĊĊĊ"}.get(lead)
    if merged is not None:
        # the reply's leading newline shares a token with the header's: labelled, once per reply
        header = tok("<|im_start|>assistant", add_special_tokens=False)["input_ids"]
        ids = row.input_ids.tolist()
        pos = [p for p in range(len(header), len(ids))
               if ids[p] == tok.convert_tokens_to_ids(merged) and ids[p - len(header):p] == header]
        assert len(pos) == 3 and (row.labels[pos] != -100).all()
    invariants.assert_roundtrip([row], processor=proc)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_labels_equal_tokenizer_mask_on_text_conversations(family):
    tok = testing.build_tokenizer(family, merges="qwen-like")
    assert tok.convert_ids_to_tokens(tok("assistant\n\nHi")["input_ids"])[-3:] == ["ĊĊ", "H", "i"]  # the merge exists
    for lead in ("\n", " ", "\n\n", " \n"):
        msgs = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": lead + "Hello."},
                {"role": "user", "content": "Count to two."}, {"role": "assistant", "content": lead + "1, 2\n"}]
        ref = tok.apply_chat_template(msgs, chat_template=chat_template(family, generation=True), tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
        row = mmpipe.encode_row({"messages": msgs}, tok)
        np.testing.assert_array_equal(row.input_ids, ref["input_ids"])
        np.testing.assert_array_equal(row.labels != -100, np.asarray(ref["assistant_masks"], bool), err_msg=repr(lead))


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_templates_render_the_same_text(family):
    proc = _processor(family)
    msgs = _agent_chat(2, lead="\n")
    for tools in (None, TOOLS):
        plain = proc.apply_chat_template(msgs, tools=tools, tokenize=False)
        gen = proc.apply_chat_template(msgs, tools=tools, tokenize=False,
                                       chat_template=chat_template(family, generation=True))
        assert gen == plain


def test_arrow_rows_with_tool_calls_equal_processor(tmp_path):
    """Through datasets: Arrow gives every message every key (None where absent)."""
    proc = _processor("qwen3_vl")
    rows = []
    for n in (0, 1, 2):
        msgs = _agent_chat(n)
        for m in msgs:  # arguments as JSON strings: Arrow would merge dict keys across rows
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"]) \
                    if not isinstance(c["function"]["arguments"], str) else c["function"]["arguments"]
            if isinstance(m["content"], str):
                m["content"] = [{"type": "text", "text": m["content"]}]
        rows.append({"messages": msgs, "images": _images(1 + n, seed=n), "tools": json.dumps(TOOLS)})
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    assert ds[0]["messages"][0]["tool_calls"] is None  # what Arrow hands back
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    for i, raw in enumerate(rows):
        ref = _reference(proc, raw["messages"], list(ds[i]["images"]), TOOLS)
        np.testing.assert_array_equal(np.asarray(out[i]["input_ids"]), ref["input_ids"][0])
    invariants.assert_roundtrip(list(out), processor=proc)


@pytest.mark.parametrize("bad, what", [
    ({"name": "zoom"}, "must be a list"),
    (["zoom"], "not a dict"),
    ([{"type": "function", "function": {"arguments": {}}}], "no function name"),
    ([_call("zoom", "{x: 2")], "not a JSON object string"),
    ([_call("zoom", 2)], "arguments must be a dict"),
])
def test_malformed_tool_calls_raise_parse_error(bad, what):
    msgs = [{"role": "user", "content": "zoom"}, {"role": "assistant", "content": "", "tool_calls": bad}]
    with pytest.raises(ParseError, match=what) as e:
        mmpipe.encode_row({"messages": msgs}, _processor("qwen3_vl"), idx=7)
    assert e.value.row == 7 and e.value.column == "messages" and "message 1" in str(e.value)


def test_bad_tools_and_misplaced_tool_calls_raise():
    proc = _processor("qwen3_vl")
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ParseError) as e:
        mmpipe.encode_row({"messages": msgs, "tools": "not json"}, proc, idx=3)
    assert e.value.row == 3 and e.value.column == "tools"
    with pytest.raises(ParseError, match="tool_calls on assistant messages only"):
        mmpipe.encode_row({"messages": [dict(msgs[0], tool_calls=[_call("zoom", {})])]}, proc)
    with pytest.raises(mmpipe.errors.ArgumentError):
        mmpipe.encode_row({"messages": msgs}, proc, tools={"name": "zoom"})


def test_template_that_ignores_tool_calls_is_reported_once(caplog):
    render._WARNED_TOOLS.clear()  # logged once per process: an earlier test's encoder may have logged it
    enc = mmpipe.Encoder(_processor("qwen2_vl"), tools=TOOLS)
    with caplog.at_level(logging.WARNING, logger="mmpipe.encoding.encoder"):
        for n in (0, 0):
            enc.encode_row({"messages": _agent_chat(n), "images": _images(1)})
    said = [r.getMessage() for r in caplog.records]
    assert sum("ignores tool_calls" in m for m in said) == 1 and sum("ignores tools" in m for m in said) == 1


@pytest.mark.parametrize("family, dropped", [("glm4v", True), ("qwen2_vl", False)])
def test_template_that_drops_tool_turns_is_reported_once(caplog, family, dropped):
    """GLM-4.1V's published template renders no ``role: "tool"`` message: the reply after a tool
    result would be trained without it in context; logged once per encoder, like ignored tool calls.
    Qwen2-VL's published template renders tool turns: nothing logged."""
    from mmpipe.offline.published_templates import published_template

    if family == "glm4v":
        from mmpipe.offline.glm4v import build_processor

        proc = build_processor()
    else:
        proc = testing.build_processor(family)
    proc.chat_template = proc.tokenizer.chat_template = published_template(family)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "Let me check."},
            {"role": "tool", "content": "Paris: 31C, sunny"}, {"role": "assistant", "content": "It is 31C and sunny."}]
    enc = mmpipe.Encoder(proc)
    render._WARNED_TOOLS.clear()
    with caplog.at_level(logging.WARNING, logger="mmpipe.encoding.encoder"):
        rows = [enc.encode_row({"messages": msgs}) for _ in range(2)]
    said = [r.getMessage() for r in caplog.records if "ignores tool turns" in r.getMessage()]
    assert len(said) == (1 if dropped else 0), said
    assert ("31C, sunny" in proc.tokenizer.decode(rows[0].input_ids)) != dropped
