"""Whole-process A/B of a realistic job: raw chat rows with real-size photos (a saved
``datasets`` dataset, images embedded) -> one DataLoader epoch of model-ready batches.

- mmpipe: the README's call ``ds.map(mmpipe.encode, fn_kwargs={"processor": p}, num_proc=2)``,
  then ``DataLoader(encoded, batch_size=8, collate_fn=mmpipe.Collator(p))`` in the main process
  (``num_workers=0``: the collate is cheaper than shipping its float32 batch through a worker
  queue; measured here with real-size photos, ``num_workers=2`` made the epoch 6-9 s instead of ~1 s).
- TRL: no pre-encoding; ``DataLoader(raw, batch_size=8, collate_fn=DataCollatorForVisionLanguageModeling(p),
  num_workers=2)``: the processor runs at collate time, on the same two cores.

Each run is a fresh ``python -m bench.job --child NAME`` process; wall time and the peak RSS
of its whole process tree (map and DataLoader workers included) are measured from outside
(`bench.procs`). Both print a checksum of their batches (real token ids, float64 sum of
``pixel_values``, grids), checked equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

BATCH = 8
WORKERS = 2


def _rows(quick: bool) -> list[dict]:
    from . import data

    pool = data.image_pool(quick)
    keep = [v for v, name in zip(pool.values, pool.names) if name.startswith("photo-like")]
    pool = data.ImagePool(keep, ["photo"] * len(keep))
    n = 8 if quick else 64
    rows, k = [], 0
    for i in range(n):
        c = 1 + i % 2
        rows.append(data.chat_row(pool.pick(c, k), i))
        k += c
    return rows


def _checksum(batches) -> dict:
    ids = grid = 0
    pix = 0.0
    for b in batches:
        get = (lambda k: b[k]) if isinstance(b, dict) or hasattr(b, "keys") else (lambda k: getattr(b, k))
        ids += int(get("input_ids")[get("attention_mask").bool()].sum())
        pix += float(get("pixel_values").double().sum())
        grid += int(get("image_grid_thw").sum())
    return {"ids": ids, "pixels": pix, "grids": grid}


def child(name: str, workdir: str, quick: bool) -> dict:
    import time

    import datasets
    import torch

    from . import data

    datasets.disable_progress_bars()
    proc = data.processor(quick)
    raw = datasets.load_from_disk(os.path.join(workdir, "job_raw"))
    t0 = time.perf_counter()
    if name == "mmpipe":
        import mmpipe

        out = os.path.join(workdir, "job_mm")
        os.makedirs(out, exist_ok=True)
        enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, num_proc=2, remove_columns=raw.column_names,
                      load_from_cache_file=False, cache_file_name=os.path.join(out, f"enc{os.getpid()}.arrow"))
        loader = torch.utils.data.DataLoader(enc, batch_size=BATCH, collate_fn=mmpipe.Collator(proc), num_workers=0)
    else:
        from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

        loader = torch.utils.data.DataLoader(raw, batch_size=BATCH, num_workers=WORKERS,
                                             collate_fn=DataCollatorForVisionLanguageModeling(processor=proc))
    t1 = time.perf_counter()
    out = _checksum(loader)
    return {"checksum": out, "encode_s": t1 - t0, "epoch_s": time.perf_counter() - t1}


def case_job(ctx) -> list:
    from .encode_cases import raw_dataset
    from .procs import run_tree
    from .report import Result, fig
    from .timing import Timing

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = _rows(ctx.quick)
    raw_dataset(rows).save_to_disk(os.path.join(ctx.workdir, "job_raw"))
    n, n_img = len(rows), sum(len(r["images"]) for r in rows)
    names = ("mmpipe", "trl")
    runs: dict[str, list] = {k: [] for k in names}
    for r in range(max(ctx.repeat, 1)):
        for name in names[r % 2:] + names[:r % 2]:
            cmd = [sys.executable, "-m", "bench.job", "--child", name, "--workdir", ctx.workdir] + (
                ["--quick"] if ctx.quick else [])
            res = run_tree(cmd, cwd=root, cap_mib=8192)
            if res.returncode != 0:
                raise RuntimeError(f"job child {name} failed (capped={res.capped}):\n{res.stderr[-3000:]}")
            runs[name].append((res.wall_s, res.peak_mib, json.loads(res.stdout.strip().splitlines()[-1])))
    sums = {k: v[0][2].pop("checksum") for k, v in runs.items()}
    phases = {k: [x[2] for x in v] for k, v in runs.items()}
    same = sums["mmpipe"] == sums["trl"]
    wall = {k: Timing([x[0] for x in v]) for k, v in runs.items()}
    rss = {k: Timing([x[1] for x in v]) for k, v in runs.items()}
    ratio = wall["trl"].median / wall["mmpipe"].median
    detail = {"rows": n, "images": n_img, "checksums": sums, "phases_s": phases, "wall": {k: v.to_json() for k, v in wall.items()},
              "peak_tree_rss_mib": {k: v.to_json() for k, v in rss.items()}, "batch_size": BATCH,
              "num_workers": WORKERS}
    base = f"TRL collator in DataLoader(num_workers={WORKERS}) on the raw rows, one epoch (mmpipe: num_workers=0)"
    mib = lambda t: f"{t.median:,.0f} [{t.best:,.0f}-{t.worst:,.0f}] MiB"  # noqa: E731
    return [
        Result(f"whole job: {n} raw rows/{n_img} photos -> encode (num_proc=2) -> 1 epoch, wall",
               fig(wall["mmpipe"]), fig(wall["trl"]), ratio, f"{ratio:.2f}x", "(info)", None, same, detail, base),
        Result("  same job, peak RSS of the process tree", mib(rss["mmpipe"]), mib(rss["trl"]),
               rss["mmpipe"].median / rss["trl"].median, f"{rss['mmpipe'].median / rss['trl'].median:.2f}x TRL's",
               "(info)", None, same, {}, base),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True, choices=("mmpipe", "trl"))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import logging
    import warnings

    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    print(json.dumps(child(args.child, args.workdir, args.quick)))


if __name__ == "__main__":
    main()
