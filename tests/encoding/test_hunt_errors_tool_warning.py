"""A chat template that ignores tool use is reported once per cause, as docs/concepts/records.md
says ("mmpipe logs a warning once"), not once per `Encoder`.

``mmpipe.encode_row(row, processor, tools=...)`` builds an Encoder per call, so a torch Dataset whose
``__getitem__`` encodes its row that way logged "the chat template ignores tools" and "... ignores
tool_calls" on every row: before the fix two calls gave two warnings per cause.
"""

from __future__ import annotations

import logging

import mmpipe
from mmpipe.encoding import render

from encoding.test_tool_calls import TOOLS, _agent_chat, _images, _processor


def _warnings(caplog, field: str) -> int:
    return sum(f"ignores {field} (" in r.getMessage() for r in caplog.records)


def test_ignored_tools_are_logged_once_over_many_encoders(caplog):
    proc = _processor("qwen2_vl")
    row = {"messages": _agent_chat(0), "images": _images(1)}
    render._WARNED_TOOLS.clear()
    with caplog.at_level(logging.WARNING, logger="mmpipe.encoding.encoder"):
        for _ in range(3):
            mmpipe.encode_row(row, proc, tools=TOOLS)
        mmpipe.Encoder(proc, tools=TOOLS).encode_row(row)
    assert _warnings(caplog, "tool_calls") == 1 and _warnings(caplog, "tools") == 1


def test_another_template_is_reported_again(caplog):  # guard: once per template, not once for all
    proc = _processor("qwen2_vl")
    other = _processor.__wrapped__("qwen2_vl")  # a new one (the helper caches its processors)
    other.chat_template = other.tokenizer.chat_template = proc.chat_template + "{# another template #}"
    row = {"messages": _agent_chat(0), "images": _images(1)}
    render._WARNED_TOOLS.clear()
    with caplog.at_level(logging.WARNING, logger="mmpipe.encoding.encoder"):
        mmpipe.encode_row(row, proc, tools=TOOLS)
        mmpipe.encode_row(row, other, tools=TOOLS)
    assert _warnings(caplog, "tools") == 2
