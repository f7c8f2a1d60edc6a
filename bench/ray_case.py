"""Ray Data scaling (issue 32): rows/s of ``map_batches(RayBatchEncoder)`` on a local Ray with 1 and
2 encoder actors, next to ``datasets.map(mmpipe.encode, num_proc=2)`` on the same rows; outputs
checked identical first (Ray's rows, in id order, equal the map's table). Info lines, no target.

    python -m bench.ray_case            # the case alone, its table printed
    python -m bench.ray_case --quick

Each Ray sample is a whole job as a user runs it: actors started (one processor each), rows
encoded, the Arrow blocks fetched to the driver; the map sample likewise starts its processes.
"""

from __future__ import annotations

import os
import shutil

from .encode_cases import raw_dataset
from .report import Result, speed
from .timing import side_by_side


def _ray_job(ray, raw, proc, workers: int, blocks: int):
    import pyarrow as pa

    from mmpipe.data.ray_data import RayBatchEncoder

    ds = ray.data.from_huggingface(raw, override_num_blocks=blocks)
    out = ds.map_batches(RayBatchEncoder, fn_constructor_args=(proc,), fn_constructor_kwargs={"keep_columns": ["id"]},
                         batch_size=4, batch_format="pyarrow", num_cpus=1,
                         compute=ray.data.ActorPoolStrategy(size=workers))
    # Ray may add blocks with no column at all (more blocks than batches): not rows, left out
    return pa.concat_tables([t for t in ray.get(out.to_arrow_refs()) if t.num_columns])


def case_ray(ctx) -> list[Result]:
    import datasets
    import pyarrow.compute as pc

    import mmpipe

    ray = __import__("ray")
    from .cases import _rows

    proc = ctx.processor
    rows = _rows(ctx, {0: 2, 1: 6, 2: 4} if ctx.quick else {0: 8, 1: 48, 2: 40}, start=3)
    n = len(rows)
    path = f"{ctx.workdir}/ray_raw"
    raw_dataset(rows).add_column("id", list(range(n))).save_to_disk(path)
    raw = datasets.load_from_disk(path)
    out_dir = f"{ctx.workdir}/ray_map_out"
    counter = [0]

    def run_map(num_proc):
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        counter[0] += 1
        return raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, num_proc=num_proc, remove_columns=raw.column_names,
                       load_from_cache_file=False, cache_file_name=f"{out_dir}/run{counter[0]}.arrow")

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        blocks = 8  # enough blocks for both actors
        ref = run_map(2).with_format("arrow")[:]
        same = True
        for w in (1, 2):
            got = _ray_job(ray, raw, proc, w, blocks)
            got = got.take(pc.sort_indices(got.column("id"))).drop_columns(["id"])
            same &= got.equals(ref)
        runs = {"ray 1 worker": lambda: _ray_job(ray, raw, proc, 1, blocks),
                "ray 2 workers": lambda: _ray_job(ray, raw, proc, 2, blocks),
                "map num_proc=2": lambda: run_map(2)}
        t = side_by_side(runs, repeat=1 if ctx.quick else max(3, ctx.repeat), warmup=0)
    finally:
        ray.shutdown()
    detail = {"rows": n, "images": sum(len(r["images"]) for r in rows), "ray_blocks": blocks,
              "timing": {k: v.to_json() for k, v in t.items()}}
    base = "datasets.map(mmpipe.encode, num_proc=2), same rows"
    floor = "2 cores: 2 actors at most 2x 1 actor; a job's actor start-up (one processor each) counts"
    return [
        speed(f"Ray map_batches(RayBatchEncoder) {n} rows, 2 workers vs map num_proc=2", t["ray 2 workers"],
              t["map num_proc=2"], base, target=None, identical=bool(same), per=n, detail=detail, floor=floor),
        speed("  same, 1 worker vs map num_proc=2", t["ray 1 worker"], t["map num_proc=2"], base, target=None,
              identical=bool(same), per=n, floor=floor),
        speed("  same, 2 workers vs 1 worker", t["ray 2 workers"], t["ray 1 worker"], "Ray with 1 worker",
              target=None, identical=bool(same), per=n, floor=floor),
    ]


def main(argv=None) -> int:
    import argparse
    import logging
    import tempfile
    import warnings

    import datasets

    from .cases import Context
    from .report import format_table

    ap = argparse.ArgumentParser(prog="python -m bench.ray_case", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=None)
    args = ap.parse_args(argv)
    datasets.disable_progress_bars()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="mmpipe-bench-ray-") as workdir:
        ctx = Context(quick=args.quick, repeat=args.repeat or (1 if args.quick else 3), workdir=workdir)
        results = case_ray(ctx)
    print(format_table(results))
    for r in results:
        print(f"{r.case.strip()}: {r.mmpipe} vs {r.baseline} -> {r.ratio_text}")
    return 0 if all(r.identical for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
