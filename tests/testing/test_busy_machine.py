"""The suite passes on a busy machine (issue 29.3): no unit test asserts on a clock, and the
files that wait on threads, servers and subprocesses pass with two CPU-bound processes
competing for the cores.

Before, `tests/reward/test_judge_faults.py` asserted wall-clock bounds (a 2 MB parse < 1.0 s:
1.15 s with other jobs running, and `.ci/run` exited 1). Those checks now count: characters
handed to the JSON decoder, requests the server saw while it held every answer, the back-off
the client chose. The seconds live in `python -m bench --only judge_parse`. A wait that can
only end by something happening (a thread, a server, a subprocess) keeps a generous bound
that fails as a hang (``pytest.fail("hang: ...")``, `tests.helpers.HANG_S`), never as a timing.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# scripts/layout_check.parse_source: ast.parse that survives CPython 3.11.7's "AST constructor
# recursion depth mismatch" SystemError, which a RecursionError earlier in the whole run leaves behind
_spec = importlib.util.spec_from_file_location("layout_check", ROOT / "scripts" / "layout_check.py")
_layout_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_layout_check)

# Calls that read a clock: ``time.time()``, ``time.perf_counter()``, ``datetime.now()``, ...
CLOCK_CALLS = {"time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
               "process_time_ns", "thread_time", "default_timer", "timeit", "repeat", "now", "utcnow"}
CLOCK_MODULES = {"time", "timeit", "datetime"}

# The tests that had clock assertions or sleep-based overlaps, and wait on threads, loopback
# servers and subprocesses (what a loaded machine slows down), run beside two busy processes.
# One model family (one tiny model built); the brace-heavy parses are left out (pure CPU, checked
# by counts: the load cannot change them). ~25 s on 2 idle cores.
TIMING_SENSITIVE = [
    "tests/reward/test_judge_faults.py",
    "tests/reward/test_judge_server.py",
    "tests/rollout/test_async_engines.py::test_concurrency_is_bounded",
    "tests/rollout/test_async_engines.py::test_cancelled_callers_keep_the_bound",
    "tests/rollout/test_async_engines.py::test_batching_drops_callers_cancelled_while_waiting",
    "tests/rollout/test_openai_engine.py::test_vllm_dialect_server_equals_sync_engine[qwen2_vl]",
]
DESELECT = "not linear_time"
BUSY = "while True: pass"


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in CLOCK_CALLS:
        base = f.value
        while isinstance(base, ast.Attribute):  # datetime.datetime.now()
            base = base.value
        return isinstance(base, ast.Name) and base.id in CLOCK_MODULES
    return isinstance(f, ast.Name) and f.id in {"perf_counter", "monotonic", "process_time", "default_timer"}


def _reads(node: ast.AST, tainted: set) -> bool:
    return any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in tainted) for n in ast.walk(node))


def _targets(node: ast.AST) -> list:
    if isinstance(node, ast.Assign):
        out = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
        out = [node.target]
    else:
        return []
    return [n.id for t in out for n in ast.walk(t) if isinstance(n, ast.Name)]


def clock_assertions(source: str) -> list[int]:
    """Lines of ``assert`` statements whose test reads a clock, directly or through a local
    assigned from one (``elapsed = time.monotonic() - t0; assert elapsed < 1.6``)."""
    tree = _layout_check.parse_source(source, "<test>")
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    top = ast.Module(body=[s for s in tree.body if not isinstance(s, (*functions, ast.ClassDef))], type_ignores=[])
    bad = []
    for scope in [top, *(n for n in ast.walk(tree) if isinstance(n, functions))]:
        tainted: set = set()
        changed = True
        while changed:  # t0 = clock(); took = clock() - t0; late = [... if r.started > t_close]
            changed = False
            for n in ast.walk(scope):
                value = getattr(n, "value", None)
                names = _targets(n)
                if names and value is not None and _reads(value, tainted) and not set(names) <= tainted:
                    tainted |= set(names)
                    changed = True
        bad += [n.lineno for n in ast.walk(scope) if isinstance(n, ast.Assert) and _reads(n.test, tainted)]
    return sorted(set(bad))


def test_the_clock_check_finds_timed_assertions():
    timed = (
        "import time\n"
        "def test_a():\n    t0 = time.perf_counter()\n    work()\n    assert time.perf_counter() - t0 < 1.0\n"
        "def test_b():\n    t0 = time.monotonic()\n    work()\n    elapsed = time.monotonic() - t0\n"
        "    assert elapsed < 1.6\n"
        "def test_c(server):\n    t_close = time.monotonic()\n"
        "    late = [r for r in server.requests if r.started > t_close + 0.1]\n    assert late == []\n"
    )
    assert clock_assertions(timed) == [5, 10, 14]
    counted = (
        "import time, pytest\n"
        "def test_d(server):\n    deadline = time.monotonic() + 60\n    while not done():\n"
        "        if time.monotonic() > deadline:\n            pytest.fail('hang')\n"
        "    assert len(server.requests) == 4\n"
    )
    assert clock_assertions(counted) == []


def test_no_test_asserts_on_a_clock():
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        lines = clock_assertions(path.read_text())
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, (
        f"assertions on a clock (wall time depends on the machine's load; count operations, compare "
        f"sizes by op counts, or time it in bench/): {found}")


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (``/proc/<pid>/stat``): evidence that it competed."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_timing_sensitive_files_pass_beside_two_busy_processes():
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                              "-k", DESELECT, *TIMING_SENSITIVE], cwd=ROOT, capture_output=True, text=True,
                             timeout=900)  # a hang guard: ~1-2 minutes on 2 busy cores
        alive = [h.poll() is None for h in hogs]
        busy_s = [_cpu_seconds(h.pid) for h in hogs] if all(alive) and Path("/proc").is_dir() else []
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, f"failed beside two busy processes:\n{tail}"
    assert " passed" in run.stdout and " failed" not in run.stdout, tail
    assert all(alive), "a busy process died: the files did not run beside it"
    if busy_s:  # both competed for the cores for a good part of the run
        assert min(busy_s) > 1.0, busy_s
