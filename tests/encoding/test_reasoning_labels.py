"""Reasoning in assistant replies (thinking models), on the templates that render it:
`mmpipe.offline.glm46v.GLM46V_CHAT_TEMPLATE` (GLM-4.6V's own) and a Qwen3-VL-Thinking-style
template (`thinking_templates.QWEN3_VL_THINKING`), plus GLM-4.1V's published ``metadata``.

- a message's other keys (``reasoning_content``, ``metadata``) reach the template as the
  processor's own chat path hands them over: ids == ``apply_chat_template(tokenize=True)``;
- labels == transformers' assistant mask on a ``{% generation %}`` copy of the template: each reply
  as the whole conversation renders it (history replies with their reasoning rendered away, the
  replies after the last user turn with it), for ``<think>`` in the content and for
  ``reasoning_content``, single- and multi-turn, prompt rows, tool loops, content lists;
- the cost of locating them does not grow with the turns (renders counted, not timed);
- a row whose reply spans are undefined is refused with where the renders differ.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.errors import InputError, ParseError
from mmpipe.offline import glm46v
from mmpipe.offline.published_templates import generation_template, published_template
from mmpipe.testing import invariants

from helpers import TOOL_CALL as CALL, counted_renders, reply as _a, user_turn as _u
from thinking_templates import GLM46V_GENERATION, QWEN3_VL_THINKING, QWEN3_VL_THINKING_GENERATION



CONVERSATIONS = {
    "reasoning_content, image": [_u(None, "How many cats?"),
                                 _a("Two.", reasoning_content="I count one on the left and one on the right.")],
    "think in history and last reply": [_u("2+2?"), _a("<think>2 plus 2 is 4</think>4"), _u("and 3+3?"),
                                        _a("<think>3 plus 3 is 6</think>6")],
    "think only in the last reply": [_u("2+2?"), _a("4"), _u(None, "and 3+3?"),
                                     _a("<think>\n3 plus 3 is 6\n</think>\n\n6")],
    "reasoning_content in every reply": [_u("2+2?"), _a("4", reasoning_content="r1"), _u(None, "and this?"),
                                         _a("6", reasoning_content="r2")],
    "prompt row, thinking history": [_u("2+2?"), _a("<think>r</think>4"), _u("next?")],
    "reply as text parts around its think": [_u("q"), _a([{"type": "text", "text": "<think>because</think>"},
                                                          {"type": "text", "text": "answer"}])],
    "three turns, think everywhere": [_u("a"), _a("<think>x</think>b "), _u("c"), _a("<think>y</think> d"),
                                      _u("e"), _a("<think>\nz\n</think>\n\nf\n")],
}
# tool loops: GLM-4.6V's template (as mmpipe ships it) renders no tool calls
TOOL_CONVERSATIONS = {
    "tool loop, reasoning then answer": [_u("weather?"), _a("", tool_calls=[CALL], reasoning_content="need it"),
                                         {"role": "tool", "content": "sunny"}, _a("<think>it is sunny</think>Sunny.")],
    "tool loop, bare call then think": [_u("weather?"), _a("", tool_calls=[CALL]), {"role": "tool", "content": "sunny"},
                                        _a("<think>so</think>Sunny.")],
    "tool call in history with reasoning": [_u("weather?"), _a("<think>look</think>", tool_calls=[CALL]),
                                            {"role": "tool", "content": "sunny"}, _a("Sunny."), _u("thanks"),
                                            _a("<think>polite</think>Welcome.")],
}


def _qwen3_thinking(template):
    from mmpipe.testing import build_processor

    proc = build_processor("qwen3_vl")
    proc.chat_template = proc.tokenizer.chat_template = template
    return proc


def _glm46v(template):
    if not glm46v.available():
        pytest.skip("transformers 4.x has no GLM-4.6V (glm46v)")
    proc = glm46v.build_processor()
    proc.chat_template = proc.tokenizer.chat_template = template
    return proc


TEMPLATES = {"glm46v": (_glm46v, glm46v.GLM46V_CHAT_TEMPLATE, GLM46V_GENERATION),
             "qwen3_vl_thinking": (_qwen3_thinking, QWEN3_VL_THINKING, QWEN3_VL_THINKING_GENERATION)}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request):
    """(name, processor with the template, processor with its generation copy)."""
    build, template, generation = TEMPLATES[request.param]
    return request.param, build(template), build(generation)


def _images(conversation):
    n = sum(1 for m in conversation if isinstance(m["content"], list) for p in m["content"] if p.get("type") == "image")
    return [Image.new("RGB", (40 + 12 * i, 30 + 5 * i), (30 * i, 120, 60)) for i in range(n)]


def _reference(proc, conversation, images):
    """transformers' ids and assistant mask: the processor's chat path (images inline), the
    tokenizer's for a text row; the generation prompt where the row ends on another turn."""
    it = iter(images)
    conv = [{**m, "content": [{"type": "image", "image": next(it)} if p.get("type") == "image" else p
                              for p in m["content"]] if isinstance(m["content"], list) else m["content"]}
            for m in copy.deepcopy(conversation)]
    out = (proc if images else proc.tokenizer).apply_chat_template(
        conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
        add_generation_prompt=conversation[-1]["role"] != "assistant")  # mmpipe's default rule
    return np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)


def _check(proc, ref, conversation):
    images = _images(conversation)
    own_ids, _ = _reference(proc, conversation, images)  # the published template's own chat path
    ids, mask = _reference(ref, conversation, images)
    np.testing.assert_array_equal(own_ids, ids)  # the generation copy renders the same text
    row = mmpipe.encode_row({"messages": conversation, "images": images}, proc)
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))
    assert (row.labels != -100).any()
    return row


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_reasoning_labels_equal_transformers_assistant_mask(pair, name):
    _, proc, ref = pair
    _check(proc, ref, CONVERSATIONS[name])


@pytest.mark.parametrize("name", sorted(TOOL_CONVERSATIONS))
def test_reasoning_in_tool_loops_equals_transformers_assistant_mask(name):
    _check(_qwen3_thinking(QWEN3_VL_THINKING), _qwen3_thinking(QWEN3_VL_THINKING_GENERATION), TOOL_CONVERSATIONS[name])


def test_reasoning_content_is_trained_not_an_empty_think(pair):
    """The defect: ``reasoning_content`` was dropped, so the model learnt ``<think></think>``."""
    _, proc, _ = pair
    row = mmpipe.encode_row({"messages": [_u("q"), _a("Two.", reasoning_content="I count two.")]}, proc)
    labelled = proc.tokenizer.decode(row.input_ids[row.labels != -100])
    assert "I count two." in labelled and labelled.rstrip("<|im_end|>").endswith("Two.")
    invariants.assert_roundtrip([row], processor=proc)


def test_glm4v_metadata_reaches_the_published_template():
    """GLM-4.1V's ``metadata`` (``<|assistant|>weather_tool``): ids == the processor's; labels ==
    the published generation copy's mask (its block starts after the metadata line)."""
    from mmpipe.offline.glm4v import build_processor

    proc, ref = build_processor(), build_processor()
    proc.chat_template = proc.tokenizer.chat_template = published_template("glm4v")
    ref.chat_template = ref.tokenizer.chat_template = generation_template("glm4v")
    conversation = [{"role": "user", "content": "Weather?"}, _a("Sunny.", metadata="weather_tool"),
                    {"role": "user", "content": "And tomorrow?"}, _a("Rain.")]
    row = _check(proc, ref, conversation)
    assert "weather_tool" in proc.tokenizer.decode(row.input_ids)


def test_other_keys_parsed_as_the_processor_gets_them():
    from mmpipe.encoding.parse import parse_media

    raw = {"messages": [{"role": "user", "content": "q", "reasoning_content": None, "weight": 0},
                        {"role": "assistant", "content": "a", "reasoning_content": "why", "metadata": "tool",
                         "name": None}]}
    messages, *_ = parse_media(raw)
    assert messages == [{"role": "user", "content": "q", "weight": 0},  # None: Arrow's filler, left out
                        {"role": "assistant", "content": "a", "reasoning_content": "why", "metadata": "tool"}]
    with pytest.raises(ParseError) as e:
        parse_media({"messages": [{"role": "user", "content": "q"}, _a("a", reasoning_content=["why"])]}, idx=3)
    assert (e.value.expected, e.value.found, e.value.column) == ("str or None", "list", "messages")
    assert "row 3" in str(e.value) and e.value.fix
    with pytest.raises(ParseError, match="surrogate"):
        parse_media({"messages": [{"role": "user", "content": "q"}, _a("a", reasoning_content="bad \ud800")]})


def test_reasoning_rows_are_located_in_a_fixed_number_of_renders(monkeypatch):
    """GLM-4.6V rows whose replies hold ``<think>`` (the last one's reasoning kept, the others'
    rendered away) render their conversation as often at 2,000 turns as at 2 (the prefix way
    rendered it once per reply). Counted, not timed."""
    proc = _glm46v(glm46v.GLM46V_CHAT_TEMPLATE)
    calls = counted_renders(monkeypatch)
    counts = {}
    for turns, history in ((2, False), (2000, False), (2000, True)):
        enc = mmpipe.Encoder(proc)
        enc.content_form("user"), enc.content_form("assistant"), enc.stop_rule(), enc.reply_header()  # probes
        calls.clear()
        messages = [m for i in range(turns // 2) for m in
                    (_u(f"question {i}"), _a(f"<think>r{i}</think>answer {i}" if history else f"answer {i}"))]
        messages[-1] = _a("<think>reasoning</think>final")
        row = enc.encode_row({"messages": messages})
        counts[turns, history] = (len(calls), sum(calls))
        assert proc.tokenizer.decode(row.input_ids[row.labels != -100]).endswith("<think>reasoning</think>\nfinal")
    assert counts[2000, False] == counts[2000, True] == counts[2, False] and counts[2, False][1] <= 3, counts


def test_undefined_reply_spans_refused_with_expected_and_found():
    """GLM-4.6V writes no end of turn, and a history reply of reasoning alone renders as
    ``<think></think>`` with nothing of its own to mark: its end is not found by markers, and the
    conversation's prefixes render it with its reasoning: a typed refusal naming where."""
    proc = _glm46v(glm46v.GLM46V_CHAT_TEMPLATE)
    messages = [_u("a"), _a("<think>only reasoning</think>"), _u("b"), _a("<think>y</think>c")]
    with pytest.raises(InputError) as e:
        mmpipe.Encoder(proc).encode_row({"messages": messages}, idx=5)
    err = e.value
    assert err.expected and err.found and "generation" in err.fix and "labels=False" in err.fix
    assert "only reasoning" in err.found and err.column == "messages" and "row 5" in str(err)
    assert mmpipe.Encoder(proc, labels=False).encode_row({"messages": messages}).labels is None
