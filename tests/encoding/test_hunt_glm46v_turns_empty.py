"""GLM-4.6V empty replies under thinking on (the template's default). The generation prompt is
``<|assistant|>\\n`` and the template renders an empty reply ``<think></think>`` (no answer, no end of
turn): a model that replies with nothing writes that block and stops, as it writes
``<think></think>\\nanswer`` for a reply without reasoning (which mmpipe labels from the header on).
So the empty reply's label is ``<think></think>``, as transformers' assistant mask on the
``{% generation %}`` copy of the template marks it; before the fix mmpipe labelled nothing there, on
this format and on GLM-OCR's published template alike (`_empty_reply_spans` found no stop token). With ``enable_thinking=False`` the prompt itself closes the block (``<think></think>\\n``), the
model writes nothing, and nothing is labelled (the thinking-off rule of 7e0b7fa: answers only)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.rollout import multiturn as mt

from thinking_templates import GLM46V_GENERATION

pytest.importorskip("transformers")
from mmpipe.offline import glm46v  # noqa: E402

if not glm46v.available():
    pytest.skip("transformers without GLM-4.6V", allow_module_level=True)

U = {"role": "user", "content": "q"}
EMPTY = {"role": "assistant", "content": ""}
CONVERSATIONS = {
    "empty last": [U, EMPTY],
    "empty, then a user turn": [U, EMPTY, {"role": "user", "content": "r"}, {"role": "assistant", "content": "ok"}],
    "empty, then a tool turn": [U, EMPTY, {"role": "tool", "content": "res"}, {"role": "assistant", "content": "ok"}],
    "empty after reasoning": [U, {"role": "assistant", "content": "<think>a</think>\nb"},
                              {"role": "tool", "content": "res"}, EMPTY],
}


@pytest.fixture(scope="module")
def procs():
    ref = glm46v.build_processor()
    ref.chat_template = ref.tokenizer.chat_template = GLM46V_GENERATION
    return glm46v.build_processor(), ref


def _labelled(tok, row):
    m = row.labels != -100
    runs, cur = [], []
    for i, on in enumerate(m):
        if on:
            cur.append(int(row.input_ids[i]))
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_empty_reply_labels_equal_transformers_assistant_mask(procs, name):
    proc, ref = procs
    conv = CONVERSATIONS[name]
    out = ref.tokenizer.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = np.asarray(out["input_ids"]), np.asarray(out["assistant_masks"])
    row = mmpipe.encode_row({"messages": conv}, proc)
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))
    assert "<think></think>" in _labelled(proc.tokenizer, row)


def test_empty_reply_under_thinking_off_labels_nothing(procs):
    proc, _ = procs
    row = mmpipe.encode_row({"messages": CONVERSATIONS["empty, then a user turn"]}, proc,
                            chat_template_kwargs={"enable_thinking": False})
    assert _labelled(proc.tokenizer, row) == ["ok"]


def test_glm_ocr_published_template_labels_the_same(procs):
    from mmpipe.offline.same_family_lines import GLM_OCR_CHAT_TEMPLATE

    proc, _ = procs
    ocr = glm46v.build_processor()
    ocr.chat_template = ocr.tokenizer.chat_template = GLM_OCR_CHAT_TEMPLATE
    for conv in CONVERSATIONS.values():
        mine = mmpipe.encode_row({"messages": conv}, proc)
        theirs = mmpipe.encode_row({"messages": conv}, ocr)
        assert _labelled(proc.tokenizer, mine) == _labelled(ocr.tokenizer, theirs)


def test_loop_with_an_empty_sampled_reply_equals_the_whole_conversation(procs):
    """A model that replies with nothing under thinking on samples '<think></think>' then the next
    turn's header: the loop row equals encoding the whole conversation, labels included (but for
    the sampled <|user|>, which opens the next turn there)."""
    proc, _ = procs
    tok = proc.tokenizer
    conv = mt.start({"messages": [U]}, proc)
    conv = mt.append_response(conv, tok("<think></think>", add_special_tokens=False)["input_ids"]
                              + [tok.convert_tokens_to_ids("<|user|>")])
    conv = mt.append_observation(conv, "r")
    whole = mmpipe.encode_row({"messages": [U, {"role": "assistant", "content": "<think></think>"},
                                            {"role": "user", "content": "r"}]}, proc)
    np.testing.assert_array_equal(conv.row.input_ids, whole.input_ids)
    (a, b), = conv.response_spans
    want = np.full(whole.num_tokens, -100)
    want[a:b - 1] = whole.input_ids[a:b - 1]
    np.testing.assert_array_equal(whole.labels, want)
    assert tok.decode(conv.row.input_ids[a:b]) == "<think></think><|user|>"
