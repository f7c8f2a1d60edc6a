"""Row-parallel work (issue 34): `parallel_rows` shares rows out in pieces the threads take in turn
(each row exactly once, whatever thread is slow), and `thread_pool(k)` never runs more than k
tasks at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mmpipe.images import threads
from mmpipe.images.threads import CHUNK_ROWS, parallel_rows, thread_pool

from helpers import HANG_S


@pytest.mark.parametrize("n", [1, CHUNK_ROWS - 1, 3 * CHUNK_ROWS + 7, 40 * CHUNK_ROWS])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_row_once(n, k):
    seen = np.zeros(n, np.int64)
    lock = threading.Lock()

    def work(a, b):
        assert 0 <= a < b <= n
        with lock:
            seen[a:b] += 1

    parallel_rows(work, n, nbytes=1 << 40, threads=k)
    assert (seen == 1).all()


def test_a_slow_thread_takes_fewer_pieces():
    """The first piece a thread takes stalls it (another process on its core): the other
    thread takes the remaining pieces instead of waiting with a static half. The stalled
    piece is held until every other row has been taken (an event, not a sleep: a loaded
    machine cannot reorder it); a static split would leave rows untaken and fail the wait."""
    n = 16 * CHUNK_ROWS
    by_thread: dict = {}
    cond = threading.Condition()
    taken = [0, None]  # rows taken so far, the stalled thread

    def work(a, b):
        me = threading.get_ident()
        with cond:
            by_thread.setdefault(me, []).append((a, b))
            taken[0] += b - a
            cond.notify_all()
            if taken[1] is not None:
                return
            taken[1] = me  # the first piece: this thread is held back
            # a hang guard (HANG_S), not a timing: the wait ends when the other thread took the rest
            assert cond.wait_for(lambda: taken[0] == n, HANG_S), f"rows {taken[0]}/{n} taken: a static split"

    parallel_rows(work, n, nbytes=1 << 40, threads=2)
    assert len(by_thread) == 2 and len(by_thread[taken[1]]) == 1  # the stalled thread took one piece
    assert sum(len(v) for v in by_thread.values()) >= 3  # the other took all the others
    assert sum(b - a for v in by_thread.values() for a, b in v) == n


def test_errors_reach_the_caller():
    def work(a, b):
        if a > 0:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        parallel_rows(work, 8 * CHUNK_ROWS, nbytes=1 << 40, threads=2)


def test_sized_pool_bounds_concurrency():
    pool = thread_pool(2)
    assert thread_pool(2) is pool and thread_pool() is not pool
    active, peak = [0], [0]
    lock = threading.Lock()

    def task():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1

    for f in [pool.submit(task) for _ in range(8)]:
        f.result()
    assert peak[0] <= 2


def test_forked_child_forgets_the_pools():
    thread_pool(3)
    threads._forget_pool()
    assert threads._SIZED == {} and threads._POOL is None
