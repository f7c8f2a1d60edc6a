"""``python -m bench``: run the benchmark suite, print the table, write JSON.

    python -m bench                  # full suite (< 10 minutes on a 2-core machine)
    python -m bench --quick          # small data, every code path and equality check (~30 s)
    python -m bench --only rope,collate --repeat 7 --json /tmp/run.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback

CASES = ("rope", "layout", "encode", "bytes", "collate", "video", "job", "map_scaling", "rss", "rss_real", "packing",
         "memory", "families", "turns", "judge_parse", "ray", "audio", "longconv")
# memory: a minute of 10 MB rows; turns: info lines (issue 29.2) not in tests/test_bench_smoke.py's list. Each runs
# in --quick runs only when named in --only (turns has a quick mode: 50-400 turns)
NOT_QUICK = ("memory", "turns", "judge_parse", "ray", "longconv")  # judge_parse: info lines (issue 29.3), like turns
# and longconv (long conversations); ray: issue 32
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latest.json")


def _environment() -> dict:
    import datasets
    import numpy
    import PIL
    import pyarrow
    import torch
    import transformers

    return {
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "loadavg_start": os.getloadavg(),
        "torch": torch.__version__, "transformers": transformers.__version__, "datasets": datasets.__version__,
        "numpy": numpy.__version__, "pyarrow": pyarrow.__version__, "pillow": PIL.__version__,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small data: smoke-test every case (no meaningful ratios)")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=None, help="timing repeats per contender (default 5, quick 1)")
    ap.add_argument("--max-wait", type=float, default=150.0,
                    help="seconds in all to wait for other processes' CPU bursts to pass before cases (default 150)")
    ap.add_argument("--backend", choices=("pil", "torchvision"), default="pil",
                    help="the baseline processor's image backend (torchvision: only where torchvision imports; "
                         "`bash scripts/bench.sh --torchvision` runs encode and collate that way)")
    ap.add_argument("--json", default=DEFAULT_JSON, help=f"where to write the results (default {DEFAULT_JSON})")
    args = ap.parse_args(argv)
    names = [c.strip() for c in args.only.split(",") if c.strip()] or [
        c for c in CASES if not (args.quick and c in NOT_QUICK)]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")

    import logging
    import warnings

    import datasets

    datasets.disable_progress_bars()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    from . import cases
    from .cases import Context
    from .report import Result, format_table
    from .timing import OtherLoad, wait_for_quiet

    t_start = time.time()
    results: list[Result] = []
    failures = []
    busy_cases: list[str] = []
    waited_total = 0.0
    with tempfile.TemporaryDirectory(prefix="mmpipe-bench-") as workdir:
        ctx = Context(quick=args.quick, repeat=args.repeat or (1 if args.quick else 5), workdir=workdir,
                      backend=args.backend)
        for name in names:
            # a shared machine: let other processes' bursts pass first (bounded, see --max-wait)
            waited, busy = (0.0, 0.0) if args.quick else wait_for_quiet(
                max(0.0, args.max_wait - waited_total), log=lambda m: print(m, file=sys.stderr, flush=True))
            waited_total += waited
            t0 = time.time()
            load0 = os.getloadavg()
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            try:
                with OtherLoad() as other:
                    rows = getattr(cases, f"case_{name}")(ctx)
            except Exception as e:  # keep going: report the failure in the table and the exit code
                traceback.print_exc()
                failures.append(name)
                rows = [Result(name, "error", "-", None, "-", "-", False, False, {"error": repr(e)}, "-", repr(e)[:120])]
            for r in rows:
                r.detail.setdefault("case_id", name)
                r.detail.setdefault("seconds", round(time.time() - t0, 2))
                # other processes on this machine skew timings: 1-minute load before / after
                r.detail.setdefault("loadavg_1min", [round(load0[0], 2), round(os.getloadavg()[0], 2)])
                r.detail.setdefault("other_cores_busy_at_start", round(busy, 2))
                r.detail.setdefault("other_cores_busy_during", round(other.cores, 2))
            if other.cores >= 0.25:
                busy_cases.append(f"{name} ({other.cores:.1f})")
            results.extend(rows)
            print(f"[bench] {name} done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    table = format_table(results)
    mode = "quick (smoke: small data, ratios not meaningful)" if args.quick else "full"
    print(f"\nmmpipe benchmark, {mode}; data: matplotlib photos + photo-like JPEGs "
          f"{'(small)' if args.quick else '640x480..1920x1080'}; Qwen2-VL processor bounds "
          f"{'test defaults' if args.quick else 'min_pixels=3136, max_pixels=12845056 (the Qwen2-VL checkpoints)'}; "
          f"image backend {args.backend}")
    print(f"figures: median [min-max] of {ctx.repeat} samples per contender (rotated order, same cores); "
          "ratio = baseline median / mmpipe median [paired per-sample spread]; load per sample in the JSON; "
          f"1-minute load average {os.getloadavg()[0]:.2f} at the end on {os.cpu_count()} cores\n")
    print(table)
    print("\nload: median CPU cores other processes kept busy during a case's samples (of "
          f"{os.cpu_count()}; /proc/stat less this process and its children); with load >= 0.25 the timings are "
          "pessimistic, sub-millisecond and multi-threaded ones most (per-sample load in the JSON)")
    if busy_cases:
        print(f"cases run with other processes busy: {', '.join(busy_cases)}")
    print(f"\ntotal {time.time() - t_start:.0f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"mode": "quick" if args.quick else "full", "image_backend": args.backend,
                       "seconds": time.time() - t_start,
                       "environment": _environment(), "results": [r.to_json() for r in results],
                       "table": table}, f, indent=1, default=float)
        print(f"wrote {args.json}")
    not_identical = [r.case for r in results if r.identical is False]
    return 1 if (failures or not_identical) else 0
