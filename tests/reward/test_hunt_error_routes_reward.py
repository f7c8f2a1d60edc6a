"""The judge's safety net counts what it makes invalid (error-routes hunt).

An unexpected error while asking (a bug: an earlier one was ``time.sleep(nan)`` on a
``Retry-After: nan``) is logged and the frame's answers come back invalid so training goes on. They
were not counted in ``stats.invalid`` (``invalid_rate`` stayed 0 while every frame scored neutral),
and an action answer the server had already given validly was thrown away with them."""

from __future__ import annotations

import pytest

from mmpipe.reward import JudgeClient, VLMJudge
from mmpipe.testing import tiny_image

from judge_server import server  # noqa: F401  (fixture)


def test_an_unexpected_error_is_counted_invalid_and_keeps_the_answer_given(server, monkeypatch):  # noqa: F811
    import mmpipe.reward.judge as judge_module

    def broken(text):
        raise RuntimeError("a bug in the progress parser")

    server.reset()
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model", timeout_s=30, max_retries=0),
                     task="stack the red cube", primitives=["reach", "grasp"])
    monkeypatch.setattr(judge_module, "parse_progress", broken)
    answers = judge.ask(tiny_image(12, 16, seed=1), "grasp")
    assert answers.action.error is None and answers.action.value is not None  # the server's valid verdict
    assert answers.progress.error == "unexpected RuntimeError: a bug in the progress parser"
    snap = judge.stats.snapshot()
    assert (snap["queries"], snap["invalid"]) == (2, 1)
    assert judge.stats.scalars()["judge/invalid_rate"] == pytest.approx(0.5)
