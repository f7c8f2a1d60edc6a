"""How a command stops early (`mmpipe.cli.stops`): SIGTERM runs the cleanup Ctrl-C runs, Ctrl-C
while `judge ping` waits for a server is a message, and a pipe whose reader left (``| head``)
ends every command quietly.

Each command runs as a real process in a session of its own; a hang past HANG_S kills its group
and fails the test. Nothing is timed: the signal is sent once the process is where it waits (the
staging directory exists and it is blocked opening a FIFO with no writer; the server holds the
request it got).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from judge_server import JudgeServer, ok, valid_answers
from mmpipe.testing import tiny_image

HANG_S = 180  # a child still running after this long has hung (a guard, not a timing)


def _default_sigint() -> None:
    """In the child before it runs: Ctrl-C's default action, as a terminal gives a command. A test
    run started in the background (``cmd &`` in a script, nohup) hands its children SIGINT ignored,
    which Python then keeps: Ctrl-C would not reach the command at all (it then waited out
    --timeout and exited 1: a red run that said nothing of the code)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args, *, stdout=subprocess.PIPE, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmpipe.cli.main", *map(str, args)], stdout=stdout,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                            preexec_fn=_default_sigint)


def _finish(child: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail("the command hung")
    return child.returncode, err


def _wait_for(what, cond, child: subprocess.Popen) -> None:
    """Poll until ``cond()`` (the child still running); HANG_S bounds it."""
    end = time.monotonic() + HANG_S
    while not cond():
        if child.poll() is not None:
            pytest.fail(f"the command ended (status {child.returncode}) before {what}: {child.stderr.read()[-2000:]}")
        if time.monotonic() > end:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            pytest.fail(f"never saw {what}")
        time.sleep(0.05)


def _reader_gone():
    """A pipe whose read end is already closed: the child's first write fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    return w


def _encode_tmp(tmp: Path) -> list:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("mmpipe-encode-"))


def test_sigterm_during_encode_removes_the_staging_dir_and_temp_files(tmp_path):
    fifo, out, tmp = tmp_path / "rows.jsonl", tmp_path / "enc", tmp_path / "tmp"
    os.mkfifo(fifo)  # no writer: the encode blocks opening it, after it made its staging dir
    tmp.mkdir()
    child = _start(["encode", fifo, "--processor", "testing:qwen2_vl", "--out", out, "--quiet"],
                   env={**os.environ, "TMPDIR": str(tmp)})
    _wait_for("the staging directory and the temporary directory",
              lambda: any(p.name.startswith(".enc.partial-") for p in tmp_path.iterdir()) and _encode_tmp(tmp), child)
    os.kill(child.pid, signal.SIGTERM)
    code, err = _finish(child)
    # before: killed by the signal (-15), `.enc.partial-PID` and TMPDIR/mmpipe-encode-* left behind
    assert code == 143, err[-2000:]
    assert "mmpipe encode: terminated (SIGTERM); --out was left as it was" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "tmp"]
    assert _encode_tmp(tmp) == []  # (torch may leave its own cache folder there)


@pytest.fixture
def frame(tmp_path) -> Path:
    path = tmp_path / "frame.png"
    tiny_image(32, 48, seed=3).save(path)
    return path


def _ping_args(server, frame, *extra):
    return ["judge", "ping", "--base-url", server.base_url, "--model", "judge-model", "--image", frame,
            "--retries", "0", *extra]


def test_ctrl_c_while_judge_ping_waits_for_the_server_is_a_message(frame):
    with JudgeServer(lambda request, index: ok({"reasonable": True}, delay=HANG_S), max_delay_s=HANG_S) as server:
        child = _start(_ping_args(server, frame))
        _wait_for("the request at the server", lambda: len(server.requests) > 0, child)
        os.kill(child.pid, signal.SIGINT)
        code, err = _finish(child)
    # before: a KeyboardInterrupt traceback
    assert code == 130, err[-2000:]
    assert "mmpipe judge ping: interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("json_out", [False, True])
def test_judge_ping_into_a_closed_pipe_ends_quietly(frame, json_out):
    with JudgeServer(valid_answers) as server:
        w = _reader_gone()
        child = _start(_ping_args(server, frame, *(["--json"] if json_out else [])), stdout=w)
        os.close(w)
        code, err = _finish(child)
    assert "Traceback" not in err, err[-2000:]  # before: BrokenPipeError
    assert code == 0  # both answers valid: the status says so with or without a reader


def test_demo_into_a_closed_pipe_ends_quietly_with_the_checks_status():
    w = _reader_gone()
    child = subprocess.Popen([sys.executable, "-m", "mmpipe.cli.main", "demo", "--rows", "2", "--num-proc", "1",
                              "--workers", "0"], stdout=w, stderr=subprocess.PIPE, text=True, start_new_session=True)
    os.close(w)
    code, err = _finish(child)
    assert "Traceback" not in err, err[-2000:]  # before: BrokenPipeError from the first print, status 1
    assert code == 0


@pytest.mark.parametrize("command", ["inspect", "validate"])
def test_data_commands_into_a_closed_pipe_end_quietly(tmp_path, command):
    """A guard (these already ended quietly): the shared `reader_left` keeps them so."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "Name a prime."}, '
                    '{"role": "assistant", "content": "Seven."}]}\n')
    code, err = _finish(_start(["encode", rows, "--processor", "testing:qwen2_vl", "--out", tmp_path / "enc",
                                "--quiet"]))
    assert code == 0, err[-2000:]
    w = _reader_gone()
    child = _start([command, tmp_path / "enc"], stdout=w)
    os.close(w)
    code, err = _finish(child)
    assert code == 0 and "Traceback" not in err, err[-2000:]
