"""The code shows its design (issue 13): scripts/layout_check.py's rules hold on this tree, and the
check itself catches each kind of violation it is meant to catch."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("layout_check", ROOT / "scripts" / "layout_check.py")
layout_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout_check)


def test_this_tree_keeps_every_rule():
    fig, broken = layout_check.report(ROOT)
    assert broken == [], "\n".join(broken)
    assert fig["circles"] == [] and fig["imports_testing"] == [] and fig["family_leaks"] == []
    assert fig["errors"]["free_text_ValueError"] == []


@pytest.fixture
def tree(tmp_path):
    """A copy of the library and tests to break on purpose."""
    shutil.copytree(ROOT / "mmpipe", tmp_path / "mmpipe", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    return tmp_path


def _add(tree: Path, rel: str, text: str) -> None:
    p = tree / rel
    p.write_text(p.read_text() + "\n\n" + text + "\n")


@pytest.mark.parametrize("rel, text, key", [
    ("mmpipe/records/columns.py", "def _late():\n    from mmpipe.batching.collate import collate\n", "circles"),
    ("mmpipe/batching/sampler.py", "def _f():\n    from mmpipe.testing import build_processor\n", "imports_testing"),
    ("mmpipe/batching/sampler.py", "from mmpipe.records.columns import _NOPE  # noqa", "private_names"),
    ("mmpipe/batching/sampler.py", "def _g(fam):\n    return fam.rope == 'mrope_tps'\n", "family_leaks"),
    ("mmpipe/batching/sampler.py", "def _h(g, fam):\n    return g.prod(-1) // fam.merge_size**2\n", "family_leaks"),
    ("mmpipe/batching/sampler.py", "def _i(row):\n    return row.family == 'qwen3_vl'\n", "family_leaks"),
    ("mmpipe/batching/sampler.py", "def expand_image_tokens(ids):\n    return ids\n", "placeholder_copies"),
    ("mmpipe/batching/sampler.py", "class ExtraInputs:\n    pass\n", "records_outside"),
])
def test_the_check_catches_each_kind_of_violation(tree, rel, text, key):
    _add(tree, rel, text)
    fig, broken = layout_check.report(tree)
    assert fig[key], key
    assert broken


def test_the_check_catches_bare_value_errors_oversize_modules_and_untyped_fields(tree):
    _add(tree, "mmpipe/batching/sampler.py", "def _j():\n    raise ValueError('bad')\n")
    _add(tree, "mmpipe/records/columns.py", "\n".join(f"X{i} = {i}" for i in range(400)))
    _add(tree, "mmpipe/records/packed.py",
         "from dataclasses import dataclass\nfrom typing import Any\n\n@dataclass\nclass Extra:\n    x: Any = None\n")
    fig, _ = layout_check.report(tree)
    assert fig["errors"]["free_text_ValueError"]
    assert any("columns.py" in m for m in fig["sizes"]["over_limit"])
    assert fig["fields_typed_any"]


def test_the_check_catches_inline_unbatch_checks(tree):
    _add(tree, "tests/batching/test_collate.py", "def test_x():\n    assert mmpipe.unbatch(b) == rows\n")
    fig, _ = layout_check.report(tree)
    assert fig["tests"]["inline_unbatch_checks"]


def test_code_lines_leave_out_docstrings_comments_and_blank_lines(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Module doc,\nover two lines."""\n\n# a comment\nX = 1  # code with a comment\n\n\n'
                   'def f():\n    """One line."""\n    return """a string,\nnot a docstring"""\n\n\n'
                   'class C:\n    """Doc."""\n\n    y = 2\n')
    # X = 1, def f, return (2 lines), class C, y = 2
    assert layout_check.code_lines(src) == 6


# Issue 26: the kinds' strategies (mmpipe/media) are "well under 1,000" code lines in all.
KIND_CODE_LIMIT = 1000


@pytest.mark.xfail(strict=True, reason="issue 26 is open: mmpipe/media is still over 1,000 code lines "
                                        "(scripts/layout_check.py prints the figure); drop this mark when it is not")
def test_kind_specific_code_is_under_1000_lines():
    fig, _ = layout_check.report(ROOT)
    assert fig["kind_code_lines"]["total"] < KIND_CODE_LIMIT, fig["kind_code_lines"]


@pytest.mark.parametrize("failures", [1, 4])
def test_a_spurious_ast_system_error_does_not_fail_the_check(monkeypatch, failures):
    """CPython 3.11.7 sometimes raises "AST constructor recursion depth mismatch" (gh-106905) in a
    long-lived threaded process such as the whole test run: the check parses again (threads with
    the collector off, then a fresh interpreter) and gets the same tree."""
    import ast

    real, calls = ast.parse, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            raise SystemError("AST constructor recursion depth mismatch (before=15, after=71)")
        return real(*args, **kwargs)

    src = "def f(a):\n    return [a for _ in range(3)]\n"
    monkeypatch.setattr(ast, "parse", flaky)
    tree = layout_check.parse_source(src, "f.py")
    monkeypatch.setattr(ast, "parse", real)
    assert ast.dump(tree) == ast.dump(real(src)) and len(calls) == min(failures + 1, 4)
