"""Labels on the chat templates as published with each native family's checkpoints (issue 28):
mmpipe's labels == transformers' assistant mask on a ``{% generation %}`` copy of the published
template (`mmpipe.offline.published_templates`), through the processor's own chat path for rows
with images and the tokenizer's for text rows; replies ending in spaces / newlines, empty replies,
content lists, multi-turn rows, tool turns. The offline tokenizer has learned BPE merges.

Also: the cost of locating the replies does not grow with the turns (render calls counted, not
timed), the end-of-turn choice (``end_of_turn="stop_token"``), content lists rendered as each
template expects (never a Python repr in the training text), and the span-to-token rule."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.encoding.render import span_labels
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.offline.published_templates import PUBLISHED, generation_template, published_template

from helpers import TOOL_CALL, counted_renders, reply as _reply, user_turn as _user

FAMILIES = sorted(PUBLISHED)

CONVERSATIONS = {
    "image, reply ends in a space": [_user(None, "Describe"), _reply("A cat. ")],
    "system, two images, reply ends in newlines": [
        {"role": "system", "content": "Be brief."}, _user("hi"), _reply("hello\n\n"), _user(None, "and this?"),
        _reply("a dog")],
    "empty reply": [_user("q"), _reply(""), _user("q2"), _reply("x")],
    "reply as a list of parts": [_user("q"), _reply([{"type": "text", "text": "part one "},
                                                     {"type": "text", "text": "part two"}])],
    "leading newline, spaces around": [_user("q"), _reply("\nstarts with newline"), _user("again"), _reply(" spaced ")],
    "tool turn": [_user("weather?"), _reply("", tool_calls=[TOOL_CALL]), {"role": "tool", "content": "sunny"},
                  _reply("It is sunny.")],
}


def _processor(family: str, template: str):
    """The family's offline processor (real class, offline BPE tokenizer) with ``template``."""
    if family.startswith("qwen"):
        from mmpipe.testing import build_processor

        proc = build_processor(family)
    elif family == "glm4v":
        from mmpipe.offline.glm4v import build_processor as build

        proc = build()
    elif family == "gemma3":
        from mmpipe.offline.gemma3 import build_gemma3_processor as build

        proc = build()
    elif family == "internvl":
        from mmpipe.offline.internvl import build_internvl_processor as build

        proc = build()
    else:
        from mmpipe.offline.onevision import build_onevision_processor as build

        proc = build()
    proc.chat_template = proc.tokenizer.chat_template = template
    return proc


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(family, processor with the published template, processor with its generation copy)."""
    fam = request.param
    proc = _processor(fam, published_template(fam))
    ref = copy.deepcopy(proc)
    ref.chat_template = ref.tokenizer.chat_template = generation_template(fam)
    return fam, proc, ref


def _as_the_template_expects(family: str, conversation: list) -> list:
    """The conversation as a user must hand it to transformers for the published template to
    render it (what mmpipe's `ChatTemplate.template_messages` does by itself): LLaVA-OneVision
    renders only content parts, GLM-4.1V prints assistant / system content as it is."""
    out = []
    for m in conversation:
        c = m["content"]
        if family == "llava_onevision" and isinstance(c, str):
            c = [{"type": "text", "text": c}]
        if family == "glm4v" and m["role"] in ("assistant", "system") and isinstance(c, list):
            c = "".join(p["text"] for p in c)
        out.append({**m, "content": c})
    return out


def _images(conversation: list) -> list:
    n = sum(1 for m in conversation if isinstance(m["content"], list) for p in m["content"] if p.get("type") == "image")
    return [Image.new("RGB", (40 + 12 * i, 30 + 5 * i), (30 * i, 120, 60)) for i in range(n)]


def _reference(ref, family: str, conversation: list, images: list):
    """transformers' ids and assistant mask: the processor's chat path with the images, the
    tokenizer's for a text row."""
    it = iter(images)
    conv = [{**m, "content": [{"type": "image", "image": next(it)} if p.get("type") == "image" else p
                              for p in m["content"]] if isinstance(m["content"], list) else m["content"]}
            for m in _as_the_template_expects(family, conversation)]
    target = ref if images else ref.tokenizer
    out = target.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_labels_equal_transformers_assistant_mask(family, name):
    fam, proc, ref = family
    conversation = CONVERSATIONS[name]
    if fam == "gemma3" and any(m["role"] == "tool" for m in conversation):
        pytest.skip("Gemma 3's template raises on a tool turn (roles must alternate)")
    images = _images(conversation)
    ids, mask = _reference(ref, fam, conversation, images)
    row = mmpipe.Encoder(proc).encode_row({"messages": conversation, "images": images})
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))
    assert (row.labels != -100).any() or all(not m["content"] for m in conversation if m["role"] == "assistant")


def test_generation_copies_render_the_published_text():
    from transformers.utils.chat_template_utils import render_jinja_template

    for fam in FAMILIES:
        for name, conversation in CONVERSATIONS.items():
            if fam == "gemma3" and name == "tool turn":
                continue
            conv = _as_the_template_expects(fam, conversation)
            for agp in (False, True):
                a, _ = render_jinja_template([conv], chat_template=published_template(fam), add_generation_prompt=agp)
                b, spans = render_jinja_template([conv], chat_template=generation_template(fam),
                                                 add_generation_prompt=agp, return_assistant_tokens_mask=True)
                assert a == b, (fam, name)
                assert spans[0] or fam == "llava_onevision", (fam, name)  # its blocks are text parts only


@pytest.mark.parametrize("fam", ["qwen2_vl", "glm4v", "gemma3", "llava_onevision"])
def test_locating_replies_costs_the_same_renders_for_any_number_of_turns(fam, monkeypatch):
    """A 2,000-turn row renders its conversation as often as a 2-turn row (the prefix way
    rendered it once per reply: quadratic). Counted, not timed."""
    proc = _processor(fam, published_template(fam))
    calls = counted_renders(monkeypatch)
    counts = {}
    for turns in (2, 2000):
        enc = mmpipe.Encoder(proc)
        enc.content_form("user"), enc.content_form("assistant"), enc.stop_rule(), enc.reply_header()  # probes
        calls.clear()
        messages = [m for i in range(turns // 2) for m in
                    ({"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i} "})]
        row = enc.encode_row({"messages": messages})
        counts[turns] = (len(calls), sum(calls))
        assert int((row.labels != -100).sum()) > 0
    assert counts[2000] == counts[2] and counts[2][1] <= 3, counts


def test_end_of_turn_stop_token_appends_glm_stop_and_labels_it():
    proc = _processor("glm4v", published_template("glm4v"))
    conversation = [_user("q"), _reply("yes "), _user("and?"), _reply("no")]
    plain = mmpipe.Encoder(proc).encode_row({"messages": conversation})
    stop = mmpipe.Encoder(proc, end_of_turn="stop_token").encode_row({"messages": conversation})
    eos = proc.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert eos not in plain.input_ids.tolist()
    at = np.flatnonzero(stop.input_ids == eos)
    assert len(at) == 2 and (stop.labels[at] == eos).all()  # one after each reply, labelled
    tok = proc.tokenizer
    assert tok.decode(stop.input_ids[stop.labels != -100]) == "yes <|endoftext|>no<|endoftext|>"
    assert tok.decode(plain.input_ids[plain.labels != -100]) == "yes no"


def test_end_of_turn_stop_token_labels_onevision_im_end_it_writes():
    proc = _processor("llava_onevision", published_template("llava_onevision"))
    conversation = [_user("q"), _reply("yes"), _user("and?"), _reply("no")]
    plain = mmpipe.Encoder(proc).encode_row({"messages": conversation})
    stop = mmpipe.Encoder(proc, end_of_turn="stop_token").encode_row({"messages": conversation})
    np.testing.assert_array_equal(plain.input_ids, stop.input_ids)  # nothing appended: the template writes it
    tok = proc.tokenizer
    assert tok.decode(plain.input_ids[plain.labels != -100]) == "\nyes\nno"  # the template's blocks
    assert tok.decode(stop.input_ids[stop.labels != -100]) == "\nyes<|im_end|>\nno<|im_end|>"


def test_end_of_turn_stop_token_changes_nothing_where_the_template_marks_it():
    proc = _processor("qwen2_vl", published_template("qwen2_vl"))
    conversation = [_user("q"), _reply("yes\n"), _user("and?"), _reply("no")]
    a = mmpipe.Encoder(proc).encode_row({"messages": conversation})
    b = mmpipe.Encoder(proc, end_of_turn="stop_token").encode_row({"messages": conversation})
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_end_of_turn_refused_on_the_generic_path():
    from mmpipe.offline.other_vlms import build_foreign_processor

    with pytest.raises(ArgumentError, match="end_of_turn='stop_token'"):
        mmpipe.Encoder(build_foreign_processor("llava"), end_of_turn="stop_token")
    with pytest.raises(ArgumentError, match="end_of_turn must be one of"):
        mmpipe.Encoder(_processor("qwen2_vl", published_template("qwen2_vl")), end_of_turn="eos")


def test_content_lists_never_rendered_as_a_repr():
    proc = _processor("glm4v", published_template("glm4v"))
    conversation = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, _user("q"),
                    _reply([{"type": "text", "text": "one "}, {"type": "text", "text": "two"}])]
    enc = mmpipe.Encoder(proc)
    assert (enc.content_form("assistant"), enc.content_form("system"), enc.content_form("user")) == \
        ("string", "string", "any")
    text = proc.tokenizer.decode(enc.encode_row({"messages": conversation}).input_ids)
    assert "'type'" not in text and "Be brief." in text and text.endswith("one two")
    with pytest.raises(PlaceholderError, match="prints assistant content as it is"):
        enc.encode_row({"messages": [_user("q"), _reply([{"type": "image"}, {"type": "text", "text": "x"}])],
                        "images": [Image.new("RGB", (32, 32))]})


def test_string_contents_rendered_where_the_template_takes_only_parts():
    proc = _processor("llava_onevision", published_template("llava_onevision"))
    enc = mmpipe.Encoder(proc)
    assert enc.content_form("user") == "list"
    row = enc.encode_row({"messages": [{"role": "user", "content": "what is it?"}, _reply("a cat")]})
    text = proc.tokenizer.decode(row.input_ids)
    assert "what is it?" in text and "a cat" in text  # as a string, the stock template renders nothing


def test_span_labels_one_pass_equals_the_overlap_rule():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        cuts = np.sort(rng.choice(np.arange(1, 200), size=n, replace=False))
        starts = np.concatenate([[0], cuts[:-1]])
        offsets = np.stack([starts, cuts], 1).astype(np.int64)
        bounds = np.sort(rng.choice(np.arange(0, 210), size=2 * int(rng.integers(0, 6)), replace=False))
        spans = [(int(a), int(b)) for a, b in bounds.reshape(-1, 2)]
        spans += [(int(x), int(x)) for x in rng.integers(0, 200, size=int(rng.integers(0, 2)))]  # empty replies
        spans = sorted(set(spans))
        if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
            continue
        ids = np.arange(n, dtype=np.int64) + 5
        want = np.full(n, -100, np.int64)
        for a, b in spans:
            sel = (offsets[:, 0] < b) & (offsets[:, 1] > a)
            want[sel] = ids[sel]
        np.testing.assert_array_equal(span_labels(ids, offsets, spans), want)


def test_generic_text_rows_locate_replies_without_a_processor_call_per_reply():
    """The generic path's labels of a row without images come from the one-render locator and
    the tokenizer's offsets (a 10,000-turn row took > 600 s with one processor call per reply):
    the processor calls for 2 and 400 turns are the same, and the labels equal the per-reply way."""
    import mmpipe.encoding.call_labels as cl
    import mmpipe.media.processor_encode as pe
    from mmpipe.offline.other_vlms import build_foreign_processor

    proc = build_foreign_processor("llava")
    enc = mmpipe.Encoder(proc)
    enc.encode_row({"messages": [_user("warm up"), _reply("ok")]})  # the layout probe and template probes
    real, calls = pe.run_processor, []

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    counts, rows = {}, {}
    for turns in (2, 400):
        messages = [m for i in range(turns // 2) for m in
                    ({"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": f"a {i} "})]
        pe.run_processor, calls[:] = counting, []
        try:
            rows[turns] = enc.encode_row({"messages": messages})
        finally:
            pe.run_processor = real
        counts[turns] = len(calls)
    assert counts[400] == counts[2] == 1, counts
    tok = proc.tokenizer
    assert tok.decode(rows[2].input_ids[rows[2].labels != -100]).startswith("a 0 ")
    slow = cl._text_row_labels
    cl._text_row_labels = lambda *a, **k: None  # the per-reply way
    try:
        np.testing.assert_array_equal(enc.encode_row({"messages": messages}).labels, rows[400].labels)
    finally:
        cl._text_row_labels = slow
