"""Every case of the rollout bad-input corpus (tests/rollout/bad_rollout_inputs.py) has its
stated outcome: a typed error naming the row (and, for record errors, the stage and column)
with its message words, or success with its checked property; within a time bound (a hang
fails); the counts stay 0 silent / 0 crash / 0 hang."""

from __future__ import annotations

import json
import pickle

import pytest
from bad_rollout_inputs import CASES, Ctx, outcome_counts

from helpers import bounded
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError


@pytest.fixture(scope="module")
def ctx():
    return Ctx()


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_rollout_corpus_case(c, ctx):
    if c.raises is None:
        result = bounded(lambda: c.run(ctx))
        c.check(result, ctx)
        return
    with pytest.raises(c.raises) as info:
        bounded(lambda: c.run(ctx))
    e, msg = info.value, str(info.value)
    assert type(e) is c.raises and isinstance(e, (ArgumentError, InputError))  # typed, a ValueError
    for s in c.contains:
        assert s in msg, f"{s!r} not in {msg!r}"
    if c.row is not None:
        assert msg.startswith(f"row {c.row}"), msg
        assert getattr(e, "row", c.row) == c.row
    again = pickle.loads(pickle.dumps(e))  # errors cross DataLoader / datasets workers whole
    assert type(again) is type(e) and str(again) == msg and getattr(again, "row", None) == getattr(e, "row", None)
    if isinstance(e, InputError):
        assert e.stage == c.err_stage and e.column == c.column and " - " in msg  # says what to do
        if isinstance(e, FamilyMismatchError):  # expected vs found
            assert e.expected and e.found


def test_rollout_corpus_outcome_counts():
    """Every kind has a stated outcome and what the unfixed code did; the table is printed
    (``-s``) for the report."""
    counts = outcome_counts()
    print("\nrollout bad-input corpus:", json.dumps(counts))
    assert counts["undocumented"] == [] and counts["kinds"] == len({c.name for c in CASES}) >= 20
    assert sum(counts["clear_error"].values()) + counts["handled"] == counts["kinds"]
    assert (counts["silent"], counts["crash"], counts["hang"]) == (0, 0, 0)
    assert {c.surface for c in CASES} == {"vllm_prompts", "agent"}
