"""The benchmark cases (issues 6 and 18). Each case builds its data, checks that mmpipe's output
equals the baseline's (before any timing), times the contenders side by side (rotated, medians
with spread, load recorded) and returns `Result` lines.

Baselines are the strongest path a user of the peer runs, on the same cores; they are written
out in full so the comparison can be read. This module holds the shared `Context`, the M-RoPE,
map-scaling and RSS cases; the others live in encode_cases, collate_case, job, packing, memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import data
from .encode_cases import raw_dataset
from .report import Result, fig, fmt_time, speed
from .timing import side_by_side


@dataclass
class Context:
    quick: bool
    repeat: int
    workdir: str
    log: Callable[[str], None] = print
    backend: str = "pil"  # the image-processor backend of the baseline processor (and so of mmpipe's rows)
    _proc: Any = None
    _pool: Any = None
    _model: Any = None

    @property
    def processor(self):
        if self._proc is None:
            self._proc = data.processor(self.quick, self.backend)
        return self._proc

    @property
    def pool(self) -> data.ImagePool:
        if self._pool is None:
            self._pool = data.image_pool(self.quick, flatten_alpha=self.backend == "torchvision")
        return self._pool

    @property
    def model(self):
        if self._model is None:
            from mmpipe import testing

            self._model = testing.build_model(data.FAMILY)
        return self._model


# ---- 1. M-RoPE positions ---------------------------------------------------------------------
def _rope_batch(B: int, L: int, n_img: int, side: tuple[int, int], seed: int):
    """A left-padded batch of B rows (lengths L-L/8 .. L), each with ``n_img`` images whose
    merged grids are h x w tokens, h, w in ``side``; text between and around the images."""
    import torch

    from mmpipe.testing import special_token_ids

    ids_tab = special_token_ids(data.FAMILY)
    vs, ve, pad_img = ids_tab["<|vision_start|>"], ids_tab["<|vision_end|>"], ids_tab["<|image_pad|>"]
    pad_id = ids_tab["<|endoftext|>"]
    rng = np.random.default_rng(seed)
    input_ids = np.full((B, L), pad_id, np.int64)
    types = np.zeros((B, L), np.int64)
    mask = np.zeros((B, L), np.int64)
    grids = []
    for b in range(B):
        n = int(rng.integers(L - L // 8, L + 1))
        hw = rng.integers(side[0], side[1] + 1, size=(n_img, 2))
        while (hw.prod(1).sum() + 3 * n_img + 8) > n:  # shrink until the images fit
            hw = np.maximum(hw * 3 // 4, 1)
        n_text = n - int(hw.prod(1).sum()) - 2 * n_img
        cuts = np.sort(rng.choice(np.arange(1, n_text), size=n_img, replace=False))
        row_ids, row_tt, prev = [], [], 0
        for k in range(n_img):
            seg = rng.integers(0, 600, size=cuts[k] - prev)
            row_ids += list(seg) + [vs] + [pad_img] * int(hw[k].prod()) + [ve]
            row_tt += [0] * len(seg) + [0] + [1] * int(hw[k].prod()) + [0]
            grids.append([1, 2 * int(hw[k, 0]), 2 * int(hw[k, 1])])
            prev = cuts[k]
        seg = rng.integers(0, 600, size=n_text - prev)
        row_ids += list(seg)
        row_tt += [0] * len(seg)
        assert len(row_ids) == n
        input_ids[b, L - n:] = row_ids
        types[b, L - n:] = row_tt
        mask[b, L - n:] = 1
    t = torch.from_numpy
    return t(input_ids), t(types), t(np.asarray(grids, np.int64)), t(mask)


def case_rope(ctx: Context) -> list[Result]:
    import torch

    model = ctx.model
    # One intra-op thread for every contender: on a shared machine a two-thread torch op stalls
    # whenever another process holds the second core (samples then spread 30x); same core for all.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _rope_configs(ctx, model)
    finally:
        torch.set_num_threads(threads)


def _rope_configs(ctx: Context, model) -> list[Result]:
    import torch

    import mmpipe

    configs = [(8, 256, 2, (4, 10)), (2, 1024, 8, (4, 10))] if ctx.quick else \
        [(64, 2048, 2, (8, 24)), (8, 16384, 8, (16, 36))]
    out = []
    for B, L, n_img, side in configs:
        ids, tt, grid, mask = _rope_batch(B, L, n_img, side, seed=B + L)

        def ours():
            return mmpipe.get_rope_index(ids, tt, image_grid_thw=grid, attention_mask=mask, family=data.FAMILY)

        def theirs():
            return model.model.get_rope_index(ids, tt, image_grid_thw=grid, attention_mask=mask)

        def floor():  # the least any rope does: write [3, B, L] positions once, from one cumsum over the mask
            return torch.cumsum(mask, dim=1).expand(3, B, L).clone()

        valid, flat = mask.bool(), np.arange(B * L)

        def scan():  # the least a prefix-sum M-RoPE does: three advance rows (they differ) written, then scanned
            return torch.empty(3, B, L, dtype=torch.long).copy_(valid.expand(3, B, L)).cumsum_(2)

        def search():  # finding the vision tokens: (type != 0) & mask as bool, the flat index of each
            return flat[(tt.bool() & mask.bool()).numpy().reshape(-1)]

        with torch.no_grad():
            (p1, d1), (p2, d2) = ours(), theirs()
            same = bool(torch.equal(p1, p2) and torch.equal(d1.reshape(-1), d2.reshape(-1)))
            known = _layout_known_floor(p1, tt, mask)
            same = same and torch.equal(known(), p1)  # the floor computes the same positions
            # timeit-style: each sample is the mean of back-to-back calls (>= 0.1 s of them)
            t = side_by_side({"mmpipe": ours, "transformers": theirs, "floor": floor, "scan": scan, "search": search,
                              "known": known},
                             repeat=max(5, ctx.repeat), warmup=2, min_time=0.02 if ctx.quick else 0.1)
        out.append(speed(f"M-RoPE positions B={B} L={L} {n_img} img/row", t["mmpipe"], t["transformers"],
                         "transformers model.model.get_rope_index (tiny Qwen2-VL, same inputs and mask)",
                         target=100, identical=same,  # torch threads: 1 for all (see case_rope)
                         floor=_rope_floor_text(t),
                         detail={"images": int(grid.shape[0]), "vision_tokens": int(tt.sum()),
                                 **{k: t[k].to_json() for k in ("floor", "scan", "search", "known")}}))
        for key, what in (("floor", "one cumsum of the mask written to [3, B, L]"),
                          ("known", "the layout known in advance: [3, B, L] allocated, the text runs as one cumsum, "
                                    "the grids' h/w index writes")):
            r = t["mmpipe"].median / t[key].median
            pr = [a / b for a, b in zip(t["mmpipe"].times, t[key].times)]
            out.append(Result(f"  M-RoPE B={B} L={L} vs floor: {key}", fig(t["mmpipe"]), fig(t[key]), r,
                              f"{r:.2f}x the floor's time [{min(pr):.2f}-{max(pr):.2f}]", "<= 2x", r <= 2.0, same,
                              {"floor_timing": t[key].to_json()}, what, "" if r <= 2.0 else _rope_floor_text(t)))
    return out


def _layout_known_floor(positions, tt, mask):
    """The least memory traffic of an exact M-RoPE whose layout is known in advance (the brief's
    floor): allocate [3, B, L], write the text runs by one cumsum over precomputed advances (1 per
    text token, the block's advance at its last vision token), copy that row to the other two,
    then write each vision token's h and w index (t too where a grid has several frames). Built
    from ``positions`` (checked equal to them), outside the timed region."""
    import torch

    B, L = mask.shape
    vis = (tt.bool() & mask.bool()).reshape(-1)
    idx = torch.nonzero(vis).reshape(-1)
    p = positions.reshape(3, -1)
    base = p[0].clone()  # images: the t row is the block start on the vision tokens
    adv = torch.diff(base.view(B, L), dim=1, prepend=torch.zeros(B, 1, dtype=torch.long))  # cumsum(adv) == base
    vals = [p[a].index_select(0, idx) for a in range(3)]
    rows = [a for a in range(3) if not torch.equal(vals[a], base.index_select(0, idx))]

    def known():
        out = torch.empty(3, B, L, dtype=torch.long)
        torch.cumsum(adv, 1, out=out[0])
        out[1].copy_(out[0])
        out[2].copy_(out[0])
        flat = out.view(3, -1)
        for a in rows:
            flat[a].scatter_(0, idx, vals[a])  # the fastest index write here (index_put_ ~3.5x, numpy ~1.2x)
        return out

    return known


def _rope_floor_text(t) -> str:
    """What stops the M-RoPE ratio, from the floors measured in the same run (fastest samples)."""
    base, mm = t["transformers"].median, t["mmpipe"].median
    f, sc, se = t["floor"].best, t["scan"].best, t["search"].best
    return (f"floors (fastest samples): one cumsum of the mask written to [3, B, L] {fmt_time(f)} (caps any rope at "
            f"{base / f:.0f}x); three advance rows written (from the bool mask) + one cumsum over them (what any "
            f"prefix-sum M-RoPE does: the three rows differ) {fmt_time(sc)} plus finding the vision tokens "
            f"(bool casts, flat index) "
            f"{fmt_time(se)}: {fmt_time(sc + se)} caps this design at {base / (sc + se):.0f}x; mmpipe runs at "
            f"{mm / (sc + se):.2f}x that (the rest: grid checks, per-call overhead)")


def _rows(ctx: Context, counts: dict[int, int], start: int = 0) -> list[dict]:
    return data.chat_rows(ctx.pool, counts, start=start)


# ---- 6. dataset.map scaling ------------------------------------------------------------------------
def case_map_scaling(ctx: Context) -> list[Result]:
    import datasets

    import mmpipe

    proc = ctx.processor
    # datasets gives each process a contiguous half: both halves hold the same rows (mixed
    # order), so the split is even and the ratio measures scaling, not the shard sizes
    # issue 34: 150 real-size rows (240 photos) in the full run
    half = _rows(ctx, {1: 3, 2: 2, 8: 1} if ctx.quick else {1: 48, 2: 24, 8: 3}, start=7)
    half = [half[i] for i in np.random.default_rng(0).permutation(len(half))]
    rows = half + half
    n, n_img = len(rows), sum(len(r["images"]) for r in rows)
    path = f"{ctx.workdir}/map_raw"
    raw_dataset(rows).save_to_disk(path)
    raw = datasets.load_from_disk(path)  # memory-mapped, as a real dataset is
    # datasets decodes Image() values (serially, before the map function); with
    # decode=False mmpipe gets the encoded bytes and decodes them on its image threads
    raw_bytes = raw.cast_column("images", datasets.Sequence(datasets.Image(decode=False)))

    out_dir = f"{ctx.workdir}/map_out"
    counter = [0]

    def run(num_proc, ds=raw):
        # A fresh cache file name per run: datasets reuses the shard count of existing cache
        # files of the same fingerprint, even with load_from_cache_file=False, so a num_proc=2
        # map after a num_proc=1 one would silently run as one process.
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        counter[0] += 1
        return ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, num_proc=num_proc,
                      remove_columns=ds.column_names, load_from_cache_file=False,
                      cache_file_name=f"{out_dir}/run{counter[0]}.arrow")

    # datasets 5 runs num_proc=1 in one worker process too (mmpipe uses one image thread in
    # workers); num_proc=None runs in this process, with mmpipe's image threads.
    runs = {"num_proc=1": lambda: run(1), "num_proc=2": lambda: run(2), "in-process": lambda: run(None),
            "in-process, decode=False": lambda: run(None, raw_bytes)}
    ref = run(1).with_format("arrow")[:]  # in memory: the next run deletes its file
    same = True
    for k, f in runs.items():
        o = f().with_format("arrow")[:]
        same &= o.num_rows == n and all(o.column(c).equals(ref.column(c)) for c in ref.column_names)
    del ref, o
    # the scaling pair gets more samples: it needs both cores free at once on a shared machine
    scaling = {k: runs[k] for k in ("num_proc=1", "num_proc=2")}
    t = side_by_side(scaling, repeat=1 if ctx.quick else max(6, ctx.repeat + 1), warmup=0)
    t.update(side_by_side({k: f for k, f in runs.items() if k not in scaling}, repeat=1 if ctx.quick else 2,
                          warmup=0))
    detail = {"rows": n, "images": n_img, "mmpipe_threads_per_process": _threads_note(),
              "timing": {k: v.to_json() for k, v in t.items()}}
    base = "itself with num_proc=1 (one worker, one image thread)"
    return [
        speed(f"dataset.map(mmpipe.encode) {n} rows/{n_img} images, num_proc=2 vs 1", t["num_proc=2"],
              t["num_proc=1"], base, target=1.8, identical=bool(same), per=n, detail=detail,
              floor=_scaling_floor(t)),
        speed("  same, num_proc=None (in-process, image threads) vs num_proc=1", t["in-process"], t["num_proc=1"],
              base, target=None, identical=bool(same), per=n),
        speed("  same, num_proc=None, Image(decode=False) vs num_proc=1", t["in-process, decode=False"],
              t["num_proc=1"], base, target=None, identical=bool(same), per=n),
    ]


def _scaling_floor(t) -> str:
    """Why num_proc=2 misses 1.8x: the cores the other processes held while it ran (a 2-process map
    needs both cores of the 2-core machine free), and its best pair."""
    two, one = t["num_proc=2"], t["num_proc=1"]
    busy = sorted(two.other_cores)[len(two.other_cores) // 2] if two.other_cores else 0.0
    return (f"2 cores: at most 2x, less the second process's start-up; best paired sample "
            f"{max(a / b for a, b in zip(one.times, two.times)):.2f}x, fastest samples {one.best / two.best:.2f}x; "
            f"other processes kept a median {busy:.1f} cores busy during the num_proc=2 samples")


def _threads_note() -> dict:
    from mmpipe.images.threads import default_threads

    return {"main_process": default_threads(), "forked_worker": 1}


# ---- 7. peak RSS while encoding ----------------------------------------------------------------------
def case_rss(ctx: Context) -> list[Result]:
    marks = (50, 100, 200) if ctx.quick else (1000, 2500, 5000)
    cmd = [sys.executable, "-m", "bench.rss_child", "--workdir", ctx.workdir, "--marks", ",".join(map(str, marks))]
    if ctx.quick:
        cmd.append("--quick")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"rss child failed:\n{proc.stderr[-3000:]}")
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    peaks = {int(k): v["peak_mb"] for k, v in rep["marks"].items()}
    lo, hi = peaks[marks[0]], peaks[marks[-1]]
    growth = hi - lo
    flat = growth <= 0.05 * lo
    txt = " / ".join(f"{peaks[m]:.0f}" for m in marks)
    return [Result(f"peak RSS encoding {marks[0]:,}/{marks[1]:,}/{marks[2]:,} rows (MiB)", txt, "—",
                   growth, f"+{growth:.1f} MiB", "flat (<= +5%)", flat, bool(rep["identical"]), rep)]


# ---- layout / encode / bytes, collate, the whole-process job: their own modules -----------------
from .collate_case import case_collate  # noqa: E402,F401
from .encode_cases import case_bytes, case_encode, case_layout  # noqa: E402,F401
from .job import case_job  # noqa: E402,F401
from .rss_real import case_rss_real  # noqa: E402,F401
from .video_case import case_video  # noqa: E402,F401


# ---- 8. packed vs padded token efficiency (issue 7; an info case, no speed target) ----------
from .packing import case_packing  # noqa: E402,F401  (bench/run.py finds cases here by name)


# ---- 9. peak memory of one big row: a 10 MB text row, a 100 MP image (issue 15) ------------
from .memory import case_memory  # noqa: E402,F401


# ---- 10. per-family figures: encode, layout-only and bytes vs each family's processor (issue 20) --
from .families_case import case_families  # noqa: E402,F401


# ---- 11. encode time against conversation length, labels on vs off (issue 29.2; info) -------
from .turns_case import case_turns  # noqa: E402,F401


# ---- long conversations: generic-path rows with images, multi-turn loops of 10-200 rounds (info) --
from .longconv_case import case_longconv  # noqa: E402,F401


# ---- 12. the judge's answer parser against the reply's length (issue 29.3; info) ---------------
from .judge_parse_case import case_judge_parse  # noqa: E402,F401

# ---- ray: Ray Data encode at 1 and 2 actors next to datasets.map(num_proc=2) (issue 32) ----
from .ray_case import case_ray  # noqa: E402,F401

# ---- audio: mmpipe.encode of audio rows next to the processor's chat path + call (issue 31) ----
from .audio_case import case_audio  # noqa: E402,F401
