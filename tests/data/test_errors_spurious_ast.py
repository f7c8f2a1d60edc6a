"""Errors are built on many threads at once (a shared Encoder's rows, encode_or_drop's drop signal):
CPython 3.11's ``ast.parse`` then sometimes raises a spurious ``SystemError: AST constructor
recursion depth mismatch`` (gh-106905). Building an error must not parse on its raise path, and the
parses a DataLoader re-raise needs try again: a ``too_long`` drop counted as an ``encode`` failure
in 1 of 400 rounds of the thread-count test when the fields note parsed each field's repr."""

from __future__ import annotations

import ast
import sys

import pytest

from mmpipe.encoding.options import RowDropped
from mmpipe.data.loading import DamagedDatasetError
from mmpipe.errors import InputError


@pytest.fixture
def flaky_ast(monkeypatch):
    """``ast.parse`` raising the spurious SystemError on its first 3 calls from mmpipe of each test
    (pytest's own calls, its assertion reports, are left alone)."""
    real, calls = ast.parse, []

    def parse(*args, **kwargs):
        caller = sys._getframe(1)  # ast.literal_eval, or mmpipe itself
        if any(f.f_globals.get("__name__", "").startswith("mmpipe") for f in (caller, caller.f_back)):
            calls.append(1)
            if len(calls) <= 3:
                raise SystemError("AST constructor recursion depth mismatch (before=15, after=71)")
        return real(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    return calls


def _reraised(e: BaseException) -> str:
    """The text a torch DataLoader re-raises a worker's error with (its notes in the traceback)."""
    name = type(e).__name__
    notes = "".join(f"\n{n}" for n in getattr(e, "__notes__", ()))
    return (f"Caught {name} in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            f"  File \"x.py\", line 1, in f\n{type(e).__module__}.{name}: {e}{notes}\n")


def test_a_drop_signal_is_built_while_ast_parse_fails(flaky_ast):
    e = RowDropped("too_long", "row 3 has 9000 tokens")
    assert e.reason == "too_long" and str(e) == "row 3 has 9000 tokens"
    assert e.__notes__ == ["mmpipe fields: {'reason': 'too_long'}"]


def test_an_ambiguous_input_error_is_built_while_ast_parse_fails(flaky_ast):
    e = InputError("a - b", row=2, column="images", expected="x; found y", found="z - w", fix="do a - then b",
                   stage="parse")
    assert (e.row, e.column, e.expected, e.found, e.fix) == (2, "images", "x; found y", "z - w", "do a - then b")


def test_fields_come_back_from_a_reraise_while_ast_parse_fails(flaky_ast):
    sent = [DamagedDatasetError("the dataset's arrow file is cut", file="data-00000.arrow", rows_readable=(0, 7)),
            InputError("a - b", row=2, column="images", expected="x; found y", found="z - w", fix="f", stage="parse")]
    flaky_ast.clear()  # the re-raise's parses are the ones that meet the failures
    back = [type(e)(_reraised(e)) for e in sent]
    assert (back[0].file, back[0].rows_readable) == ("data-00000.arrow", (0, 7))
    assert (back[1].row, back[1].column, back[1].expected, back[1].found, back[1].fix) == \
        (2, "images", "x; found y", "z - w", "f")
