"""Judge statistics as scalars and in TensorBoard (issue 15.6): a real judge against the loopback
server (valid answers, a scripted 500, a cached repeat), its counters written with
``JudgeStats.log_to`` through a real ``torch.utils.tensorboard.SummaryWriter`` and read back from
the event file with TensorBoard's own reader."""

from __future__ import annotations

import pytest

from mmpipe.reward.stats import JudgeStats, tensorboard_writer
from mmpipe.testing import tiny_image

from judge_server import sequence, server, status  # noqa: F401  (fixture)
from test_judge_server import make_judge

FRAMES = [tiny_image(12, 16, seed=s) for s in range(3)]


def _judged(server):
    server.reset(sequence(status(500)))  # the first request fails once, then valid answers
    judge = make_judge(server, max_retries=2)
    judge.judge_many(FRAMES, ["grasp"] * 3, ["stack"] * 3, [0.2] * 3)
    judge.judge(FRAMES[0], "grasp", task="stack", prev_progress=0.2)  # a cache hit (both questions)
    return judge


def test_scalars_are_the_snapshot_flat(server):
    judge = _judged(server)
    snap, sc = judge.stats.snapshot(), judge.stats.scalars()
    assert sc["judge/queries"] == snap["queries"] == 8 and sc["judge/cache_hits"] == snap["cache_hits"] == 2
    assert sc["judge/retries"] == 1 and sc["judge/http_errors/500"] == 1 and sc["judge/requests"] == 7
    assert sc["judge/cache_hit_rate"] == pytest.approx(2 / 8) and sc["judge/invalid_rate"] == 0.0
    assert sc["judge/latency_s/p50"] == pytest.approx(snap["latency_s"]["p50"])
    assert "judge/latency_s/p50" not in JudgeStats().scalars()  # no latency before the first answer


def test_log_to_tensorboard_round_trip(server, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    judge = _judged(server)
    writer = tensorboard_writer(tmp_path)
    first = judge.stats.log_to(writer, step=1)
    judge.judge(FRAMES[1], "lift", prev_progress=0.4)  # a new primitive: asked again
    second = judge.stats.log_to(writer, step=2, prefix="reward/judge/")
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"judge/queries", "judge/http_errors/500", "reward/judge/queries"} <= tags
    for tag, value in first.items():
        (event,) = acc.Scalars(tag)
        assert event.step == 1 and event.value == pytest.approx(value)
    assert acc.Scalars("reward/judge/queries")[0].value == second["reward/judge/queries"] == 10
