"""Reused pixel buffers (issue 34) under a real DataLoader (hunt, guard): worker processes
collating ahead (``prefetch_factor``), batches sent through shared memory, pinned by the pin
thread, and all of them kept alive at once by the consumer (gradient accumulation, a list).
No batch may come out with another batch's pixels: each equals the same rows collated with
the pool off. (Without an accelerator torch skips pinning: ``pin_memory=True`` checks the pin
thread only on a machine with a GPU.)"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import mmpipe
from mmpipe import testing
from mmpipe.images import buffers


@pytest.mark.parametrize("workers,pin", [(0, False), (2, False), (2, True)])
def test_loader_batches_keep_their_own_pixels(monkeypatch, workers, pin):
    proc = testing.build_processor("qwen2_vl")
    photos = [p for _, p in testing.sample_photos()]
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
                                            {"role": "assistant", "content": "ok"}],
                               "images": [photos[i % 3].rotate(9 * i)]}, proc) for i in range(18)]
    col = mmpipe.Collator(proc)
    # every batch's float32 pixels (>= 0.2 MiB here) from the pool; forked workers start their own pool
    # with these bounds (buffers._forget)
    monkeypatch.setattr(buffers, "PIXEL_BUFFERS", buffers.BufferPool(max_buffers=2, min_bytes=64 << 10))
    kw = dict(num_workers=workers, pin_memory=pin)
    if workers:
        kw.update(prefetch_factor=4, multiprocessing_context="fork")
    got = [b.pixel_values for b in DataLoader(rows, batch_size=3, collate_fn=col, **kw)]
    monkeypatch.setenv("MMPIPE_BUFFER_POOL", "0")
    want = [col(rows[i:i + 3]).pixel_values for i in range(0, len(rows), 3)]
    assert len(got) == len(want) == 6
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert len({g.data_ptr() for g in got}) == len(got)  # six batches alive: six memories
