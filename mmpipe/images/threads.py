"""The shared image thread pool (fork-safe) and row-parallel helpers."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional





CHUNK_ROWS = 512  # patch rows per gather: ~200-400 KB of output, cache-resident
_MIN_BYTES_PER_THREAD = 16 << 20


_PIECES_PER_THREAD = 8  # dynamic split: a thread the OS holds back takes fewer pieces


def parallel_rows(work, n: int, nbytes: int, threads: Optional[int]) -> None:
    """Run ``work(r0, r1)`` over row ranges covering 0..n, on up to ``threads`` threads.

    The rows are cut into ~8 pieces per thread (whole `CHUNK_ROWS`) that the threads take in
    turn: on a shared machine a thread descheduled for a while (another process on its core)
    then delays the call by one piece, not by its whole static share (issue 34: a collate's
    2-thread expansion swung with the load of the other core)."""
    k = default_threads() if threads is None else max(1, int(threads))
    k = min(k, max(1, nbytes // _MIN_BYTES_PER_THREAD), max(1, n // CHUNK_ROWS))
    if k <= 1:
        work(0, n)
        return
    step = -(-n // (k * _PIECES_PER_THREAD))
    step = -(-step // CHUNK_ROWS) * CHUNK_ROWS
    pieces = iter([(s, min(n, s + step)) for s in range(0, n, step)])
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                piece = next(pieces, None)
            if piece is None:
                return
            work(*piece)

    futures = [thread_pool().submit(drain) for _ in range(k - 1)]
    try:
        drain()
    finally:
        for f in futures:
            f.result()


# ---- worker threads --------------------------------------------------------------------
# PIL's decode and resize and numpy's gather release the GIL, so threads give real
# parallelism for them. The pool is made on first use and forgotten in a forked child
# (its threads do not exist there).
_POOL = None


_POOL_LOCK = threading.Lock()


def default_threads() -> int:
    """Threads mmpipe uses for image work in this process: 1 in a forked worker process
    (``datasets.map(num_proc=...)``, DataLoader workers: the processes already share the
    cores), else torch's intra-op thread count when torch is loaded (``torch.set_num_threads``
    governs it), else the usable CPU count; at most 8. ``MMPIPE_THREADS`` overrides it."""
    env = os.environ.get("MMPIPE_THREADS")
    if env:
        return max(1, int(env))
    from mmpipe import _fork

    if _fork._forked_child:
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return max(1, min(8, torch.get_num_threads()))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


_SIZED: dict = {}  # workers -> a pool of exactly that many threads


def thread_pool(workers: Optional[int] = None) -> ThreadPoolExecutor:
    """The shared pool (8 threads), or with ``workers`` a shared pool of exactly that many
    threads: work submitted there never runs on more threads at once (issue 34: an encode
    call with ``threads=2`` had up to 6-8 image decodes in flight on the 8-thread pool)."""
    global _POOL
    with _POOL_LOCK:
        if workers is not None:
            k = max(1, min(8, int(workers)))
            if k not in _SIZED:
                _SIZED[k] = ThreadPoolExecutor(max_workers=k, thread_name_prefix=f"mmpipe{k}")
            return _SIZED[k]
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mmpipe")
        return _POOL


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK, _SIZED
    _POOL = None
    _SIZED = {}
    _POOL_LOCK = threading.Lock()



if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
