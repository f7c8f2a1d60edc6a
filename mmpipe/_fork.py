"""Know whether this process is a fork() child of the one that imported mmpipe, and locks
that a fork() child makes anew (`ForkSafeLock`).

torch's intra-op thread pool does not survive fork(): a forked child (``datasets.map`` with
``num_proc``, ``multiprocessing``) whose parent already ran a parallel torch op deadlocks in
its first parallel op. DataLoader workers avoid this by dropping to one thread; mmpipe does
the same, lazily, before its own torch ops in a forked child. The marker is registered when
mmpipe is imported (no torch import here), i.e. before any worker is forked.
"""

from __future__ import annotations

import os
import threading
import weakref

_forked_child = False
_LOCKS: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


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
