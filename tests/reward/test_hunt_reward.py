"""Hunt: reward-stage edge cases users bring (NaN previous progress, mismatched lengths)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmpipe.errors import ArgumentError
from mmpipe.records.reward import ActionVerdict, Answer, FrameAnswers, ProgressEstimate
from mmpipe.reward import JudgeClient, RewardConfig, VLMJudge
from mmpipe.reward.arithmetic import MODES, PROGRESS_TERMS, combine
from mmpipe.testing import tiny_image

from judge_server import server  # noqa: F401  (fixture)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("term", PROGRESS_TERMS)
@pytest.mark.parametrize("prev", [float("nan"), np.float32("nan"), None])
def test_nan_prev_progress_is_unknown_not_nan_reward(mode, term, prev):
    # score() writes NaN for an invalid progress; fed back as prev_progress it means "unknown"
    parts = combine(ActionVerdict(True, 0.8), ProgressEstimate(0.6), prev, RewardConfig(mode=mode, progress_term=term))
    assert parts.progress_term == 0.0 and math.isfinite(parts.reward)
    assert parts.reward == combine(ActionVerdict(True, 0.8), ProgressEstimate(0.6), None,
                                   RewardConfig(mode=mode, progress_term=term)).reward


def test_nan_prev_progress_with_invalid_progress_keeps_no_baseline():
    parts = combine(None, None, float("nan"), RewardConfig(mode="symmetric"))
    assert parts.reward == 0.0 and parts.baseline is None


def test_judge_many_refuses_prev_progress_of_other_length():
    judge = VLMJudge(JudgeClient("http://127.0.0.1:9", "m"))
    fa = FrameAnswers(Answer(ActionVerdict(True, 0.8)), Answer(ProgressEstimate(0.6)), 0.0)
    judge.ask_many = lambda images, prims, tasks=None: [fa] * len(images)
    with pytest.raises(ArgumentError, match="3 images and 1 prev_progress"):
        judge.judge_many([1, 2, 3], ["a"] * 3, None, [0.1])
    assert len(judge.judge_many([1, 2, 3], ["a"] * 3, None, [0.1, float("nan"), None])) == 3


def test_retry_after_nan_is_retried_with_the_backoff(server):  # noqa: F811  (fixture)
    # before: Retry-After "nan" -> time.sleep(nan) raised ValueError inside the client: the
    # frame came back "unexpected ValueError" and was never retried
    from judge_server import sequence, status

    server.reset(sequence(status(503, "busy", headers={"Retry-After": "nan"})))
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model", timeout_s=30, max_retries=2, backoff_s=0.01),
                     task="stack the red cube", primitives=["reach", "grasp"])
    r = judge.judge(tiny_image(12, 16, seed=1), "grasp")
    assert r.valid and r.action.attempts == 2 and r.action.error is None
    assert judge.stats.snapshot()["retries"] == 1


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(max_tokens=-5), dict(max_tokens=2.5),
                                dict(temperature=-0.5), dict(temperature=float("inf")), dict(top_logprobs=21)],
                         ids=["max_tokens0", "max_tokens-5", "max_tokens2.5", "temperature-0.5", "temperature-inf",
                              "top_logprobs21"])
def test_judge_client_refuses_settings_no_server_answers(kw):
    """Old: accepted, then every question failed at the server (or, max_tokens=0, came back
    empty and was scored as an unparsable verdict) with no word about the setting."""
    name = next(iter(kw))
    with pytest.raises(ArgumentError, match=f"JudgeClient: {name}=") as e:
        JudgeClient("http://127.0.0.1:9/v1", "judge-model", **kw)
    assert "e.g. JudgeClient(" in str(e.value)
    JudgeClient("http://127.0.0.1:9/v1", "judge-model", max_tokens=np.int64(8), temperature=np.float32(0.7))
