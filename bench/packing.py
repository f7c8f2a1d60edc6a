"""Packed vs padded token efficiency (issue 7): real tokens / token slots per epoch.

Not a speed case: it counts how many of the tokens a model would run are real, on the
demo's rows (``mmpipe.cli.demo.build_rows``: 0-3 images, the test processor's small bounds) and
on the benchmark's chat rows (real Qwen2-VL checkpoint bounds, 0-8 photos per row). Lengths
come from the layout-only encode (no pixel decode). Before counting, it checks on a few rows
that a pack's model logits equal the rows' padded-batch logits, so the packed figure is a
figure for correct batches.

Run with the suite (``python -m bench --only packing``) or alone (``python -m bench.packing``).
"""

from __future__ import annotations

import numpy as np

from . import data


def _layout_lengths(rows: list[dict], proc) -> tuple[np.ndarray, np.ndarray]:
    import mmpipe

    enc = [mmpipe.encode(r, processor=proc, pixels="none") for r in rows]
    return (np.asarray([len(e["input_ids"]) for e in enc], np.int64),
            np.asarray([len(e["image_grid_thw"]) for e in enc], np.int64))


def efficiency(lengths, num_images, *, batch_size: int, max_tokens: int, max_images: int, seed: int = 0) -> dict:
    """Per-epoch token efficiency of four ways to batch the same rows.

    - ``padded_fixed``: ``batch_size`` rows in shuffled order, padded to the longest (the
      usual DataLoader);
    - ``padded_budget``: `TokenBudgetBatchSampler(cost="padded")` (length-grouped);
    - ``packed``: `TokenBudgetBatchSampler(cost="packed")` + `PackingCollator`: no pad at all;
      ``packed_fill`` is the share of the ``max_tokens`` budget the packs fill (the
      efficiency if each pack were padded to ``max_tokens`` for static shapes).
    """
    from mmpipe.batching.sampler import TokenBudgetBatchSampler, token_efficiency

    n = len(lengths)
    order = np.random.default_rng(seed).permutation(n)
    fixed = [order[i:i + batch_size].tolist() for i in range(0, n, batch_size)]
    kw = dict(max_tokens=max_tokens, max_images=max_images, seed=seed)
    padded = TokenBudgetBatchSampler(lengths, num_images, cost="padded", **kw).batches()
    packed = TokenBudgetBatchSampler(lengths, num_images, cost="packed", **kw).batches()
    slots_fixed = sum(len(b) * int(lengths[b].max()) for b in fixed)
    return {
        "rows": n, "real_tokens": int(lengths.sum()), "images": int(num_images.sum()),
        "min_len": int(lengths.min()), "max_len": int(lengths.max()), "mean_len": float(lengths.mean()),
        "batch_size": batch_size, "max_tokens": max_tokens, "max_images": max_images,
        "padded_fixed": token_efficiency(lengths, fixed), "padded_fixed_slots": int(slots_fixed),
        "padded_fixed_batches": len(fixed),
        "padded_budget": token_efficiency(lengths, padded), "padded_budget_batches": len(padded),
        "packed": token_efficiency(lengths, packed, cost="packed"), "packed_batches": len(packed),
        "packed_fill": token_efficiency(lengths, packed, slots_per_batch=max_tokens),
    }


def packed_equals_padded(rows: list[dict], proc, family: str) -> bool:
    """The tiny model's logits on a pack equal the padded batch's, row by row (fp32)."""
    import torch

    import mmpipe
    from mmpipe import testing
    from mmpipe.batching.packing import pack

    model = testing.build_model(family)
    recs = [mmpipe.encode_row(r, proc) for r in rows]
    packed, batch = pack(recs, processor=proc), mmpipe.collate(recs, processor=proc, padding_side="right")
    with torch.no_grad():
        a = packed.split(model(**packed.model_inputs()).logits)
        b = model(**batch.model_inputs()).logits
    return all(torch.allclose(a[k], b[k, :r.num_tokens], atol=1e-5, rtol=1e-5) for k, r in enumerate(recs))


def measure(quick: bool = False) -> dict:
    """Both data sets' figures (see `efficiency`)."""
    from mmpipe.cli import demo
    from mmpipe import testing

    out = {}
    proc = testing.build_processor("qwen2_vl")
    ds, _ = demo.build_rows(48 if quick else 240, demo.image_pool())
    rows = [ds[i] for i in range(len(ds))]
    out["identical"] = packed_equals_padded(rows[:4], proc, "qwen2_vl")
    lengths, imgs = _layout_lengths(rows, proc)
    out["demo rows"] = efficiency(lengths, imgs, batch_size=8, max_tokens=2048, max_images=16)
    bproc = data.processor(quick)
    counts = {0: 4, 1: 12, 2: 8, 8: 2} if quick else {0: 40, 1: 120, 2: 80, 8: 20}
    brows = data.chat_rows(data.image_pool(quick), counts)
    order = np.random.default_rng(1).permutation(len(brows))
    brows = [brows[i] for i in order]
    lengths, imgs = _layout_lengths(brows, bproc)
    out["bench rows"] = efficiency(lengths, imgs, batch_size=8, max_tokens=4096 if quick else 16384,
                                   max_images=64)
    return out


def case_packing(ctx) -> list:
    """Result lines (bench/cases.py `Result`): packed and length-grouped vs fixed padded batches."""
    from .cases import Result

    m = measure(ctx.quick)
    res = []
    for name in ("demo rows", "bench rows"):
        e = m[name]
        res.append(Result(
            case=f"token efficiency, {name}: {e['rows']} rows, {e['min_len']}-{e['max_len']} tokens",
            mmpipe=f"packed {e['packed']:.1%} ({e['packed_batches']} packs, fill {e['packed_fill']:.1%} of "
                   f"{e['max_tokens']}); length-grouped padded {e['padded_budget']:.1%}",
            baseline=f"padded, {e['batch_size']} rows/batch: {e['padded_fixed']:.1%}",
            ratio=e["packed"] / e["padded_fixed"], ratio_text=f"{e['packed'] / e['padded_fixed']:.2f}x real/slot",
            target="(info)", met=None, identical=bool(m["identical"]), detail=e,
        ))
    return res


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure("--quick" in sys.argv), indent=1))
