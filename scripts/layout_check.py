"""Count how well the code shows its design (issue 13) and fail when a rule is broken.

    python scripts/layout_check.py            # report + exit 1 on a broken rule
    python scripts/layout_check.py --json     # the figures as JSON
    python scripts/layout_check.py --repo DIR # another checkout (e.g. an older commit, for before/after)

Rules (each one a function below, each returning the offending places):
- module size: no library module over MAX_MODULE_LINES lines; at most MAX_LONG_FUNCTIONS
  functions over LONG_FUNCTION lines.
- import graph: no circle among mmpipe modules, counting imports inside functions.
- library code never imports ``mmpipe.testing`` nor another module's private (``_name``) names.
- family rules live in ``families.py`` and its row type ``family_fields.py`` (the rope rule in ``rope.py``): no family-name or
  rope-variant comparisons, no ``merge_size**2`` arithmetic, no family-name literals, no
  processor-class table elsewhere.
- placeholder expand/collapse is written once (``encoding/placeholders.py``).
- every record type lives in ``records/`` and no record field is typed bare ``Any``.
- bad input raises the typed hierarchy: no bare ``raise ValueError`` in the library
  (programmer errors raise ``mmpipe.errors.ArgumentError``, itself a ValueError).
- tests mirror the tree (a ``tests/<folder>/`` per library folder that holds a stage) and every
  stage's tests use ``mmpipe.testing.invariants``.

Figures without a rule here: ``kind_code_lines``, the code lines of the kinds' strategies
(``mmpipe/media``, docstrings, comments and blank lines out; issue 26 wants it well under 1,000,
tests/test_layout.py holds that bound).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from pathlib import Path

MAX_MODULE_LINES = 400
LONG_FUNCTION = 60
MAX_LONG_FUNCTIONS = 8
FAMILY_HOME = {"mmpipe/families.py", "mmpipe/family_fields.py", "mmpipe/rope.py"}  # the table, its row type, the rope rule
PLACEHOLDER_HOME = "mmpipe/encoding/placeholders.py"
# Folders holding a pipeline stage: their tests must go through the invariant harness.
STAGE_FOLDERS = ("encoding", "batching", "rollout", "rema", "data")
# Test files directly in tests/: one per top-level module (test_rope.py for rope.py), plus the
# cross-stage suites named here (the bad-input corpus, fuzzing, determinism, bench smoke, README
# names, this check).
CROSS_CUTTING_TESTS = {"test_bad_inputs.py", "test_fuzz.py", "test_determinism.py", "test_bench_smoke.py",
                       "test_readme.py", "test_layout.py"}
# Class names that are records by their name: they must be defined in records/.
RECORD_NAME = re.compile(r"(Inputs|Sample|Batch|Episode|Encoding|Completion|Generation|Conversation)$")
NOT_RECORDS = {"MultiTurnBatch"}  # a stage driver (it holds conversations and runs the loop), not a record


def library_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "mmpipe").rglob("*.py") if "__pycache__" not in p.parts)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def parse(path: Path) -> ast.Module:
    return parse_source(path.read_text(), str(path))


def parse_source(src: str, filename: str) -> ast.Module:
    """``ast.parse``, robust to CPython 3.11.7's spurious "AST constructor recursion depth
    mismatch" SystemError (cpython gh-106905, fixed in 3.11.8; seen a few times in a whole test
    run, rarely and only in a long-lived threaded process): retried with the garbage collector
    off in fresh threads, then parsed in a fresh interpreter (the tree comes back pickled)."""
    try:
        return ast.parse(src, filename=filename)
    except SystemError:
        pass
    import gc
    import threading

    for _ in range(3):
        out: list = []

        def work() -> None:
            try:
                out.append(ast.parse(src, filename=filename))
            except SystemError:
                pass

        enabled = gc.isenabled()
        gc.disable()
        try:
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
        finally:
            if enabled:
                gc.enable()
        if out:
            return out[0]
    import pickle
    import subprocess

    code = ("import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps("
            "ast.parse(sys.stdin.read(), filename=sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", code, filename], input=src.encode("utf-8"),
                          capture_output=True, check=True)
    return pickle.loads(done.stdout)


# ---- sizes ------------------------------------------------------------------------------
def sizes(root: Path) -> dict:
    lines = {rel(root, p): len(p.read_text().splitlines()) for p in library_files(root)}
    long_funcs = []
    for p in library_files(root):
        for node in ast.walk(parse(p)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG_FUNCTION:
                    long_funcs.append(f"{rel(root, p)}:{node.lineno} {node.name} ({n} lines)")
    real = [n for f, n in lines.items() if not f.endswith("__init__.py")]
    return {
        "modules": len(real),
        "median_lines": statistics.median(real) if real else 0,
        "largest": sorted(((n, f) for f, n in lines.items()), reverse=True)[:5],
        "over_limit": [f"{f} ({n} lines)" for f, n in sorted(lines.items()) if n > MAX_MODULE_LINES],
        "long_functions": long_funcs,
    }


def code_lines(path: Path) -> int:
    """Lines of ``path`` that are code: not blank, not a comment line, not in a docstring (of the
    module, a class or a function)."""
    src = path.read_text()
    docs: set[int] = set()
    for node in ast.walk(parse_source(src, str(path))):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(src.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)


KIND_CODE = "mmpipe/media"  # the kinds' strategies: what differs between patch grids, tiles, processor outputs


def kind_code(root: Path) -> dict:
    """Code lines (`code_lines`) of every module under `KIND_CODE` (sub-folders included), and their total."""
    files = {rel(root, p): code_lines(p) for p in library_files(root) if rel(root, p).startswith(KIND_CODE + "/")}
    return {"total": sum(files.values()), "files": files}


# ---- imports ----------------------------------------------------------------------------
def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path) -> dict[str, list[tuple[str, list[str], int]]]:
    """module -> [(imported mmpipe module, names, line)], function-level imports included."""
    modules = {module_name(root, p): p for p in library_files(root)}
    out: dict[str, list] = {}
    for mod, path in modules.items():
        edges = []
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, path.name == "__init__.py", node)
                if not target.startswith("mmpipe"):
                    continue
                names = [a.name for a in node.names]
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
                if subs:
                    edges += [(s, [], node.lineno) for s in subs]
                    names = [n for n in names if f"{target}.{n}" not in modules]
                if names or not subs:
                    edges.append((target, names, node.lineno))
            elif isinstance(node, ast.Import):
                edges += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("mmpipe")]
        out[mod] = [(t, n, line) for t, n, line in edges if t in modules and t != mod]
    return out


def circles(graph: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    adj = {m: sorted({t for t, _, _ in edges}) for m, edges in graph.items()}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in adj:
        if v not in index:
            visit(v)
    return comps


def bad_imports(root: Path, graph: dict) -> dict[str, list[str]]:
    testing, private = [], []
    for mod, edges in graph.items():
        if mod.startswith("mmpipe.testing"):
            continue
        for target, names, line in edges:
            if target.startswith("mmpipe.testing"):
                testing.append(f"{mod}:{line} imports {target}")
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    private.append(f"{mod}:{line} imports {target}.{n}")
    return {"imports_testing": testing, "private_names": private}


# ---- family rules -----------------------------------------------------------------------
FAMILY_LEAKS = [
    (re.compile(r"\bfamily\s*[!=]=|\.name\s*[!=]=\s*[\"']qwen|[\"']qwen\w*[\"']\s*[!=]=\s*\w*fam"), "family-name comparison"),
    (re.compile(r"\.rope\s*(?:[!=]=|in\b|not in\b)"), "rope-variant comparison"),
    (re.compile(r"merge_size\s*\*\*\s*2|merge_size\s*\*\s*\w*merge_size|//\s*[\w.]*merge_area"), "merge_size**2 arithmetic"),
    (re.compile(r"[\"'](qwen2_vl|qwen2_5_vl|qwen3_vl)[\"']"), "family-name literal"),
    (re.compile(r"[\"']Qwen\w*Processor[\"']"), "processor-class name"),
    (re.compile(r"MAX_ASPECT|max\([^)]*\)\s*/\s*min\([^)]*\)\s*[<>]=?\s*\d"), "aspect-ratio limit"),
]


def family_leaks(root: Path) -> list[str]:
    out = []
    for p in library_files(root):
        r = rel(root, p)
        if r in FAMILY_HOME:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.lstrip().startswith(">>>"):  # a docstring example may name a family
                continue
            for rx, what in FAMILY_LEAKS:
                if rx.search(code):
                    out.append(f"{r}:{i} {what}: {line.strip()[:90]}")
    return out


# What differs between the kinds of family is asked of the family's media strategy
# (mmpipe/media/): a stage that tests the kind itself grows a parallel path again.
KIND_HOMES = ("mmpipe/media/", "mmpipe/images/", "mmpipe/families.py", "mmpipe/family_fields.py")
KIND_BRANCH = re.compile(r"\bfam\w*\.kind\s*(?:[!=]=|in\b|not in\b)|\.kind\s*[!=]=\s*[\"'](?:patches|tiles|processor)[\"']"
                         r"|\b(?:tiled_family_of|takes_generic_path|is_tiled_row|is_generic_row)\(")


def kind_branches(root: Path) -> list[str]:
    """Lines outside the strategies and the family table that branch on the kind of family."""
    return [f"{rel(root, p)}:{i}" for p in library_files(root) if not rel(root, p).startswith(KIND_HOMES)
            for i, line in enumerate(p.read_text().splitlines(), 1) if KIND_BRANCH.search(line.split("#", 1)[0])]


def is_vision_branches(root: Path) -> list[str]:
    return [f"{rel(root, p)}:{i}" for p in library_files(root) if rel(root, p) not in FAMILY_HOME
            for i, line in enumerate(p.read_text().splitlines(), 1) if "is_vision" in line.split("#", 1)[0]]


# ---- placeholders -----------------------------------------------------------------------
def placeholder_copies(root: Path) -> list[str]:
    """Functions outside the placeholder module that expand or collapse image placeholders."""
    rx = re.compile(r"def (_?(?:expand|collapse)\w*(?:placeholder|image|video|pad|block)\w*)\(")
    return [f"{rel(root, p)}:{i} {m.group(1)}" for p in library_files(root) if rel(root, p) != PLACEHOLDER_HOME
            for i, line in enumerate(p.read_text().splitlines(), 1) for m in [rx.search(line)] if m]


# ---- records ----------------------------------------------------------------------------
def record_rules(root: Path) -> dict[str, list[str]]:
    outside, untyped = [], []
    for p in library_files(root):
        r = rel(root, p)
        in_records = r.startswith("mmpipe/records/")
        for node in ast.walk(parse(p)):
            if not isinstance(node, ast.ClassDef):
                continue
            is_dc = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
            if not in_records and RECORD_NAME.search(node.name) and node.name not in NOT_RECORDS \
                    and not any(isinstance(b, ast.Name) and b.id in ("Exception", "Protocol") for b in node.bases):
                outside.append(f"{r}:{node.lineno} {node.name}")
            if in_records and is_dc:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and ast.unparse(item.annotation) == "Any":
                        untyped.append(f"{r}:{item.lineno} {node.name}.{ast.unparse(item.target)}")
    return {"records_outside": outside, "fields_typed_any": untyped}


# ---- errors -----------------------------------------------------------------------------
def errors(root: Path) -> dict:
    counts = {"free_text_ValueError": [], "TypeError": 0, "ArgumentError": 0, "typed_input_errors": 0}
    typed = {"InputError", "ParseError", "PlaceholderError", "ImageError", "TruncationError", "PixelDataError",
             "FamilyMismatchError", "SchemaError", "RolloutError"}
    for p in library_files(root):
        for node in ast.walk(parse(p)):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                f = node.exc.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name == "ValueError":
                    counts["free_text_ValueError"].append(f"{rel(root, p)}:{node.lineno}")
                elif name == "TypeError":
                    counts["TypeError"] += 1
                elif name == "ArgumentError":
                    counts["ArgumentError"] += 1
                elif name in typed or name.endswith("Error") and name not in ("RuntimeError", "KeyError"):
                    counts["typed_input_errors"] += 1
    return counts


# ---- tests ------------------------------------------------------------------------------
def test_layout(root: Path) -> dict:
    tests = root / "tests"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    top_modules = {p.stem for p in (root / "mmpipe").glob("*.py")}
    stray = [f for f in flat if f not in CROSS_CUTTING_TESTS and f[len("test_"):-len(".py")] not in top_modules]
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    lib_folders = sorted(p.name for p in (root / "mmpipe").iterdir() if (p / "__init__.py").exists())
    unmirrored = [f for f in folders if f not in lib_folders]
    no_harness = []
    for stage in STAGE_FOLDERS:
        files = list((tests / stage).glob("test_*.py")) if (tests / stage).is_dir() else []
        if not any("mmpipe.testing.invariants" in f.read_text() or "from mmpipe.testing import invariants" in f.read_text()
                   for f in files):
            no_harness.append(stage)
    inline = []
    harness = root / "mmpipe" / "testing" / "invariants.py"
    for p in sorted(tests.rglob("test_*.py")):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            m = re.search(r"(?<![\w.`])(mmpipe\.)?unbatch\(", line)
            code = line.strip()
            # a call, not a def, comment, docstring line or text inside a string literal
            if m and not code.startswith(("def ", "#", '"', "'")) and line[: m.start()].count('"') % 2 == 0:
                inline.append(f"{rel(root, p)}:{i}")
    return {"test_files_flat": len(flat), "stray_flat_tests": stray, "test_folders": folders, "unmirrored_folders": unmirrored,
            "stages_without_harness": no_harness if harness.exists() else list(STAGE_FOLDERS),
            "inline_unbatch_checks": inline}


def report(root: Path) -> tuple[dict, list[str]]:
    graph = imports(root)
    fig = {"sizes": sizes(root), "kind_code_lines": kind_code(root), "circles": circles(graph), **bad_imports(root, graph),
           "family_leaks": family_leaks(root), "kind_branches": kind_branches(root), "is_vision_branches": len(is_vision_branches(root)),
           "placeholder_copies": placeholder_copies(root), **record_rules(root), "errors": errors(root),
           "tests": test_layout(root)}
    s, e, t = fig["sizes"], fig["errors"], fig["tests"]
    broken = []
    if s["over_limit"]:
        broken.append(f"modules over {MAX_MODULE_LINES} lines: {s['over_limit']}")
    if len(s["long_functions"]) > MAX_LONG_FUNCTIONS:
        broken.append(f"{len(s['long_functions'])} functions over {LONG_FUNCTION} lines (at most {MAX_LONG_FUNCTIONS})")
    for key, what in (("circles", "import circles"), ("imports_testing", "library imports of mmpipe.testing"),
                      ("private_names", "private names imported across modules"), ("family_leaks", "family rules outside families.py"),
                      ("kind_branches", "branches on the family kind outside mmpipe/media, images and families.py"),
                      ("placeholder_copies", "placeholder expand/collapse outside encoding/placeholders.py"),
                      ("records_outside", "record types outside records/"), ("fields_typed_any", "record fields typed Any")):
        if fig[key]:
            broken.append(f"{what}: {fig[key]}")
    if e["free_text_ValueError"]:
        broken.append(f"bare ValueError raised (use InputError for data, ArgumentError for arguments): {e['free_text_ValueError']}")
    if t["stray_flat_tests"]:
        broken.append(f"test files directly in tests/ that mirror no top-level module: {t['stray_flat_tests']}")
    if t["unmirrored_folders"] or t["stages_without_harness"] or t["inline_unbatch_checks"]:
        broken.append(f"tests: unmirrored {t['unmirrored_folders']}, stages without the harness {t['stages_without_harness']}, "
                      f"inline unbatch checks {t['inline_unbatch_checks']}")
    return fig, broken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    fig, broken = report(Path(args.repo))
    if args.json:
        print(json.dumps(fig, indent=1, default=str))
    else:
        s, e, t = fig["sizes"], fig["errors"], fig["tests"]
        print(f"modules: {s['modules']} (median {s['median_lines']} lines; over {MAX_MODULE_LINES}: {len(s['over_limit'])}); "
              f"functions over {LONG_FUNCTION} lines: {len(s['long_functions'])}")
        print(f"kind-specific code lines ({KIND_CODE}, docstrings/comments/blank out): {fig['kind_code_lines']['total']}")
        print(f"import circles: {len(fig['circles'])}; library imports of mmpipe.testing: {len(fig['imports_testing'])}; "
              f"private names imported: {len(fig['private_names'])}")
        print(f"family leaks: {len(fig['family_leaks'])}; is_vision branches outside families.py: {fig['is_vision_branches']}; "
              f"placeholder copies: {len(fig['placeholder_copies'])}")
        print(f"records outside records/: {len(fig['records_outside'])}; record fields typed Any: {len(fig['fields_typed_any'])}")
        print(f"errors: typed {e['typed_input_errors']}, ArgumentError {e['ArgumentError']}, "
              f"bare ValueError {len(e['free_text_ValueError'])}, TypeError {e['TypeError']}")
        print(f"tests: {t['test_files_flat']} flat files, folders {t['test_folders']}, "
              f"inline unbatch checks {len(t['inline_unbatch_checks'])}")
        for b in broken:
            print("BROKEN:", b)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
