"""The dataset stage: ``ds.map(judge.score, batched=True)`` against the loopback server."""

from __future__ import annotations

import math
import re
from collections import Counter

import datasets
import pytest

from mmpipe.reward import JudgeClient, RewardConfig, VLMJudge
from mmpipe.records.reward import RESULT_KEYS
from mmpipe.testing import tiny_image

from judge_server import ACTION_OK, ok, overlapping, server, status, valid_answers  # noqa: F401  (fixture)

PRIMITIVES = ["reach", "grasp", "lift", "place"]


def row_answers(request, index, delay=0.0):
    """Answers that depend on the row (its task names it)."""
    i = int(re.search(r"row-(\d+)", request.field("Task")).group(1))
    if request.kind == "action":
        return ok({"reasonable": i % 3 != 0, "confidence": (i % 10) / 10, "reason": f"row-{i}"}, delay=delay)
    return ok({"progress": i / 1000, "stage": f"row-{i}", "next_step": "continue"}, delay=delay)


def expected_reward(i: int, prev) -> float:
    """By hand, symmetric mode, binary_weight 0.6, progress_weight 0.4, scale 0.5."""
    c = (i % 10) / 10
    action = c if i % 3 != 0 else -c
    term = 0.0 if prev is None else i / 1000 - prev
    return 0.5 * (0.6 * action + 0.4 * term)


def frames_dataset(n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {
            "image": [tiny_image(8, 8, seed=i) for i in range(n)],
            "task": [f"row-{i}" for i in range(n)],
            "primitive": [PRIMITIVES[i % 4] for i in range(n)],
            "prev_progress": [None if i % 5 == 0 else i / 1000 - 0.05 for i in range(n)],
        },
        features=datasets.Features({"image": datasets.Image(), "task": datasets.Value("string"),
                                    "primitive": datasets.Value("string"),
                                    "prev_progress": datasets.Value("float64")}),
    )


def test_500_frames_concurrency_16_one_result_per_row_in_order(server):
    n = 500
    # the first answers wait until 16 requests are in flight at once (a rendezvous: before, a 50 ms
    # delay had to outlast sending 16 requests, which a loaded machine need not do), so the
    # client's bound, not the CPU, limits what is in flight
    server.reset(overlapping(server, 16, row_answers))
    # timeout_s: a hang bound; the held first answers wait for the rendezvous, on a loaded machine too
    client = JudgeClient(server.base_url, "judge-model", max_concurrency=16, timeout_s=60, backoff_s=0.01)
    judge = VLMJudge(client, primitives=PRIMITIVES,
                     reward=RewardConfig(mode="symmetric", binary_weight=0.6, progress_weight=0.4))
    ds = frames_dataset(n)
    out = ds.map(judge.score, batched=True, batch_size=100)

    assert len(out) == n
    assert out["task"] == [f"row-{i}" for i in range(n)]  # input columns untouched, in order
    assert out["vlm_reason"] == [f"row-{i}" for i in range(n)]  # each row got its own answers
    assert out["vlm_stage"] == [f"row-{i}" for i in range(n)]
    assert all(out["vlm_valid"])
    prev = ds["prev_progress"]
    assert out["vlm_reward"] == pytest.approx([expected_reward(i, prev[i]) for i in range(n)], abs=1e-9)
    # Exactly one request per question per row: no duplicates, none lost.
    asked = Counter((r.field("Task"), r.kind) for r in server.requests)
    assert len(server.requests) == 2 * n and set(asked.values()) == {1}
    # Bounded, and really concurrent.
    assert server.max_in_flight == 16, server.max_in_flight
    s = judge.stats.snapshot()
    assert (s["queries"], s["requests"], s["invalid"], s["retries"]) == (2 * n, 2 * n, 0, 0)


def test_score_columns_and_defaults(server):
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model"), task="default task", output_prefix="j_")
    ds = datasets.Dataset.from_dict({"image": [tiny_image(8, 8, seed=i) for i in range(3)],
                                     "primitive": ["reach", None, "grasp"]})
    out = ds.map(judge.score, batched=True, batch_size=2)
    assert set(out.column_names) == {"image", "primitive", *(f"j_{k}" for k in RESULT_KEYS)}
    assert out["j_valid"] == [True, False, True]  # a row without a primitive: action answer invalid
    assert "no primitive" in out["j_error"][1] and out["j_progress"][1] == 0.5
    assert {r.field("Task") for r in server.requests} == {"default task"}
    with pytest.raises(KeyError, match=r"no image column 'image'; found columns \['frame'\]"):
        judge.score({"frame": [None]})


def test_first_batch_of_failures_keeps_column_types(server):
    # Arrow fixes a column's type from the first batch: all-None columns there would break
    # every later batch. Invalid answers are stored as NaN / "" / False instead.
    server.reset(lambda r, i: status(400, "warming up") if i < 4 else valid_answers(r, i))
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model", max_concurrency=1))
    ds = datasets.Dataset.from_dict({"image": [tiny_image(8, 8, seed=i) for i in range(4)],
                                     "primitive": ["reach"] * 4})
    out = ds.map(judge.score, batched=True, batch_size=2)
    assert out["vlm_valid"] == [False, False, True, True]
    assert out["vlm_action_valid"] == [False, False, True, True]
    assert out["vlm_reasonable"] == [False, False, True, True]
    assert out["vlm_reason"][:2] == ["", ""] and out["vlm_reason"][2] == ACTION_OK["reason"]
    assert math.isnan(out["vlm_progress"][0]) and out["vlm_progress"][2] == 0.5
    assert "HTTP 400" in out["vlm_error"][0] and out["vlm_error"][2] == ""
    assert out.features["vlm_progress"].dtype == "float64" and out.features["vlm_error"].dtype == "string"


def test_score_is_fingerprinted_by_settings():
    from datasets.fingerprint import Hasher

    def judge(model):
        return VLMJudge(JudgeClient("http://127.0.0.1:9/v1", model), task="t")

    # Hashable (no random fingerprint, so datasets can cache) and a function of the settings.
    assert Hasher.hash(judge("a").score) == Hasher.hash(judge("a").score) != Hasher.hash(judge("b").score)


def test_num_proc_2(server):
    judge = VLMJudge(JudgeClient(server.base_url, "judge-model", max_concurrency=4), primitives=PRIMITIVES)
    server.reset(row_answers)
    out = frames_dataset(12).map(judge.score, batched=True, batch_size=3, num_proc=2)
    assert out["vlm_reason"] == [f"row-{i}" for i in range(12)] and all(out["vlm_valid"])
    assert len(server.requests) == 24
