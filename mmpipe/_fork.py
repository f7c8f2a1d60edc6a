"""Know whether this process is a fork() child of the one that imported mmpipe, and locks
that a fork() child makes anew (`ForkSafeLock`, `SharedCalls`).

torch's intra-op thread pool does not survive fork(): a forked child (``datasets.map`` with
``num_proc``, ``multiprocessing``) whose parent already ran a parallel torch op deadlocks in
its first parallel op. DataLoader workers avoid this by dropping to one thread; mmpipe does
the same, lazily, before its own torch ops in a forked child. The marker is registered when
mmpipe is imported (no torch import here), i.e. before any worker is forked.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

_forked_child = False
_LOCKS: "weakref.WeakSet" = weakref.WeakSet()  # ForkSafeLock, SharedCalls


class ForkSafeLock:
    """A ``threading.Lock`` (``reentrant``: an ``RLock``) made anew in a forked child, where a
    parent's thread may have held it at the fork (the child would wait on it forever). Used as
    ``with lock:``."""

    def __init__(self, reentrant: bool = False):
        self._make = threading.RLock if reentrant else threading.Lock
        self._lock = self._make()
        _LOCKS.add(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc) -> None:
        self._lock.__exit__(*exc)


class SharedCalls:
    """Calls that may run together (``with calls.shared():``) unless one needs them all to wait
    (``with calls.exclusive():``: it waits for those running, and new shared ones wait for it). For
    state a call sets on a shared object (a fast tokenizer's padding, which ``padding=True`` sets and
    a plain call resets). Made anew in a forked child, as `ForkSafeLock`."""

    def __init__(self):
        self._lock = self._make()
        _LOCKS.add(self)

    @staticmethod
    def _make() -> list:
        return [threading.Condition(), 0, 0]  # condition, calls running (-1: an exclusive one), exclusive waiting

    @contextlib.contextmanager
    def shared(self):
        state = self._lock
        with state[0]:
            state[0].wait_for(lambda: state[1] >= 0 and not state[2])
            state[1] += 1
        try:
            yield
        finally:
            with state[0]:
                state[1] -= 1
                state[0].notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        state = self._lock
        with state[0]:
            state[2] += 1
            state[0].wait_for(lambda: state[1] == 0)
            state[1], state[2] = -1, state[2] - 1
        try:
            yield
        finally:
            with state[0]:
                state[1] = 0
                state[0].notify_all()


def _mark() -> None:
    global _forked_child
    _forked_child = True
    for lock in list(_LOCKS):
        lock._lock = lock._make()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark)


def torch_fork_safe() -> None:
    """In a forked child, run torch single-threaded (a no-op elsewhere)."""
    if _forked_child:
        import torch

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
