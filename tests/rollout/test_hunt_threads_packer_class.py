"""Thread concurrency (hunt): threads racing the first use of a packer class (a Ray actor with
max_concurrency > 1 building its packers, a threaded server's first requests) each built a class of
their own (``functools.lru_cache`` does not lock its misses); the module then answered one of them,
so a packer made from another was no ``QwenVLDataPacker`` for ``isinstance`` and pickle refused it
("not the same object as mmpipe.rollout.packers.QwenVLDataPacker"). Counted, not timed: a barrier,
the switch interval shortened."""

from __future__ import annotations

import pickle

from mmpipe.rollout import cosmos_side, packers

from helpers import run_threads


def _fresh_process(monkeypatch) -> None:
    """The classes as in a new process: none built yet (restored after the test)."""
    if hasattr(cosmos_side, "_BUILT"):
        monkeypatch.setattr(cosmos_side, "_BUILT", {})
    else:  # the old code: its lru_cache
        packers.packer_class.cache_clear()


def test_threads_racing_the_first_use_get_one_class(monkeypatch):
    wrong = []
    for trial in range(100):  # old code: 269 of 300 rounds gave a thread another class
        _fresh_process(monkeypatch)
        got = []
        run_threads(lambda t: got.append(packers.QwenVLDataPacker), 4)
        final = packers.QwenVLDataPacker
        if any(cls is not final for cls in got):
            wrong.append(trial)
            packer = next(cls for cls in got if cls is not final)()
            assert isinstance(packer, final), "a packer of the losing class is no QwenVLDataPacker"
    assert wrong == []
    assert type(pickle.loads(pickle.dumps(final()))) is final
    assert issubclass(final, packers.DataPacker)
