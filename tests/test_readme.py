"""The README's names keep working: every import in its Python blocks resolves, every
``mmpipe.a.b`` it mentions exists, and every file its layout table names is in the tree."""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", README, flags=re.S)]


def _parsed():
    """The blocks that are Python programs (one shows a row's shape with an `<image>` stand-in)."""
    for block in BLOCKS:
        try:
            yield ast.parse(block)
        except SyntaxError:
            assert "<image>" in block, block
            continue


def _imports():
    for tree in _parsed():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mmpipe":
                yield node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "mmpipe":
                        yield a.name, []


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 8 and len(list(_imports())) >= 8


@pytest.mark.parametrize("module, names", sorted(set((m, tuple(n)) for m, n in _imports())))
def test_every_readme_import_resolves(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"from {module} import {name}"


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


@pytest.mark.parametrize("dotted", sorted(set(re.findall(r"\bmmpipe(?:\.[A-Za-z_]\w*)+", README))))
def test_every_dotted_name_in_the_readme_exists(dotted):
    _resolve(dotted.rstrip("."))


@pytest.mark.parametrize("path", sorted(set(re.findall(r"`((?:mmpipe|tests|scripts|bench|notebooks)/[\w/.]*)`", README))))
def test_every_path_in_the_readme_exists(path):
    assert (ROOT / path).exists(), path
