"""Every bad-input error names what was expected and what was found (docs/reference/errors.md).

An AST scan of ``mmpipe/``: each call that builds an `InputError` or a subclass (those of
``mmpipe.errors`` and the ones defined elsewhere in the package, e.g. ``SchemaError``) must pass
``expected=`` or ``found=`` (a ``**kwargs`` call is taken as passing them; so is any call of a class
whose ``__init__`` fills them itself, ``kw.setdefault("expected", ...)``). The folders swept
so far hold none without; the whole package holds at most RATCHET, a number that only goes down.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "mmpipe"
# folders (or top-level modules, "rope.py") whose every InputError-family call says expected or found
DONE = ("rema", "batching", "records", "data", "encoding", "audio", "reward", "view", "cli", "media", "images",
        "rope.py", "rope_checks.py", "rollout")
# calls in the whole package that still say neither: lower it as sites are fixed, never raise it
RATCHET = 0


@functools.lru_cache(maxsize=1)
def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py")) if "__pycache__" not in p.parts}


def _name(node: ast.expr):
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _fills_fields(cls: ast.ClassDef) -> bool:
    """The class's own ``__init__`` sets ``expected`` / ``found`` (``kw.setdefault("found", ...)`` or
    ``super().__init__(..., found=...)``), so its callers need not."""
    for f in cls.body:
        if isinstance(f, ast.FunctionDef) and f.name == "__init__":
            for n in ast.walk(f):
                if isinstance(n, ast.Call) and (
                        {k.arg for k in n.keywords} & {"expected", "found"}
                        or _name(n.func) == "setdefault" and n.args and isinstance(n.args[0], ast.Constant)
                        and n.args[0].value in ("expected", "found")):
                    return True
    return False


def self_filling_classes(trees) -> set[str]:
    return {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef) and _fills_fields(n)}


def input_error_classes(trees) -> set[str]:
    """InputError and every class of the package that subclasses it (by name, transitively)."""
    bases: dict[str, set] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(_name(b) for b in node.bases)
    family = {"InputError"}
    while True:
        more = {n for n, b in bases.items() if b & family} - family
        if not more:
            return family
        family |= more


def sites_without_expected_found() -> list[str]:
    """``"mmpipe/x/y.py:LINE ClassName"`` for each call that passes neither expected= nor found=."""
    trees = _trees()
    family = input_error_classes(trees) - self_filling_classes(trees)
    out = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) in family:
                keywords = {k.arg for k in node.keywords}  # None: a **kwargs
                if not keywords & {"expected", "found", None}:
                    out.append(f"{path.relative_to(ROOT.parent).as_posix()}:{node.lineno} {_name(node.func)}")
    return sorted(out)


def test_the_scan_sees_the_error_family():
    family = input_error_classes(_trees())
    assert {"InputError", "ParseError", "PixelDataError", "VideoError", "SchemaError",
            "DamagedDatasetError"} <= family
    assert "ArgumentError" not in family
    assert "DamagedShardError" in self_filling_classes(_trees())  # fills expected / found in its __init__


def test_swept_folders_name_expected_and_found():
    left = [s for s in sites_without_expected_found() if s.split(":")[0].split("/")[1] in DONE]
    assert not left, f"InputError calls naming neither expected nor found: {left}"


def test_the_rest_only_goes_down():
    left = sites_without_expected_found()
    assert len(left) <= RATCHET, f"{len(left)} InputError calls name neither expected nor found (at most {RATCHET})"
