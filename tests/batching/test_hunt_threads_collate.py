"""Thread concurrency (hunt), guard: one Collator and one PackingCollator shared by threads (thread-based
prefetch, an async server collating per request) with the reused pixel buffers (issue 34's pool) on
for small batches: every batch equals the single-thread batch, and a batch kept alive is never
overwritten by another thread's collate. Passes before and after the hunt's fixes. Counted, not timed:
a barrier, the switch interval shortened."""

from __future__ import annotations


import torch

import mmpipe
from mmpipe.images import buffers
from mmpipe.images.buffers import BufferPool
from mmpipe.testing import tiny_image

from conftest import processor_for
from helpers import run_threads


def _tensors(batch) -> dict:
    return {k: v.clone() for k, v in batch.model_inputs().items() if torch.is_tensor(v)}


def test_shared_collators_with_the_buffer_pool(monkeypatch):
    monkeypatch.setattr(buffers, "PIXEL_BUFFERS", BufferPool(max_buffers=3, min_bytes=16 << 10))
    proc = processor_for("qwen2_vl")
    enc = mmpipe.Encoder(proc)
    rows = [enc.encode_row({"messages": [
        {"role": "user", "content": [{"type": "image"}] * (1 + k % 2) + [{"type": "text", "text": "q" * (k + 1)}]},
        {"role": "assistant", "content": "a" * (k + 1)}],
        "images": [tiny_image(112 + 28 * (k % 3), 140, seed=k + j) for j in range(1 + k % 2)]}) for k in range(8)]
    collators = [mmpipe.Collator(proc), mmpipe.PackingCollator(proc)]
    batches = [rows[i:i + 3] for i in range(6)]
    ref = [[_tensors(c(b)) for b in batches] for c in collators]
    wrong = []

    def work(t: int) -> None:
        alive = []
        try:
            for i in range(12):
                c, k = i % 2, (t + i) % len(batches)
                alive = alive[-2:] + [(collators[c](batches[k]), ref[c][k])]
                for batch, want in alive:  # the batches still held: untouched by any other collate
                    now = _tensors(batch)
                    if now.keys() != want.keys() or not all(torch.equal(now[n], want[n]) for n in want):
                        wrong.append((t, i, "a batch changed"))
        except Exception as e:  # noqa: BLE001
            wrong.append((t, repr(e)))

    for _ in range(6):
        run_threads(work, 6)
    assert wrong == []
    assert buffers.PIXEL_BUFFERS.held_bytes() > 0  # the pool was in use
