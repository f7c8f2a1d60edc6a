"""Peak memory of encoding many-image rows (hunt): ``threads=k`` means at most k images decoded
at once. Each image decode holds the full-size picture (a 12 MP photo: ~48 MB) until it is
resized; `Encoder.load_images` and the batched map's prefetch submitted to the shared 8-thread
pool, so a row of 8 photos encoded with ``threads=2`` held all 8 at full size (peak RSS 441 MB
measured, 120 MB with the bound; 60 MB on one thread). Counted, not timed: the most
`Encoder.load_image` calls running at once (each waits briefly for a third to join it)."""

from __future__ import annotations

import threading

import datasets

import mmpipe
from mmpipe.encoding.encoder import Encoder
from mmpipe.testing import tiny_image

from conftest import processor_for


def count_concurrent_loads(monkeypatch) -> list:
    """Patch `Encoder.load_image`; returns [peak] of calls running at once."""
    real, cond, state = Encoder.load_image, threading.Condition(), {"active": 0, "peak": 0}

    def load_image(self, i, value, where):
        with cond:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
            cond.notify_all()
            cond.wait_for(lambda: state["active"] >= 3, timeout=0.2)  # unbounded: a third joins at once
        try:
            return real(self, i, value, where)
        finally:
            with cond:
                state["active"] -= 1

    monkeypatch.setattr(Encoder, "load_image", load_image)
    return state


def row(n_images: int, seed: int = 0) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": "q"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "a"}]}],
            "images": [tiny_image(40 + 8 * k, 48, seed=seed + k) for k in range(n_images)]}


def test_a_row_decodes_at_most_threads_images_at_once(monkeypatch):
    state = count_concurrent_loads(monkeypatch)
    out = Encoder(processor_for("qwen2_vl"), threads=2).encode_row(row(6))
    assert out.num_images == 6
    assert state["peak"] <= 2  # was 6: every image of the row on the 8-thread pool


def test_batched_map_prefetch_decodes_at_most_threads_images_at_once(monkeypatch):
    state = count_concurrent_loads(monkeypatch)
    ds = datasets.Dataset.from_list([row(2, seed=10 * r) for r in range(4)])
    enc = ds.map(mmpipe.encode, batched=True, fn_kwargs={"processor": processor_for("qwen2_vl"), "threads": 2},
                 remove_columns=ds.column_names)
    assert [len(g) for g in enc["image_grid_thw"]] == [2, 2, 2, 2]
    assert state["peak"] <= 2  # was up to 8: 2 x threads rows ahead on the 8-thread pool
