"""Guard (noticed s10: "`warn_ignored_tools` may warn twice"): since 44b62c9 the warning that a chat
template ignores tool use is keyed per process on (processor class, template, kwargs, cause) under a
lock, so fresh Encoders on one processor, each thread's first call at once, log each cause once.
Counted, not timed: a barrier, the switch interval shortened (`helpers.run_threads`)."""

from __future__ import annotations

import logging

import mmpipe
from mmpipe.encoding import render

from encoding.test_tool_calls import TOOLS, _agent_chat, _images, _processor
from helpers import run_threads


def test_fresh_encoders_on_threads_log_each_ignored_cause_once(caplog):
    proc = _processor("qwen2_vl")
    row = {"messages": _agent_chat(0), "images": _images(1)}
    counts = []
    with caplog.at_level(logging.WARNING, logger="mmpipe.encoding.encoder"):
        for _ in range(10):
            render._WARNED_TOOLS.clear()
            caplog.clear()
            run_threads(lambda t: mmpipe.Encoder(proc, tools=TOOLS).encode_row(row), 8)
            messages = [r.getMessage() for r in caplog.records]
            counts.append(tuple(sum(f"ignores {f} (" in m for m in messages) for f in ("tools", "tool_calls")))
    assert counts == [(1, 1)] * 10
