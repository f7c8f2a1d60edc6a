"""Peak RSS of the README's documented call on real-size photos (issue 18 items 2 and 4):
``ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2,
**mmpipe.map_kwargs(processor, ds))`` over 2,000 rows (1 or 2 photos of 640x480..1920x1080
each, as ``Image()`` values by path) with the real checkpoint bounds. ``map_kwargs`` sets the
writer buffer and batch size from the largest possible encoded row (datasets' default buffer
of 1,000 rows passed the 6 GiB cap).

The job runs in a fresh process (``python -m bench.rss_real --child``); the peak of the summed
RSS of it and its map workers is polled from outside (`bench.procs`). A tree that passes
``CAP_MIB`` is stopped (the machine is shared) and reported as over the cap. Run with the suite
(``--only rss_real``) or alone (``python -m bench.rss_real [--quick]``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CAP_MIB = 6144
TARGET_MIB = 3072


def _paths(workdir: str, quick: bool) -> list[str]:
    from . import data

    pool = data.image_pool(quick)
    out = []
    for i, (v, name) in enumerate(zip(pool.values, pool.names)):
        if name.startswith("photo-like"):
            p = os.path.join(workdir, f"rss_real_{i}.jpg")
            with open(p, "wb") as f:
                f.write(v["bytes"])
            out.append(p)
    return out


def child(workdir: str, n: int, quick: bool) -> dict:
    import datasets

    import mmpipe

    from . import data

    datasets.disable_progress_bars()
    processor = data.processor(quick)
    paths = sorted(p for p in os.listdir(workdir) if p.startswith("rss_real_") and p.endswith(".jpg"))
    paths = [os.path.join(workdir, p) for p in paths]
    rows = [data.chat_row([paths[(i + j) % len(paths)] for j in range(1 + i % 2)], i) for i in range(n)]
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    out = os.path.join(workdir, "rss_real_out")
    os.makedirs(out, exist_ok=True)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2,  # the README's call
                 **mmpipe.map_kwargs(processor, ds),
                 load_from_cache_file=False, cache_file_name=os.path.join(out, "enc.arrow"))
    same = all(enc[i]["pixel_values_u8"] == mmpipe.encode(ds[i], processor=processor)["pixel_values_u8"]
               for i in (0, n // 2, n - 1))
    return {"rows": len(enc), "images": sum(1 + i % 2 for i in range(n)), "identical": bool(same),
            "writer_batch_size": mmpipe.map_kwargs(processor, ds)["writer_batch_size"]}


def case_rss_real(ctx) -> list:
    return [measure(ctx, 30 if ctx.quick else 2000)]


def measure(ctx, n: int):
    """One fresh-process run of the documented map over ``n`` rows -> a `Result`."""
    from .procs import run_tree
    from .report import Result

    _paths(ctx.workdir, ctx.quick)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "bench.rss_real", "--child", "--workdir", ctx.workdir, "--rows", str(n)] + (
        ["--quick"] if ctx.quick else [])
    res = run_tree(cmd, cwd=root, cap_mib=CAP_MIB, timeout=900)
    if res.returncode != 0 and not res.capped:
        raise RuntimeError(f"rss_real child failed:\n{res.stderr[-3000:]}")
    rep = json.loads(res.stdout.strip().splitlines()[-1]) if not res.capped else {"identical": None}
    peak = res.peak_mib
    fig = f"> {CAP_MIB:,} MiB (stopped at the cap)" if res.capped else f"{peak:,.0f} MiB"
    met = (not res.capped) and peak <= TARGET_MIB
    floor = "" if met else (
        "over the bound with map_kwargs' writer buffer: see the JSON's writer_batch_size and wall_s")
    size = "small" if ctx.quick else "real-size"
    return Result(f"peak RSS, README's map(num_proc=2, **map_kwargs), {n:,} {size} rows (process tree)", fig, "-",
                  peak, f"{peak / 1024:.2f} GiB", f"<= {TARGET_MIB / 1024:g} GiB", met, rep.get("identical"),
                  dict(rep, wall_s=round(res.wall_s, 1), peak_tree_mib=peak, capped=res.capped), "- (a bound)", floor)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="", help="comma-separated row counts, e.g. 500,1000 (flatness)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.workdir, args.rows, args.quick)))
        return
    import tempfile

    from .cases import Context

    sizes = [int(x) for x in args.sizes.split(",") if x] or [30 if args.quick else 2000]
    with tempfile.TemporaryDirectory(prefix="mmpipe-rss-") as wd:
        for n in sizes:
            r = measure(Context(quick=args.quick, repeat=1, workdir=wd), n)
            print(f"{r.case}: {r.mmpipe} (target {r.target}, met {r.met}; wall {r.detail.get('wall_s')} s, "
                  f"writer {r.detail.get('writer_batch_size')}) {r.floor}", flush=True)


if __name__ == "__main__":
    main()
