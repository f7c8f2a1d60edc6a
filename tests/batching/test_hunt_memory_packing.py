"""Memory (hunt): `PackingCollator` / `pack` built the right-padded batch first, seven int64
[rows, longest] arrays (ids, mask, token types, 3 position rows, labels), then kept the valid
tokens: a pack of many short rows and one long one peaked at rows x the longest row (64 rows,
one of 4k tokens: 14.5 MB for a 6.7k-token pack). The tokens are put end to end directly now
(`mmpipe.batching.collate.collate_packed`). Counted, not timed: the collate's peak traced bytes."""

from __future__ import annotations

import logging
import tracemalloc

import numpy as np
import torch

import mmpipe
from mmpipe.batching.packing import PackingCollator, to_padded
from mmpipe.testing import invariants

from conftest import processor_for


def _row(proc, words: int, image=None):
    content = ([{"type": "image"}] if image is not None else []) + [{"type": "text", "text": "hi " * words}]
    raw = {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}],
           "images": [image] if image is not None else []}
    return mmpipe.encode_row(raw, proc)


def test_pack_peak_is_the_sum_of_rows_not_rows_times_the_longest(caplog):
    proc = processor_for("qwen2_vl")
    short, long_ = _row(proc, 5), _row(proc, 4000)
    rows = [short] * 63 + [long_]
    col = PackingCollator(proc)
    with caplog.at_level(logging.ERROR, logger="mmpipe"):
        col(rows[:2])  # warm: the one-time warning, lazy imports
        tracemalloc.start()
        try:
            packed = col(rows)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    padded_one = len(rows) * len(long_) * 8  # ONE int64 [rows, longest] array: 2 MB
    assert packed.input_ids.shape == (1, sum(len(r) for r in rows))
    # the old path peaked at ~7 such arrays (14.5 MB measured); now ~0.55 MB
    assert peak < padded_one, f"peak {peak} bytes for {len(rows)} rows, longest {len(long_)}"


def test_direct_pack_equals_the_padded_batch():
    """Guard: the pack (and its way back) equals what collating the rows right-padded gives, for
    rows with and without images and labels."""
    proc = processor_for("qwen2_5_vl")
    img = mmpipe.testing.tiny_image(60, 90, seed=1)
    rows = [_row(proc, 3), _row(proc, 40, img), _row(proc, 1, img), _row(proc, 12)]
    rows[3].labels = None
    packed = invariants.assert_pack_roundtrip(rows, processor=proc)
    want = mmpipe.collate(rows, processor=proc, padding_side="right")
    got = to_padded(packed)
    for name in ("input_ids", "mm_token_type_ids", "position_ids", "attention_mask", "pixel_values", "image_grid_thw",
                 "rope_deltas", "seq_lengths"):
        a, b = getattr(got, name), getattr(want, name)
        mask = want.attention_mask.bool() if name in ("input_ids", "mm_token_type_ids") else None
        assert torch.equal(a[mask] if mask is not None else a, b[mask] if mask is not None else b), name
    assert np.array_equal(packed.cu_seqlens.numpy(), np.concatenate([[0], np.cumsum([len(r) for r in rows])]))
