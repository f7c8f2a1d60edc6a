"""TokenBudgetBatchSampler as data-parallel users drive it: a resume on more ranks near an
epoch's end, an epoch whose rows cannot be shared evenly (``uneven``), and bad arguments and
states refused when given, with a typed error naming the fix."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from mmpipe.batching.sampler import TokenBudgetBatchSampler
from mmpipe.errors import ArgumentError


def _ranks(lengths, R, **kw):
    return [TokenBudgetBatchSampler(lengths, num_replicas=R, rank=r, **kw) for r in range(R)]


def _after(lengths, steps, **kw):
    """The state of a one-rank sampler after ``steps`` batches."""
    one = TokenBudgetBatchSampler(lengths, **kw)
    it = iter(one)
    for _ in range(steps):
        next(it)
    return one.state_dict(), [i for b in one.global_batches() for i in b]


def test_resume_on_more_ranks_with_one_row_left_continues():
    """Saved on 1 rank with 1 of 9 rows left, resumed on 2: refused with the fix named by default
    (it was refused with 'use more rows per epoch', which the saved state then refuses), and
    continued from the same state with uneven='drop' or 'repeat'."""
    lengths, kw = [10] * 9, dict(max_tokens=20, shuffle=False)
    state, order = _after(lengths, 4, **kw)
    assert state["consumed_rows"] == 8
    for s in (stuck := _ranks(lengths, 2, **kw)):
        s.load_state_dict(state)
    with pytest.raises(ArgumentError, match=r"resumed after 8 of its 9 rows.*uneven='drop'.*uneven='repeat'"):
        list(stuck[0])
    dropped = _ranks(lengths, 2, uneven="drop", **kw)
    for s in dropped:
        s.load_state_dict(state)
    assert [list(s) for s in dropped] == [[], []]
    repeated = _ranks(lengths, 2, uneven="repeat", **kw)
    for s in repeated:
        s.load_state_dict(state)
    assert [list(s) for s in repeated] == [[[order[8]]], [[order[0]]]]
    assert [s.state_dict()["consumed_rows"] for s in repeated] == [9, 9]
    repeated[0].set_epoch(1)
    assert len(repeated[0]) == len(repeated[0].batches(1)) > 0, "the next epoch starts whole"


@pytest.mark.parametrize("uneven", ["drop", "repeat"])
def test_rows_not_divisible_by_ranks_one_row_per_batch(uneven):
    """5 rows that fill a batch each, 2 ranks (batch size 1 per GPU): DistributedSampler's
    drop_last=True / False behaviour instead of an error."""
    ranks = _ranks([10] * 5, 2, max_tokens=10, seed=3, uneven=uneven)
    per_rank = [list(s) for s in ranks]
    order = [i for b in ranks[0].global_batches() for i in b]
    assert len(per_rank[0]) == len(per_rank[1]) == (2 if uneven == "drop" else 3)
    rows = Counter(i for rb in per_rank for b in rb for i in b)
    if uneven == "drop":
        assert sorted(rows) == sorted(order[:4]) and max(rows.values()) == 1
    else:
        assert sorted(rows) == list(range(5)) and rows[order[0]] == 2 and sum(rows.values()) == 6
    assert all(s.state_dict()["consumed_rows"] == 5 for s in ranks)


@pytest.mark.parametrize("uneven", ["drop", "repeat"])
def test_elastic_resume_at_every_step_keeps_ranks_even(uneven):
    """Any step of an epoch on R1 ranks, resumed on R2: the ranks get equal batch counts, no row
    is lost (repeat) or read twice (drop: fewer than R1 + R2 rows left out), and the epoch ends
    at consumed_rows == n."""
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 12))
        lengths = rng.integers(5, 30, size=n)
        kw = dict(max_tokens=int(rng.integers(30, 70)), cost=("padded", "packed")[trial % 2], seed=trial,
                  max_rows=(None, 1)[trial % 3 == 0], uneven=uneven)
        R1, R2 = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        steps = len(TokenBudgetBatchSampler(lengths, num_replicas=R1, **kw))
        for k in range(steps + 1):
            first = _ranks(lengths, R1, **kw)
            its = [iter(s) for s in first]
            head = [next(it) for _ in range(k) for it in its]
            second = _ranks(lengths, R2, **kw)
            for s in second:
                s.load_state_dict(first[-1].state_dict())
            tails = [list(s) for s in second]
            assert len({len(t) for t in tails}) == 1, (n, R1, R2, k)
            rows = Counter(i for b in head + [b for t in tails for b in t] for i in b)
            if uneven == "drop":
                assert max(rows.values(), default=1) == 1 and n - len(rows) < R1 + R2
            else:
                assert sorted(rows) == list(range(n))
            if tails[0]:
                assert all(s.state_dict()["consumed_rows"] == n for s in second)


def test_uneven_is_not_part_of_the_saved_state():
    state, _ = _after([10] * 9, 2, max_tokens=20)
    s = TokenBudgetBatchSampler([10] * 9, max_tokens=20, uneven="repeat")
    s.load_state_dict(state)
    assert s.state_dict()["consumed_rows"] == state["consumed_rows"]
    with pytest.raises(ArgumentError, match="uneven must be one of"):
        TokenBudgetBatchSampler([1], max_tokens=20, uneven="pad")


@pytest.mark.parametrize("kw, match", [
    (dict(seed=-1), "seed must be an integer >= 0"),  # was numpy's 'expected non-negative integer' on iter()
    (dict(seed=1.5), "seed must be an integer"),
    (dict(max_tokens="4096"), "max_tokens must be an integer >= 1"),  # was a TypeError
    (dict(max_tokens=float("nan")), "max_tokens must be an integer >= 1"),
    (dict(max_images="2"), "max_images must be an integer >= 0 or None"),
])
def test_bad_arguments_are_refused_when_built(kw, match):
    args = dict(max_tokens=20, **({} if "max_images" not in kw else {"num_images": [0, 1, 0]}))
    with pytest.raises(ArgumentError, match=match):
        TokenBudgetBatchSampler([5, 6, 7], **{**args, **kw})


def test_bad_epoch_and_states_are_refused_with_typed_errors():
    s = TokenBudgetBatchSampler([5, 6, 7], max_tokens=20)
    with pytest.raises(ArgumentError, match="epoch must be an integer >= 0"):
        s.set_epoch(-1)
    good = s.state_dict()
    with pytest.raises(ArgumentError, match="not a TokenBudgetBatchSampler state"):
        s.load_state_dict(None)  # was TypeError: argument of type 'NoneType' is not iterable
    with pytest.raises(ArgumentError, match="consumed_rows must be an integer >= 0"):
        s.load_state_dict({**good, "consumed_rows": None})  # was TypeError from int(None)
    with pytest.raises(ArgumentError, match="other rows or budgets"):
        s.load_state_dict({**good, "config": None})  # was AttributeError: 'NoneType' has no attribute 'get'
    with pytest.raises(ArgumentError, match="consumed_rows must be in 0..3"):
        s.load_state_dict({**good, "consumed_rows": 4})
    s.load_state_dict(good)
    assert sorted(i for b in s for i in b) == [0, 1, 2]


@pytest.mark.parametrize("lengths, num_images, match", [
    ([10, 12.7, 30], None, r"lengths must hold whole numbers >= 0.*12\.7 at row 1"),  # was read as 12 tokens
    ([10, float("nan")], None, r"lengths must hold whole numbers.*at row 1"),  # was a numpy cast error
    (["10", "12"], None, r"lengths must hold whole numbers.*at row 0"),  # was a bare ValueError
    ([10, None], None, r"lengths must hold whole numbers.*at row 1"),  # was a TypeError
    ([10, 12], [1, 0.5], r"num_images must hold whole numbers.*0\.5 at row 1"),  # was read as 0 images
    ([10, 12], [True, False], r"num_images must hold whole numbers"),
])
def test_counts_that_are_not_whole_numbers_are_refused_not_truncated(lengths, num_images, match):
    with pytest.raises(ArgumentError, match=match):
        TokenBudgetBatchSampler(lengths, num_images, max_tokens=64, max_images=None if num_images is None else 4)


def test_whole_float_and_numpy_counts_and_replica_arguments():
    """Lengths read from a float column (12.0) are the same counts; num_replicas 1.5 was taken as 1
    and rank True as 1."""
    a = TokenBudgetBatchSampler([10.0, 12.0, 30.0], max_tokens=64, seed=3)
    b = TokenBudgetBatchSampler(np.asarray([10, 12, 30], np.int32), max_tokens=64, seed=3)
    assert list(a) == list(b)
    for kw, match in (({"num_replicas": 1.5}, "num_replicas must be an integer >= 1"),
                      ({"num_replicas": 2, "rank": True}, "0 <= rank < num_replicas"),
                      ({"num_replicas": 2, "rank": 1.0}, "0 <= rank < num_replicas")):
        with pytest.raises(ArgumentError, match=match):
            TokenBudgetBatchSampler([10, 12], max_tokens=64, **kw)
    ranks = [TokenBudgetBatchSampler([10, 12], max_tokens=64, num_replicas=np.int64(2), rank=np.int64(r),
                                     max_rows=1) for r in range(2)]
    assert sorted(i for s in ranks for b in s for i in b) == [0, 1]


@pytest.mark.parametrize("lengths, match", [
    ([[3, 4], [5, 6]], r"shape \(2, 2\)"),  # 2 rows' [length, images] pairs: 4 rows when flattened
    (np.ones((3, 2), np.int64), r"shape \(3, 2\)"),
    ([True, 4, 5], "True at row 0"),  # numpy reads True among ints as 1
    ([4, np.bool_(False)], "False at row 1"),
])
def test_nested_or_bool_lengths_are_refused_not_flattened(lengths, match):
    with pytest.raises(ArgumentError, match=match):
        TokenBudgetBatchSampler(lengths, max_tokens=16)
