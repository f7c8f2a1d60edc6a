"""`Encoder.render_many` and `Encoder.reply_spans` (issue 18: the chat template is rendered at most
twice per single-turn row, in batched calls; issue 28: twice per row of any length): the same
strings and, for the Qwen templates (which write ``<|im_end|>`` right after a reply), the same spans
as one unbatched ``apply_chat_template`` call per prefix."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding.encoder import Encoder

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def _conversations():
    img = {"type": "image"}
    return [
        [{"role": "user", "content": [img, {"type": "text", "text": "What is this?"}]},
         {"role": "assistant", "content": "\nA cat."}],
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
         {"role": "user", "content": [{"type": "text", "text": "and this?"}, img]},
         {"role": "assistant", "content": "A dog.  \n"}],
        [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1"},
         {"role": "user", "content": "more"}],
    ]


def _reference_spans(proc, messages, full, tools):
    """The rule, rendered one prefix per unbatched library call (mmpipe before issue 18)."""
    render = lambda m, agp: proc.apply_chat_template(m, tokenize=False, add_generation_prompt=agp,  # noqa: E731
                                                     **({"tools": tools} if tools is not None else {}))
    spans = []
    for k, msg in enumerate(messages):
        if msg["role"] == "assistant":
            before = render(messages[:k], True) if k else ""
            upto = render(messages[: k + 1], False)
            assert full.startswith(before) and full.startswith(upto)
            end = len(upto)
            while end > len(before) and upto[end - 1] in "\n ":
                end -= 1
            spans.append((len(before), end))
    return spans


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_render_many_and_spans_match_one_call_per_prefix(family, tools):
    proc = testing.build_processor(family)
    enc = Encoder(proc, tools=tools)
    convs = _conversations()
    for agp in (True, False):
        one_each = [proc.apply_chat_template(c, tokenize=False, add_generation_prompt=agp,
                                             **({"tools": tools} if tools else {})) for c in convs]
        assert enc.render_many(convs, agp) == one_each
        assert [enc.render(c, agp) for c in convs] == one_each
    for messages in convs:
        agp = messages[-1]["role"] != "assistant"
        full = enc.render(messages, agp)
        ref = _reference_spans(proc, messages, full, tools)
        assert enc.reply_spans(messages, full, "row 0", None, agp).spans == ref
        assert enc.reply_spans(messages, full, "row 0", None).spans == ref  # full_agp unknown: the row's rule


def test_single_turn_row_renders_the_template_once(monkeypatch):
    """The conversation with marked replies only (`mmpipe.encoding.spans`), its own text read off
    that render (`mmpipe.encoding.marked_render`: Qwen2-VL's template writes replies out as they
    are), once the encoder has probed its template (content forms, end of turn: once per encoder,
    not per row); twice (marked + full) under a template that reads its replies."""
    proc = testing.build_processor("qwen2_vl")
    calls = []
    real = mmpipe.Encoder.render_many

    def counting(self, conversations, *args, **kw):  # the library's own calls, counted
        calls.append(len(conversations))
        return real(self, conversations, *args, **kw)

    row = {"messages": _conversations()[0], "images": [testing.sample_photos()[0][1]]}
    for template, want in ((proc.chat_template, [1]), (proc.chat_template.replace(
            "{{ message['content'] }}", "{{ message['content'] | trim }}"), [1, 1])):
        proc.chat_template = template
        enc = mmpipe.Encoder(proc)
        first = enc(row)
        calls.clear()
        monkeypatch.setattr(mmpipe.Encoder, "render_many", counting)
        out = enc(row)
        monkeypatch.setattr(mmpipe.Encoder, "render_many", real)
        assert calls == want
        np.testing.assert_array_equal(first["labels"], out["labels"])
        np.testing.assert_array_equal(mmpipe.encode(row, processor=proc)["labels"], out["labels"])
