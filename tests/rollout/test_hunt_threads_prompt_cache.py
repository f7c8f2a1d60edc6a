"""Thread concurrency (hunt): one cosmos-rl packer serves concurrent calls (a threaded rollout server,
a Ray actor with max_concurrency > 1), so its prompt cache (`PromptCache`) is used from many threads
at once. Before it had a lock, a hit's ``move_to_end`` raced another call's eviction (a bare
``KeyError: <id>`` out of ``encode_prompt``) and the byte count lost updates (it drifted away from the
bytes really held: up, and the cache evicts everything; down, and it holds past its bound). Counted,
not timed: threads released together by a barrier, the switch interval shortened to widen the races."""

from __future__ import annotations

import pickle

import numpy as np

from mmpipe.rollout import cosmos_side
from mmpipe.rollout.cosmos_side import PromptCache

from helpers import run_threads


def _hammer(cache: PromptCache, items: list, rows: list, threads: int = 8, rounds: int = 1500) -> list:
    errors = []

    def work(t: int) -> None:
        try:
            for i in range(rounds):
                k = (t * 7 + i) % len(items)
                hit = cache.get(items[k])
                if hit is None:
                    cache.put(items[k], rows[k])
                elif hit is not rows[k]:
                    errors.append(f"item {k} got another item's row")
        except Exception as e:  # noqa: BLE001 - what the race raised
            errors.append(f"{type(e).__name__}: {e}")

    run_threads(work, threads)
    return errors


def test_prompt_cache_shared_by_threads(monkeypatch):
    monkeypatch.setattr(PromptCache, "MAX_ENTRIES", 3)  # most calls evict: hits race evictions
    items = [[{"role": "user", "content": f"q{k}"}] for k in range(7)]
    rows = [np.zeros(100 + 10 * k, np.uint8) for k in range(7)]
    cache = PromptCache()
    for _ in range(4):
        errors = _hammer(cache, items, rows)
        assert errors == []  # was: KeyError: <id> from move_to_end
    held = sum(e[3] for e in cache._entries.values())
    assert cache._bytes == held  # was: lost updates, e.g. 19283 counted for 5259 held
    assert cache.get(items[0]) is None or cache.get(items[0]) is rows[0]


def test_prompt_cache_byte_bound_holds_under_threads(monkeypatch):
    """The byte bound (the memory hunt's fix) still holds with threads: the count is exact, so the
    cache never keeps more than MAX_BYTES past its newest entry, and still keeps several entries."""
    monkeypatch.setattr(PromptCache, "MAX_BYTES", 4000)
    items = [[{"role": "user", "content": f"q{k}"}] for k in range(12)]
    rows = [np.zeros(900 + k, np.uint8) for k in range(12)]
    cache = PromptCache()
    _hammer(cache, items, rows, rounds=2000)
    held = sum(e[3] for e in cache._entries.values())
    assert cache._bytes == held and held <= 4000 + 1000
    for it, row in zip(items[:4], rows[:4]):  # single-threaded afterwards: several entries fit again
        cache.put(it, row)
    assert len(cache) >= 3


def test_a_pickled_cache_is_empty_and_usable():
    """The lock does not travel: a packer is pickled (Ray, cosmos-rl); its cache comes back empty
    (entries are keyed by this process's object ids)."""
    cache = PromptCache()
    it = [{"role": "user", "content": "q"}]
    cache.put(it, np.zeros(10, np.uint8))
    back = pickle.loads(pickle.dumps(cache))
    assert len(back) == 0 and back.get(it) is None
    back.put(it, np.zeros(10, np.uint8))
    assert len(back) == 1 and cosmos_side.PromptCache is type(back)
