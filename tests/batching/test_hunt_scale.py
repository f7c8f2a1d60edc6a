"""Cost in the size of the data, counted (never timed): TokenBudgetBatchSampler's packed batches
over a whole epoch (``bucket_size=None``) and the first-fit they must stay."""

from __future__ import annotations

import sys

import numpy as np

import mmpipe.batching.sampler as sampler_module
from mmpipe.batching.sampler import TokenBudgetBatchSampler


def _lines_run(fn) -> int:
    """Python lines executed in mmpipe/batching/sampler.py while ``fn()`` runs (its operation count)."""
    here, count = sampler_module.__file__, [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == here else None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count[0]


def _packed_lines(n: int) -> int:
    # rows of 60 tokens under a 100-token budget, one 1-token row: every batch keeps room for the
    # shortest row, so every batch stays open for the whole bucket
    lengths = [60] * (n - 1) + [1]
    s = TokenBudgetBatchSampler(lengths, max_tokens=100, cost="packed", bucket_size=None, shuffle=False)
    return _lines_run(s.global_batches)


def test_packed_whole_epoch_is_not_quadratic_in_rows():
    """First-fit over one bucket of the whole epoch scanned every open batch for every row (and
    rebuilt the open list each row): O(rows x batches), 54 s at 200k rows, hours at 10^6. Counted
    in executed lines: 4x the rows cost 15.8x before, 4.9x now (a max-tree, O(log n) a row)."""
    small, large = _packed_lines(200), _packed_lines(800)
    assert large < 7 * small, (small, large)


def _first_fit(lengths, images, order, max_tokens, max_images, max_rows):
    """The reference: each row (longest first) into the first batch with room, else a new one."""
    bins, tok, img = [], [], []
    for i in order:
        for b in range(len(bins)):
            if (tok[b] + lengths[i] <= max_tokens and (max_images is None or img[b] + images[i] <= max_images)
                    and (max_rows is None or len(bins[b]) < max_rows)):
                bins[b].append(i)
                tok[b] += lengths[i]
                img[b] += images[i]
                break
        else:
            bins.append([i])
            tok.append(lengths[i])
            img.append(images[i])
    return bins


def test_packed_batches_are_first_fit_decreasing():
    """Guard: the batches are exactly first-fit decreasing under the token, image and row budgets."""
    rng = np.random.default_rng(0)
    for case in range(300):
        n = int(rng.integers(1, 60))
        lengths, images = rng.integers(1, 50, n).tolist(), rng.integers(0, 4, n).tolist()
        max_tokens = int(rng.integers(50, 120))
        max_images = int(rng.integers(3, 9)) if case % 2 else None
        max_rows = int(rng.integers(1, 5)) if case % 3 == 0 else None
        s = TokenBudgetBatchSampler(lengths, images, max_tokens=max_tokens, max_images=max_images, max_rows=max_rows,
                                    cost="packed", bucket_size=None, shuffle=False)
        order = sorted(range(n), key=lambda i: -lengths[i])  # stable: equal lengths keep row order
        assert s.global_batches() == _first_fit(lengths, images, order, max_tokens, max_images, max_rows), case
