"""``mmpipe judge ping`` against the loopback server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmpipe.cli.main import main
from mmpipe.testing import tiny_image

from judge_server import ACTION_OK, ok, server  # noqa: F401  (fixture)


@pytest.fixture
def frame_path(tmp_path):
    path = tmp_path / "frame.png"
    tiny_image(24, 32, seed=3).save(path)
    return str(path)


def test_ping_as_a_module_prints_answers_reward_latency(server, frame_path):
    cmd = [sys.executable, "-m", "mmpipe.cli.main", "judge", "ping", "--base-url", server.base_url,
           "--model", "judge-model", "--image", frame_path, "--task", "stack the cubes", "--primitive", "grasp"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "reasonable=True" in text and "confidence=0.9" in text and repr(ACTION_OK["reason"]) in text
    assert "progress=0.5" in text and "stage='approaching'" in text
    # bonus_only, first frame (no previous progress): 0.5 * (0.5 * 0.9 + 0.5 * 0) = 0.225
    assert "reward    0.2250" in text
    assert "latency" in text and " ms" in text
    assert "(32x24, image/png)" in text
    assert [r.kind for r in server.requests] == ["action", "progress"]
    assert server.requests[0].field("The robot selected") == "grasp"


def test_ping_json_with_previous_progress(server, frame_path, capsys):
    status = main(["judge", "ping", "--base-url", server.base_url, "--model", "judge-model", "--image", frame_path,
                   "--prev-progress", "0.2", "--json"])
    assert status == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] and out["reasonable"] is True and out["progress"] == 0.5
    assert out["reward"] == pytest.approx(0.3) and out["latency_s"] > 0 and out["primitive"] == "reach"


def test_ping_reports_an_invalid_answer(server, frame_path, capsys):
    server.reset(lambda r, i: ok("no idea"))
    status = main(["judge", "ping", "--base-url", server.base_url, "--model", "judge-model", "--image", frame_path])
    text = capsys.readouterr().out
    assert status == 1
    assert "INVALID" in text and "raw answer: 'no idea'" in text and "valid     False" in text


def test_ping_needs_an_image_file(tmp_path, capsys):
    status = main(["judge", "ping", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--image", str(tmp_path / "missing.png")])
    assert status == 2 and "is not a file" in capsys.readouterr().err
