"""Complexity (hunt): `TokenBudgetBatchSampler._split_to_multiple` (batches split until every rank
gets the same number) rescanned every batch for each of its up to R - 1 splits and computed the
cost of every batch tied for the most rows again each time: O(R * B) (64 ranks, 120k batches:
~780k cost computations, 2 s a plan). It is a heap now (`mmpipe.batching.batch_split`).
Counted, not timed: the row lengths the sampler reads to plan an epoch."""

from __future__ import annotations

import numpy as np
import pytest

from mmpipe.batching.sampler import TokenBudgetBatchSampler


class CountingLengths(np.ndarray):
    """Row lengths that count how many elements the sampler reads from them."""

    reads = 0

    def __getitem__(self, key):
        out = super().__getitem__(key)
        CountingLengths.reads += int(np.size(out))
        return out


def _old_split(sampler, batches, R):
    """The rule as the old scan applied it (the oracle): the batch with the most rows, ties the
    highest cost, then the first; None when the next one has one row (the uneven tail)."""
    batches = [list(b) for b in batches]
    while len(batches) % R:
        most = max(len(b) for b in batches)
        k = max((j for j, b in enumerate(batches) if len(b) == most), key=lambda j: sampler._cost(batches[j]))
        if len(batches[k]) < 2:
            return None, batches
        b = batches[k]
        batches[k:k + 1] = [b[: len(b) // 2], b[len(b) // 2:]]
    return batches, batches


def test_planning_reads_each_length_a_few_times_not_once_per_rank():
    R, per, B = 64, 4, 64 * 20 + 1  # B batches of 4 equal rows: all tied, 63 splits to a multiple of 64
    n = per * B
    s = TokenBudgetBatchSampler([10] * n, max_tokens=1000, max_rows=per, cost="packed", num_replicas=R, rank=3,
                                shuffle=False)
    s.lengths = s.lengths.view(CountingLengths)
    CountingLengths.reads = 0
    plan = list(s)
    # global batches read each length ~3 times; the old split read each again on each of the 63 splits
    assert CountingLengths.reads < 10 * n, f"{CountingLengths.reads} length reads for {n} rows"
    assert len(plan) == (B + 63) // R  # every rank the same number of steps


@pytest.mark.parametrize("cost", ["packed", "padded"])
def test_splits_equal_the_old_scan(cost):
    """Guard: the same batches, in the same order, as the old scan (random lengths, budgets,
    rank counts, resumes), and the uneven tail where it gave one."""
    rng = np.random.default_rng(0)
    checked = tails = 0
    for trial in range(150):
        n = int(rng.integers(1, 120))
        lengths = rng.integers(1, 60, n)
        R = int(rng.integers(2, 40))
        kw = dict(max_tokens=int(rng.integers(60, 400)), cost=cost, seed=trial,
                  max_rows=int(rng.integers(1, 9)) if trial % 2 else None)
        s = TokenBudgetBatchSampler(lengths, num_replicas=R, rank=0, uneven="drop", **kw)
        start = int(rng.integers(0, n)) if trial % 3 == 0 else 0
        units = s._remaining(s.global_batches(0), start)
        want, before_tail = _old_split(s, units, R)
        got = s._split_to_multiple(units, R, 0, start)
        if want is None:
            tails += 1
            want = s._uneven_tail(before_tail, R, 0, start)
        assert got == want, (trial, R)
        checked += 1
    assert tails and checked - tails
