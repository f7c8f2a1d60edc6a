"""The benchmark cases of issue 6. Each case builds its data, checks that mmpipe's output equals
the baseline's (before any timing), times both side by side and returns `Result` rows.

Baselines are what people do today with the transformers processor / model and ``datasets``;
they are written here in full so the comparison can be read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from . import data
from .timing import side_by_side


@dataclass
class Result:
    """One line of the table."""

    case: str
    mmpipe: str  # the figure, formatted with its unit
    baseline: str
    ratio: Optional[float]  # how the figures compare, oriented as in `target`
    ratio_text: str
    target: str
    met: Optional[bool]  # None: no target
    identical: Optional[bool]  # outputs checked equal before timing; None: nothing to compare
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    quick: bool
    repeat: int
    workdir: str
    log: Callable[[str], None] = print
    _proc: Any = None
    _pool: Any = None
    _model: Any = None

    @property
    def processor(self):
        if self._proc is None:
            self._proc = data.processor(self.quick)
        return self._proc

    @property
    def pool(self) -> data.ImagePool:
        if self._pool is None:
            self._pool = data.image_pool(self.quick)
        return self._pool

    @property
    def model(self):
        if self._model is None:
            from mmpipe import testing

            self._model = testing.build_model(data.FAMILY)
        return self._model


def _speed(case: str, mm_s: float, base_s: float, unit: str, target: float, identical: bool,
           per: float = 1.0, detail: Optional[dict] = None, rate: bool = False) -> Result:
    """A speed line. ``per``: work items per call (rows); ``rate``: print items/s, not time."""
    ratio = base_s / mm_s
    if rate:
        mm_txt, base_txt = f"{per / mm_s:,.1f} {unit}/s", f"{per / base_s:,.1f} {unit}/s"
    else:
        mm_txt, base_txt = _fmt_time(mm_s), _fmt_time(base_s)
    return Result(case, mm_txt, base_txt, ratio, f"{ratio:.1f}x", f">= {target:g}x", ratio >= target, identical,
                  detail or {})


def _info(r: Result) -> Result:
    """A line shown for information: no target."""
    r.target, r.met = "(info)", None
    return r


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _timing_detail(t: dict) -> dict:
    return {name: v.to_json() for name, v in t.items()}


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

    import mmpipe

    model = ctx.model
    configs = [(8, 256, 2, (4, 10)), (2, 1024, 8, (4, 10))] if ctx.quick else \
        [(64, 2048, 2, (8, 24)), (8, 16384, 8, (16, 36))]
    out = []
    for B, L, n_img, side in configs:
        ids, tt, grid, mask = _rope_batch(B, L, n_img, side, seed=B + L)

        def ours():
            return mmpipe.get_rope_index(ids, tt, image_grid_thw=grid, attention_mask=mask, family=data.FAMILY)

        def theirs():
            return model.model.get_rope_index(ids, tt, image_grid_thw=grid, attention_mask=mask)

        with torch.no_grad():
            (p1, d1), (p2, d2) = ours(), theirs()
            same = bool(torch.equal(p1, p2) and torch.equal(d1.reshape(-1), d2.reshape(-1)))
            # timeit-style: each sample is the mean of back-to-back calls (>= 0.1 s of them)
            t = side_by_side({"mmpipe": ours, "transformers": theirs}, repeat=2 * ctx.repeat, warmup=2,
                             min_time=0.02 if ctx.quick else 0.1)
        out.append(_speed(f"M-RoPE positions B={B} L={L} {n_img} img/row", t["mmpipe"].best,
                          t["transformers"].best, "", 30, same,
                          detail={"timing": _timing_detail(t), "images": int(grid.shape[0]),
                                  "vision_tokens": int(tt.sum())}))
    return out


# ---- rows shared by the encode cases ----------------------------------------------------------
def _rows(ctx: Context, counts: dict[int, int], start: int = 0) -> list[dict]:
    return data.chat_rows(ctx.pool, counts, start=start)


def _processor_row(proc, row: dict, return_tensors: str = "pt"):
    """The baseline's per-row work (verl's RLHFDataset.__getitem__): decode the images,
    render the chat template, run the processor."""
    images = data.decode_images(row)
    text = proc.apply_chat_template(row["messages"], tokenize=False,
                                    add_generation_prompt=row["messages"][-1]["role"] != "assistant")
    return proc(text=[text], images=images or None, return_tensors=return_tensors)


def _encode_counts(ctx: Context) -> dict[int, int]:
    return {1: 4, 2: 3, 8: 1} if ctx.quick else {1: 12, 2: 8, 8: 2}


# ---- 2. layout only ----------------------------------------------------------------------------
def case_layout(ctx: Context) -> list[Result]:
    import mmpipe

    proc = ctx.processor
    rows = _rows(ctx, _encode_counts(ctx))
    n_img = sum(len(r["images"]) for r in rows)

    def ours():
        return [mmpipe.encode(r, processor=proc, pixels="none") for r in rows]

    def theirs():
        return [_processor_row(proc, r, "np") for r in rows]

    same = True
    for a, b in zip(ours(), theirs()):
        same &= np.array_equal(np.asarray(a["input_ids"]), b["input_ids"][0])
        same &= np.array_equal(np.asarray(a["image_grid_thw"]).reshape(-1, 3), b["image_grid_thw"])
        same &= np.array_equal(np.asarray(a["mm_token_type_ids"]), b["mm_token_type_ids"][0])
    t = side_by_side({"mmpipe": ours, "processor": theirs}, repeat=max(2, ctx.repeat - 2))
    n = len(rows)
    return [_speed(f"layout only (ids, grids, positions), {n} rows/{n_img} images", t["mmpipe"].best,
                   t["processor"].best, "rows", 50, bool(same), per=n, rate=True,
                   detail={"timing": _timing_detail(t), "rows": n, "images": n_img})]


# ---- 3. full encode ------------------------------------------------------------------------------
def case_encode(ctx: Context) -> list[Result]:
    import mmpipe

    proc = ctx.processor
    rows = _rows(ctx, _encode_counts(ctx), start=3)
    n, n_img = len(rows), sum(len(r["images"]) for r in rows)

    raw_batch = {k: [r[k] for r in rows] for k in rows[0]}  # what dataset.map(batched=True) passes

    def ours():  # dataset.map(mmpipe.encode, batched=True) / encode_dataset: images of the next rows prefetched
        out = mmpipe.encode(raw_batch, processor=proc)
        return [{k: v[i] for k, v in out.items()} for i in range(n)]

    def ours_rows():  # dataset.map(mmpipe.encode): one call per row, a row's images on threads
        return [mmpipe.encode(r, processor=proc) for r in rows]

    def ours_1t():
        return [mmpipe.encode(r, processor=proc, threads=1) for r in rows]

    def ours_f32():
        return [mmpipe.encode(r, processor=proc, pixels="float32") for r in rows]

    def theirs():
        return [_processor_row(proc, r) for r in rows]

    from mmpipe.images.spec import VisionSpec
    from mmpipe.images.load import load_image
    from mmpipe.images.pixels import resize_image

    spec = VisionSpec.from_processor(proc)

    def pil_only():  # the PIL work both sides do: decode + bicubic resize, one thread
        return [resize_image(load_image(v), spec) for r in rows for v in r["images"]]

    # identical: ids, grids, and float32 pixel_values (uint8 rows expanded by collate; float32 rows as stored)
    same = same32 = True
    for a, a32, b in zip(ours(), ours_f32(), theirs()):
        batch = mmpipe.collate([a], processor=proc)
        ref_pv = b["pixel_values"].numpy()
        same &= np.array_equal(batch.input_ids[0].numpy(), b["input_ids"][0].numpy())
        same &= np.array_equal(batch.image_grid_thw.numpy(), b["image_grid_thw"].numpy())
        same &= np.array_equal(batch.pixel_values.numpy(), ref_pv)
        pv32 = np.asarray(a32["pixel_values"], np.float32).reshape(ref_pv.shape)
        same32 &= np.array_equal(pv32, ref_pv) and np.array_equal(np.asarray(a32["input_ids"]), b["input_ids"][0].numpy())
    same &= all(a["pixel_values_u8"] == b["pixel_values_u8"] == c["pixel_values_u8"]
                and np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["input_ids"], c["input_ids"])
                for a, b, c in zip(ours(), ours_rows(), ours_1t()))
    t = side_by_side({"mmpipe": ours, "mmpipe_rows": ours_rows, "mmpipe_1t": ours_1t, "mmpipe_f32": ours_f32,
                      "processor": theirs, "pil_decode_resize": pil_only}, repeat=max(2, ctx.repeat - 2))
    # single-thread ceiling: the processor's time over the PIL decode + resize both must do
    ceiling = t["processor"].best / t["pil_decode_resize"].best
    detail = {"timing": _timing_detail(t), "rows": n, "images": n_img, "single_thread_ceiling_x": ceiling,
              "pil_share_of_mmpipe_1thread": t["pil_decode_resize"].best / t["mmpipe_1t"].best}
    return [
        _speed(f"full encode, {n} rows/{n_img} images (uint8 rows, batched map)", t["mmpipe"].best,
               t["processor"].best, "rows", 3, bool(same), per=n, rate=True, detail=detail),
        _info(_speed("  same, one call per row (per-row map)", t["mmpipe_rows"].best, t["processor"].best,
                     "rows", 0, bool(same), per=n, rate=True)),
        _info(_speed("  same, per row, one image thread (threads=1)", t["mmpipe_1t"].best, t["processor"].best,
                     "rows", 0, bool(same), per=n, rate=True)),
        _info(_speed("  PIL decode + resize alone, one thread (ceiling)", t["pil_decode_resize"].best,
                     t["processor"].best, "rows", 0, bool(same), per=n, rate=True)),
        _info(_speed("  same, per row, pixels='float32' (the processor's float32 stored as is)", t["mmpipe_f32"].best,
                     t["processor"].best, "rows", 0, bool(same32), per=n, rate=True)),
    ]


# ---- 4. bytes per image on disk ------------------------------------------------------------------
def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path)
               for f in files if f.endswith(".arrow"))


def _saved_bytes(ds, path: str, columns: Optional[list[str]] = None) -> int:
    (ds.select_columns(columns) if columns else ds).save_to_disk(path)
    return _dir_bytes(path)


def case_bytes(ctx: Context) -> list[Result]:
    import datasets

    import mmpipe
    from mmpipe.records.row import MultiModalInputs

    proc = ctx.processor
    pool = ctx.pool
    # every pool image once, in rows of 1, 2 and 8 images
    n = len(pool.values)
    counts = {1: 3, 2: 2, 8: max(1, (n - 7) // 8)} if not ctx.quick else {1: 2, 2: 1, 8: 1}
    rows = _rows(ctx, counts)
    n_img = sum(len(r["images"]) for r in rows)
    ours = [mmpipe.encode(r, processor=proc) for r in rows]
    ours32 = [mmpipe.encode(r, processor=proc, pixels="float32") for r in rows]
    ref = [_processor_row(proc, r, "np") for r in rows]
    d_u8 = datasets.Dataset.from_list(ours, features=MultiModalInputs.features("uint8"))
    d_32 = datasets.Dataset.from_list(ours32, features=MultiModalInputs.features("float32"))
    # the baseline column: the processor's own pixel_values, as datasets stores float32 arrays
    d_ref = datasets.Dataset.from_list([{"pixel_values": r["pixel_values"]} for r in ref])
    w = ctx.workdir
    b_u8 = _saved_bytes(d_u8, f"{w}/bytes_u8_col", ["pixel_values_u8"])
    b_ref = _saved_bytes(d_ref, f"{w}/bytes_f32_col")
    row_u8 = _saved_bytes(d_u8, f"{w}/bytes_u8_rows")
    row_32 = _saved_bytes(d_32, f"{w}/bytes_f32_rows")
    # lossless: the uint8 rows read back from disk rebuild the processor's pixel_values exactly
    back = datasets.load_from_disk(f"{w}/bytes_u8_rows")
    batch = mmpipe.collate(list(back), processor=proc)
    same = bool(np.array_equal(batch.pixel_values.numpy(), np.concatenate([r["pixel_values"] for r in ref]))
                and np.array_equal(batch.image_grid_thw.numpy(), np.concatenate([r["image_grid_thw"] for r in ref])))
    ratio, ratio_rows = b_u8 / b_ref, row_u8 / row_32
    kb = lambda b: f"{b / n_img / 1024:,.1f} KiB/img"  # noqa: E731
    detail = {"images": n_img, "rows": len(rows), "pixel_column_bytes": {"uint8": b_u8, "float32": b_ref},
              "row_bytes": {"uint8": row_u8, "float32": row_32}}
    return [
        Result(f"bytes/image on disk, pixel column ({n_img} images)", kb(b_u8), kb(b_ref), ratio,
               f"1/{1 / ratio:.2f}", "<= 1/8, lossless", ratio <= 1 / 8 and same, same, detail),
        Result("bytes/image on disk, whole encoded rows", kb(row_u8), kb(row_32), ratio_rows,
               f"1/{1 / ratio_rows:.2f}", "(info: same rows with float32 pixels)", None, same, {}),
    ]


# ---- 5. collate ------------------------------------------------------------------------------------
def _raw_dataset(rows: list[dict]):
    import datasets

    return datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))


def _baseline_rows(ctx: Context, rows: list[dict]) -> list[dict]:
    """What a float32 cache holds: the processor's outputs per row, plus transformers'
    M-RoPE positions per row (verl computes them in __getitem__)."""
    import torch

    out = []
    for r in rows:
        o = _processor_row(ctx.processor, r)
        with torch.no_grad():
            pos, _ = ctx.model.model.get_rope_index(o["input_ids"], o["mm_token_type_ids"],
                                                     image_grid_thw=o["image_grid_thw"],
                                                     attention_mask=o["attention_mask"])
        out.append({"input_ids": o["input_ids"][0].numpy(), "attention_mask": o["attention_mask"][0].numpy(),
                    "mm_token_type_ids": o["mm_token_type_ids"][0].numpy(), "position_ids": pos[:, 0].numpy(),
                    "pixel_values": o["pixel_values"].numpy(), "image_grid_thw": o["image_grid_thw"].numpy()})
    return out


def verl_style_collate(rows: list[dict], pad_id: int) -> dict:
    """The baseline collate: per-row tensors (datasets' torch format), left-padded one by one
    and stacked; images kept per row in an object array (verl's ``multi_modal_inputs``) and
    concatenated with torch.cat where the model is called."""
    import torch
    import torch.nn.functional as F

    L = max(int(r["input_ids"].shape[0]) for r in rows)
    ids, att, mm, pos = [], [], [], []
    for r in rows:
        pad = L - int(r["input_ids"].shape[0])
        ids.append(F.pad(r["input_ids"], (pad, 0), value=pad_id))
        att.append(F.pad(r["attention_mask"], (pad, 0)))
        mm.append(F.pad(r["mm_token_type_ids"], (pad, 0)))
        pos.append(F.pad(r["position_ids"], (pad, 0)))
    mmi = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        mmi[i] = {"pixel_values": r["pixel_values"], "image_grid_thw": r["image_grid_thw"]}
    batch = {"input_ids": torch.stack(ids), "attention_mask": torch.stack(att),
             "mm_token_type_ids": torch.stack(mm), "position_ids": torch.stack(pos, dim=1)}
    # the model side: torch.cat of the per-row image tensors
    batch["pixel_values"] = torch.cat([m["pixel_values"] for m in mmi])
    batch["image_grid_thw"] = torch.cat([m["image_grid_thw"] for m in mmi])
    return batch


def _plain_copy_rate(nbytes: int, repeat: int) -> float:
    """GB/s of the faster of numpy and torch copying ``nbytes`` into a fresh buffer."""
    import torch

    src = np.ones(nbytes // 4, np.float32)
    ts = torch.from_numpy(src)
    t = side_by_side({"np.copy": lambda: src.copy(), "torch.clone": lambda: ts.clone()}, repeat=repeat)
    return nbytes / min(v.best for v in t.values()) / 1e9


def case_collate(ctx: Context) -> list[Result]:
    import datasets

    import mmpipe
    from mmpipe.batching.collate import ArrowRows

    proc = ctx.processor
    B = 8 if ctx.quick else 32
    rows = _rows(ctx, {2: B}, start=5)
    w = ctx.workdir
    enc = _raw_dataset(rows).map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=["messages", "images"])
    enc.save_to_disk(f"{w}/collate_u8")
    datasets.Dataset.from_list(_baseline_rows(ctx, rows)).save_to_disk(f"{w}/collate_f32")
    ours_ds = datasets.load_from_disk(f"{w}/collate_u8")  # memory-mapped Arrow
    base_ds = datasets.load_from_disk(f"{w}/collate_f32").with_format("torch")
    collator = mmpipe.Collator(proc)
    arrow_rows = ArrowRows(ours_ds)
    pad_id = collator.pad_token_id
    idx = list(range(B))

    def ours():  # DataLoader(ours_ds, batch_size=B, collate_fn=collator) does exactly this
        return collator(ours_ds.__getitems__(idx))

    def ours_arrow():  # DataLoader(ArrowRows(ours_ds), batch_size=B, collate_fn=collator)
        return collator(arrow_rows.__getitems__(idx))

    def theirs():  # DataLoader(base_ds, batch_size=B, collate_fn=verl_style_collate)
        return verl_style_collate(base_ds.__getitems__(idx), pad_id)

    keys = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "pixel_values", "image_grid_thw")
    ref = theirs()
    same = {}
    for name, fn in (("rows", ours), ("arrow", ours_arrow)):
        b = fn()
        same[name] = all(getattr(b, k).shape == ref[k].shape and bool((getattr(b, k) == ref[k]).all()) for k in keys)
    out_bytes = sum(int(getattr(b, k).nbytes) for k in keys)
    n_img = int(ref["image_grid_thw"].shape[0])
    del b, ref
    t = side_by_side({"mmpipe": ours, "mmpipe_arrow": ours_arrow, "verl": theirs}, repeat=ctx.repeat)
    copy_rate = _plain_copy_rate(out_bytes, ctx.repeat)
    best = min(t["mmpipe"].best, t["mmpipe_arrow"].best)
    rate = out_bytes / best / 1e9
    detail = {"timing": _timing_detail(t), "rows": B, "images": n_img, "output_bytes": out_bytes,
              "plain_copy_GBps": copy_rate}
    return [
        _speed(f"collate {B} rows x 2 images, DataLoader rows ({out_bytes / 2**20:,.0f} MiB out)",
               t["mmpipe"].best, t["verl"].best, "", 3, same["rows"], detail=detail),
        _speed(f"collate {B} rows x 2 images, ArrowRows batch", t["mmpipe_arrow"].best, t["verl"].best, "", 3,
               same["arrow"]),
        Result("collate GB/s vs a plain copy of the same bytes", f"{rate:.2f} GB/s", f"{copy_rate:.2f} GB/s (copy)",
               rate / copy_rate, f"{100 * rate / copy_rate:.0f}%", ">= 50%", rate / copy_rate >= 0.5,
               same["rows"] and same["arrow"], {}),
    ]


# ---- 6. dataset.map scaling ------------------------------------------------------------------------
def case_map_scaling(ctx: Context) -> list[Result]:
    import datasets

    import mmpipe

    proc = ctx.processor
    # datasets gives each process a contiguous half: both halves hold the same rows (mixed
    # order), so the split is even and the ratio measures scaling, not the shard sizes
    half = _rows(ctx, {1: 3, 2: 2, 8: 1} if ctx.quick else {1: 16, 2: 8, 8: 1}, start=7)
    half = [half[i] for i in np.random.default_rng(0).permutation(len(half))]
    rows = half + half
    n, n_img = len(rows), sum(len(r["images"]) for r in rows)
    path = f"{ctx.workdir}/map_raw"
    _raw_dataset(rows).save_to_disk(path)
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
    detail = {"timing": _timing_detail(t), "rows": n, "images": n_img,
              "mmpipe_threads_per_process": _threads_note()}
    return [
        _speed(f"dataset.map(mmpipe.encode) {n} rows/{n_img} images, num_proc=2 vs 1", t["num_proc=2"].best,
               t["num_proc=1"].best, "rows", 1.7, bool(same), per=n, rate=True, detail=detail),
        _info(_speed("  same, num_proc=None (in-process, image threads) vs num_proc=1", t["in-process"].best,
                     t["num_proc=1"].best, "rows", 0, bool(same), per=n, rate=True)),
        _info(_speed("  same, num_proc=None, Image(decode=False) vs num_proc=1", t["in-process, decode=False"].best,
                     t["num_proc=1"].best, "rows", 0, bool(same), per=n, rate=True)),
    ]


def _threads_note() -> dict:
    from mmpipe.images.threads import default_threads

    return {"main_process": default_threads(), "forked_worker": 1}


# ---- 7. peak RSS while encoding ----------------------------------------------------------------------
def case_rss(ctx: Context) -> list[Result]:
    marks = (100, 250, 500) if ctx.quick else (1000, 2500, 5000)
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


# ---- 8. packed vs padded token efficiency (issue 7; an info case, no speed target) ----------
from .packing import case_packing  # noqa: E402,F401  (bench/run.py finds cases here by name)


# ---- 9. peak memory of one big row: a 10 MB text row, a 100 MP image (issue 15) ------------
from .memory import case_memory  # noqa: E402,F401
