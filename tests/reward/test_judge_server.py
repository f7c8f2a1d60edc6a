"""The judge against a real loopback chat-completions server: answers, failures, retries,
timeouts, cache, counters and the request layout."""

from __future__ import annotations

import base64
import io
import pickle
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mmpipe.reward import JudgeClient, JudgePrompts, RewardConfig, VLMJudge
from mmpipe.testing import tiny_image

from judge_server import (
    ACTION_OK,
    PROGRESS_OK,
    by_kind,
    drop,
    ok,
    raw_body,
    sequence,
    server,  # noqa: F401  (fixture)
    status,
    valid_answers,
    verdict_logprobs,
)

FRAME = tiny_image(12, 16, seed=1)
# Defaults: bonus_only, weights 0.5/0.5, scale 0.5. With ACTION_OK (reasonable, c = 0.9),
# PROGRESS_OK (progress 0.5) and prev_progress 0.2: 0.5 * (0.5 * 0.9 + 0.5 * 0.3) = 0.3.
VALID_REWARD = 0.3


def make_judge(server, **client_kw) -> VLMJudge:
    # timeout_s: a generous request deadline, so that a loaded machine never turns a prompt
    # loopback answer into a timeout and a retry (the tests that want timeouts pass their own)
    opts = dict(timeout_s=30, max_retries=2, backoff_s=0.01, max_concurrency=4)
    opts.update(client_kw)
    return VLMJudge(JudgeClient(server.base_url, "judge-model", **opts), task="stack the red cube",
                    primitives=["reach", "grasp", "lift"])


def test_valid_answers(server):
    judge = make_judge(server)
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert r.valid and r.error is None and not r.cache_hit
    assert (r.action.value.reasonable, r.action.value.confidence, r.action.value.reason) == (
        True, 0.9, ACTION_OK["reason"])
    assert (r.progress.value.progress, r.progress.value.stage, r.progress.value.next_step) == (
        0.5, PROGRESS_OK["stage"], PROGRESS_OK["next_step"])
    assert r.reward == pytest.approx(VALID_REWARD)
    assert r.latency_s > 0 and r.action.attempts == r.progress.attempts == 1
    assert len(server.requests) == 2


def test_request_layout_image_first_question_last(server):
    judge = make_judge(server)
    judge.judge(FRAME, "grasp")
    action, progress = server.requests
    assert (action.kind, progress.kind) == ("action", "progress")
    for req in (action, progress):
        content = req.user_content
        assert [p["type"] for p in content] == ["image_url", "text"]
        assert req.body["model"] == "judge-model" and req.body["temperature"] == 0.0
        fmt = req.body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        assert set(fmt["json_schema"]["schema"]["required"]) == (
            {"reasonable", "confidence", "reason"} if req.kind == "action" else {"progress", "stage", "next_step"})
    # Same image part in both questions: the server's prefix cache serves the second one.
    assert action.user_content[0] == progress.user_content[0]
    url = action.image_url
    assert url.startswith("data:image/png;base64,")
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert np.array_equal(np.asarray(sent), np.asarray(FRAME))
    assert action.field("Task") == "stack the red cube" and action.field("The robot selected") == "grasp"
    assert "- reach\n- grasp\n- lift" in action.prompt
    assert progress.field("Task") == "stack the red cube"


@pytest.mark.parametrize("reply", [
    "```json\n" + '{"reasonable": true, "confidence": 0.9, "reason": "ok"}' + "\n```",
    'Sure. {"reasonable": true, "confidence": 0.9, "reason": "ok"} That is my answer.',
])
def test_fenced_or_wrapped_json_is_parsed(server, reply):
    fenced = {"progress": "```json\n" + '{"progress": 0.5, "stage": "s", "next_step": "n"}' + "\n```"}
    server.reset(by_kind(lambda r, i: ok(reply), lambda r, i: ok(fenced["progress"])))
    r = make_judge(server).judge(FRAME, "grasp", prev_progress=0.2)
    assert r.valid and r.action.raw == reply
    assert r.reward == pytest.approx(VALID_REWARD)


def test_garbage_gives_neutral_reward_and_keeps_raw_text(server):
    server.reset(lambda r, i: ok("I am not sure what the robot is doing."))
    judge = make_judge(server)
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert not r.valid and r.reward == 0.0
    assert r.action.raw == r.progress.raw == "I am not sure what the robot is doing."
    assert "no JSON object" in r.action.error and "no JSON object" in r.progress.error
    assert len(server.requests) == 2  # an unparsable answer is not retried
    s = judge.stats.snapshot()
    assert (s["queries"], s["invalid"], s["unparsable"], s["retries"]) == (2, 2, 2, 0)


@pytest.mark.parametrize("action, progress, needle, reward", [
    # action lacks confidence: its term is neutral, the progress term still counts: 0.5 * 0.5 * 0.3
    ({"reasonable": True}, PROGRESS_OK, "lacks ['confidence']", 0.075),
    # progress lacks its number: the progress term is neutral: 0.5 * 0.5 * 0.9
    (ACTION_OK, {"stage": "x", "next_step": "y"}, "lacks 'progress'", 0.225),
    ({"reason": "x"}, {"stage": "x"}, "lacks", 0.0),
])
def test_missing_fields(server, action, progress, needle, reward):
    server.reset(by_kind(lambda r, i: ok(action), lambda r, i: ok(progress)))
    r = make_judge(server).judge(FRAME, "grasp", prev_progress=0.2)
    assert not r.valid and needle in r.error
    assert r.reward == pytest.approx(reward)


def test_slow_answers_time_out_and_are_retried(server):
    server.reset(lambda r, i: ok(ACTION_OK, delay=2.0))
    judge = make_judge(server, timeout_s=0.2, max_retries=1)
    r = judge.judge(FRAME, "grasp")
    # counted, not timed: every attempt ended as a timeout (one that waited out the server's
    # 2 s would have its answer, valid), and each question was sent exactly twice
    assert not r.valid and r.reward == 0.0
    assert "timeout" in r.action.error and "after 2 attempts" in r.action.error
    s = judge.stats.snapshot()
    assert (s["timeouts"], s["retries"], s["requests"]) == (4, 2, 4)
    assert [q.kind for q in server.requests] == ["action", "action", "progress", "progress"]


def test_slow_once_then_fast_recovers(server):
    server.reset(sequence(ok(ACTION_OK, delay=1.0)))
    r = make_judge(server, timeout_s=0.2).judge(FRAME, "grasp", prev_progress=0.2)
    assert r.valid and r.action.attempts == 2 and r.reward == pytest.approx(VALID_REWARD)


@pytest.mark.parametrize("code", [500, 502, 503])
def test_5xx_is_retried(server, code):
    server.reset(sequence(status(code), status(code)))
    judge = make_judge(server)
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert r.valid and r.action.attempts == 3 and r.reward == pytest.approx(VALID_REWARD)
    assert judge.stats.snapshot()["http_errors"] == {code: 2}


def test_persistent_500_gives_neutral_reward(server):
    server.reset(lambda r, i: status(500, "engine dead"))
    judge = make_judge(server, max_retries=2)
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert not r.valid and r.reward == 0.0
    assert "HTTP 500" in r.action.error and "engine dead" in r.action.error and "after 3 attempts" in r.action.error
    assert len(server.requests) == 6


def test_429_is_retried_after_retry_after(server, monkeypatch):
    import mmpipe.reward.client as client_module

    waits: list = []  # the back-off the client chose before each retry (recorded, not timed)
    real_sleep = client_module._sleep
    monkeypatch.setattr(client_module, "_sleep", lambda seconds, cancelled: waits.append(seconds)
                        or real_sleep(seconds, cancelled))
    server.reset(sequence(status(429, "slow down", headers={"Retry-After": "0.3"})))
    judge = make_judge(server)
    r = judge.judge(FRAME, "grasp")
    assert r.valid and r.action.attempts == 2
    assert waits == [0.3]  # Retry-After, not the 0.01 s back-off
    assert judge.stats.snapshot()["retries"] == 1


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_4xx_is_never_retried(server, code):
    server.reset(by_kind(lambda r, i: status(code, "bad request: image too large"), valid_answers))
    judge = make_judge(server, max_retries=3)
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert not r.valid and r.action.attempts == 1
    assert f"HTTP {code}" in r.action.error and "image too large" in r.action.error
    assert [q.kind for q in server.requests] == ["action", "progress"]  # one request each
    assert r.progress.valid and r.reward == pytest.approx(0.5 * 0.5 * 0.3)
    assert judge.stats.snapshot()["retries"] == 0


def test_dropped_connection_is_retried(server):
    server.reset(sequence(drop(), drop()))
    judge = make_judge(server)
    r = judge.judge(FRAME, "grasp")
    assert r.valid and r.action.attempts == 3
    assert judge.stats.snapshot()["connection_errors"] == 2


def test_dropped_always_and_refused_give_invalid_results(server):
    server.reset(lambda r, i: drop())
    r = make_judge(server, max_retries=1).judge(FRAME, "grasp")
    assert not r.valid and "connection error" in r.action.error and r.reward == 0.0
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = VLMJudge(JudgeClient(f"http://127.0.0.1:{port}/v1", "m", timeout_s=0.5, max_retries=1, backoff_s=0.01))
    r = judge.judge(FRAME, "grasp")
    assert not r.valid and "connection error" in r.error and r.reward == 0.0


def test_non_json_http_body_is_invalid_not_raised(server):
    server.reset(by_kind(lambda r, i: raw_body("<html>502 proxy error</html>"), valid_answers))
    r = make_judge(server).judge(FRAME, "grasp")
    assert not r.valid and "unreadable response" in r.action.error and r.progress.valid and r.reward == 0.0
    assert r.action.raw == "<html>502 proxy error</html>" and r.action.attempts == 1


def test_cache_by_image_and_prompt(server):
    judge = make_judge(server)
    first = judge.judge(FRAME, "grasp")
    again = judge.judge(tiny_image(12, 16, seed=1), "grasp")  # equal pixels, new object
    assert not first.cache_hit and again.cache_hit and again.action.cached and again.action.latency_s == 0.0
    assert again.action.value == first.action.value and len(server.requests) == 2
    other_primitive = judge.judge(FRAME, "lift")  # new action prompt; same progress prompt
    assert not other_primitive.action.cached and other_primitive.progress.cached
    judge.judge(tiny_image(12, 16, seed=2), "grasp")  # new image: both asked
    assert len(server.requests) == 5
    s = judge.stats.snapshot()
    assert (s["queries"], s["cache_hits"], s["requests"]) == (8, 3, 5)
    assert s["latency_s"]["n"] == 5 and 0 < s["latency_s"]["p50"] <= s["latency_s"]["p99"] <= s["latency_s"]["max"]


def test_invalid_answers_are_not_cached(server):
    server.reset(sequence(ok("garbage"), ok("garbage")))
    judge = make_judge(server)
    assert not judge.judge(FRAME, "grasp").valid
    assert judge.judge(FRAME, "grasp").valid  # asked again, not served the failure
    assert len(server.requests) == 4


def test_prompts_are_overridable(server):
    prompts = JudgePrompts(action="Is {primitive} right for: {task}? Options: {primitives}. JSON please.",
                           progress="How far along is: {task}? JSON please.", system="You are a strict judge.")
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model"), task="open the door",
                     primitives={"reach": "move the gripper", "pull": "pull the handle"}, prompts=prompts)
    assert judge.judge(FRAME, "pull").valid
    action, progress = server.requests
    assert action.prompt == ("Is pull right for: open the door? Options: - reach: move the gripper\n"
                             "- pull: pull the handle. JSON please.")
    assert progress.prompt == "How far along is: open the door? JSON please."
    assert action.messages[0] == {"role": "system", "content": "You are a strict judge."}
    with pytest.raises(ValueError, match=r"JudgePrompts.progress: unknown field\(s\) \['goal'\]"):
        JudgePrompts(progress="{goal}")


def test_logprob_confidence(server):
    text = '{"reasonable": true, "confidence": 0.9, "reason": "ok"}'
    server.reset(by_kind(lambda r, i: ok(text, logprobs=verdict_logprobs(text, 0.7)), valid_answers))
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model", logprobs=True, top_logprobs=3),
                     reward=RewardConfig(mode="symmetric", confidence="logprobs"))
    r = judge.judge(FRAME, "grasp")
    assert server.requests[0].body["logprobs"] is True and server.requests[0].body["top_logprobs"] == 3
    assert r.action.value.p_true == pytest.approx(0.7)
    assert r.parts.binary == pytest.approx(0.7) and r.reward == pytest.approx(0.5 * 0.5 * 0.7)


def test_truncated_answer_says_raise_max_tokens(server):
    server.reset(lambda r, i: ok('{"reasonable": true, "confid', finish_reason="length"))
    r = make_judge(server).judge(FRAME, "grasp")
    assert not r.valid and "raise it" in r.action.error and "max_tokens=256" in r.action.error


@pytest.mark.parametrize("bad", [None, b"not an image", "/no/such/frame.png", np.zeros((4, 4, 3), np.float32)])
def test_bad_frames_never_raise(server, bad):
    r = make_judge(server).judge(bad, "grasp")
    assert not r.valid and r.reward == 0.0 and "bad frame" in r.action.error
    assert server.requests == []


def test_missing_primitive_asks_progress_only(server):
    r = make_judge(server).judge(FRAME, None, prev_progress=0.2)
    assert not r.valid and "no primitive" in r.action.error and r.progress.valid
    assert [q.kind for q in server.requests] == ["progress"]


def test_judge_pickles_with_settings_only(server):
    judge = make_judge(server)
    judge.judge(FRAME, "grasp")
    clone = pickle.loads(pickle.dumps(judge))
    assert clone.stats.snapshot()["queries"] == 0 and len(clone.cache) == 0
    assert clone.judge(FRAME, "grasp").valid and len(server.requests) == 4


def test_missing_openai_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install "mmpipe\[judge\]"'):
        JudgeClient("http://127.0.0.1:1/v1", "m")


def test_import_mmpipe_reward_does_not_import_openai():
    code = "import sys, mmpipe, mmpipe.reward, mmpipe.cli; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
