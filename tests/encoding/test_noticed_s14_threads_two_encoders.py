"""Two generic-path Encoders on one processor, used from threads (a training encoder serving rows
while a second one, e.g. ``labels=False`` prompts, is built and used for the first time).

A fresh Encoder finds its layout by probe calls, two with ``padding=True``: that sets the fast
tokenizer's padding (transformers' ``set_truncation_and_padding`` on the shared Rust backend), and a
plain call of the OTHER encoder from another thread resets it before the padded batch is tokenized,
so the probe's batch came back ragged (IndexError: tuple index out of range). 48f49f3 serialised the
probes of threads sharing one encoder; another encoder's plain calls still raced it. Now every
generic-path processor call is shared, a padded one exclusive (`mmpipe._fork.SharedCalls`).
Counted, not timed: the interpreter's switch interval shortened while threads loop."""

from __future__ import annotations

import sys
import threading

import pytest

import mmpipe
from mmpipe.testing import tiny_image

from conftest import processor_for
from helpers import run_child_group

pytest.importorskip("transformers")

PROBES = 20


def _row(k: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q" * (k + 1)}]},
                         {"role": "assistant", "content": "a" * (k + 1)}],
            "images": [tiny_image(64, 64, seed=k)]}


def test_a_fresh_encoders_probe_beside_another_encoders_calls():
    """Old code: failed 3 of 3 runs (IndexError from probes; 12 of 60 probes in one longer run), idefics3."""
    proc = processor_for("idefics3")
    rows = [_row(k) for k in range(4)]
    warm = mmpipe.Encoder(proc)
    ref = [warm.encode_row(r).input_ids.tolist() for r in rows]
    wrong, stop, done = [], threading.Event(), threading.Event()

    def plain(t: int) -> None:
        while not stop.is_set():
            try:
                if warm.encode_row(rows[t]).input_ids.tolist() != ref[t]:
                    wrong.append(("plain", t, "another row"))
            except Exception as e:  # noqa: BLE001 - what the race raised
                wrong.append(("plain", t, f"{type(e).__name__}: {e}"))

    def probes() -> None:
        for trial in range(PROBES):
            try:
                fresh = mmpipe.Encoder(proc, labels=False)
                fresh.layout()
                fresh.encode_row(rows[0])
            except Exception as e:  # noqa: BLE001 - what the race raised
                wrong.append(("probe", trial, f"{type(e).__name__}: {e}"))
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=plain, args=(t,), daemon=True) for t in range(1, 4)]
        threads.append(threading.Thread(target=probes, daemon=True))
        for t in threads:
            t.start()
        finished = done.wait(600)  # a hang guard only: the probes take seconds
    finally:
        stop.set()
        sys.setswitchinterval(old)
    for t in threads:
        t.join(60)
    assert finished, "the probes never finished: a deadlock"
    assert wrong == []


def test_shared_calls_held_by_another_thread_are_free_in_a_forked_child():
    """`SharedCalls` is renewed in a fork child, as `ForkSafeLock` (an exclusive call held by a parent's
    thread at the fork would block the child's every call)."""
    out = run_child_group("""
import os, threading
from mmpipe._fork import SharedCalls
calls, held, release = SharedCalls(), threading.Event(), threading.Event()
def hold():
    with calls.exclusive():
        held.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    with calls.shared():
        with calls.shared():
            pass
    with calls.exclusive():
        os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
assert os.waitstatus_to_exitcode(status) == 0
print("done")
""", 60, "a forked child waited on SharedCalls held by a parent's thread")
    assert "done" in out


def test_exclusive_waits_for_shared_calls_and_new_shared_ones_wait_for_it():
    """The ordering (events, no timing): an exclusive call starts only after the shared ones running
    finish, and a shared call asked for while it waits runs after it."""
    from mmpipe._fork import SharedCalls

    calls, order = SharedCalls(), []
    in_shared, release_shared, in_exclusive = threading.Event(), threading.Event(), threading.Event()

    def first():
        with calls.shared():
            in_shared.set()
            release_shared.wait()
            order.append("shared 1 ends")

    def writer():
        with calls.exclusive():
            in_exclusive.set()
            order.append("exclusive")

    def later():
        with calls.shared():
            order.append("shared 2")

    a = threading.Thread(target=first)
    a.start()
    in_shared.wait()
    w = threading.Thread(target=writer)
    w.start()
    while not calls._lock[2]:  # the exclusive call is waiting
        threading.Event().wait(0.001)
    b = threading.Thread(target=later)
    b.start()
    release_shared.set()
    for t in (a, w, b):
        t.join(60)
    assert order == ["shared 1 ends", "exclusive", "shared 2"]
