"""Split a sampler's batches until their count is a multiple of the rank count
(`TokenBudgetBatchSampler`'s step before handing each rank the same number of batches).

The rule: repeatedly split the batch with the most rows (ties: the highest cost, then the
first in order) into two halves placed side by side (the global row order is kept), until
the count is a multiple of ``R``. Up to ``R - 1`` splits; rescanning every batch for each
split cost O(R * B) (64 ranks over 10^5 batches: ~2 s an epoch, most of it the cost of every
tied batch computed again on each split). Here: the costs in one vectorised pass, a heap
ordered by (most rows, highest cost, position), O(B + R log B).
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import Callable

import numpy as np


def batch_costs(batches: list[list[int]], lengths: np.ndarray, cost: str) -> list[int]:
    """Each batch's cost, as `TokenBudgetBatchSampler._cost` computes it: ``"packed"`` the sum
    of its row lengths, ``"padded"`` rows * longest (an empty batch: 0). lengths: int64 [n]."""
    sizes = np.fromiter((len(b) for b in batches), np.int64, len(batches))
    out = np.zeros(len(batches), np.int64)
    full = np.flatnonzero(sizes)
    if len(full):
        rows = np.fromiter(chain.from_iterable(batches), np.int64, int(sizes.sum()))
        L = lengths[rows]
        starts = (np.cumsum(sizes) - sizes)[full]
        out[full] = (np.add.reduceat(L, starts) if cost == "packed"
                     else sizes[full] * np.maximum.reduceat(L, starts))
    return out.tolist()


def split_to_multiple(batches: list[list[int]], R: int, cost: Callable[[list[int]], int],
                      costs: list[int]) -> tuple[list[list[int]], bool]:
    """``(batches after the splits, True)`` when their count became a multiple of ``R``, or
    ``(batches so far, False)`` when the batch to split next has one row (the caller's
    ``uneven`` rule then decides). ``cost``: a batch's cost; ``costs``: the given batches' costs.
    The given lists are not changed."""
    splits = -len(batches) % R
    if not splits:
        return [list(b) for b in batches], True
    # position of a piece: (its batch's index, its path of halves: 0 first, 1 second); in-order
    # leaves of the split tree sort as their paths do, so positions order as the list would
    heap = [(-len(b), -c, (j,), b) for j, (b, c) in enumerate(zip(batches, costs))]
    heapq.heapify(heap)
    split: set[int] = set()  # indices of the given batches that were split
    done = True
    for _ in range(splits):
        n, _c, pos, b = heap[0]
        if -n < 2:
            done = False
            break
        heapq.heappop(heap)
        halves = (b[: len(b) // 2], b[len(b) // 2:])
        for side, half in enumerate(halves):
            heapq.heappush(heap, (-len(half), -cost(half), pos + (side,), half))
        split.add(pos[0])
    if not split:
        return [list(b) for b in batches], done
    alive: dict[int, list[tuple[tuple, list[int]]]] = {}
    for _n, _c, pos, b in heap:
        if pos[0] in split:
            alive.setdefault(pos[0], []).append((pos, b))
    out: list[list[int]] = []
    for j, b in enumerate(batches):
        if j in alive:
            out += [list(p) for _, p in sorted(alive[j], key=lambda t: t[0])]
        else:
            out.append(list(b))
    return out, done
