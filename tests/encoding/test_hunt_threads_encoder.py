"""Thread concurrency (hunt): one Encoder shared by threads (an async rollout server's
``asyncio.to_thread``, a ThreadPoolExecutor, a Ray actor with max_concurrency > 1) gives every
thread the rows a single thread gets, and its ``stats`` count every row exactly. Counted, not timed:
threads released together by a barrier, the switch interval shortened to widen the races."""

from __future__ import annotations


import numpy as np

import mmpipe
from mmpipe.encoding.mapping import EncodeStats, RowDropped, encode_or_drop
from mmpipe.errors import InputError
from mmpipe.testing import tiny_image

from conftest import processor_for
from helpers import run_threads


class _FailingEncoder:
    """The encoder interface `encode_or_drop` takes: odd rows are dropped, even rows fail."""

    mark_dropped, on_error = True, "skip"

    def __init__(self):
        self.stats = EncodeStats()

    def encode_row(self, example, idx=None, _images=None):
        if example["k"] % 2:
            raise RowDropped("too_long", "a long row")
        raise InputError("a bad row", row=idx, stage="parse")

    def empty_row_dict(self) -> dict:
        return {"input_ids": []}


def test_stats_count_every_row_from_many_threads():
    """A Counter's first count of a reason, made by two threads at once, was counted once (both
    read its missing 0): 32 of 1000 rounds lost counts on the old code (dropped 15 of 16 ...)."""
    wrong = []
    for trial in range(400):
        enc = _FailingEncoder()

        def work(t: int) -> None:
            for i in range(4):
                encode_or_drop(enc, {"k": t}, i)

        run_threads(work, 8)
        s = enc.stats
        if (s.rows, s.dropped["too_long"], s.failed["parse"]) != (32, 16, 16):
            wrong.append((trial, s.rows, dict(s.dropped), dict(s.failed)))
    assert wrong == []


def _row(k: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{k}"}]},
                         {"role": "assistant", "content": f"answer {k}"}],
            "images": [tiny_image(56 + 28 * (k % 3), 84, seed=k)]}


def test_shared_encoder_rows_equal_single_thread_rows():
    """Guard: a fresh Encoder (its lazily probed template rules raced by the first calls) used by
    8 threads gives each row exactly as one thread does (ids, labels, positions, pixels, grids),
    and counts each call."""
    proc = processor_for("qwen2_vl")
    rows = [_row(k) for k in range(6)]
    ref = [mmpipe.Encoder(proc).encode_row(r).to_dict() for r in rows]
    enc = mmpipe.Encoder(proc)
    got, errors = {}, []

    def work(t: int) -> None:
        try:
            for i in range(6):
                k = (t + i) % len(rows)
                got.setdefault(k, []).append(enc(rows[k]))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    run_threads(work, 8)
    assert errors == []
    for k, outs in got.items():
        for out in outs:
            assert out.keys() == ref[k].keys()
            for name, want in ref[k].items():
                assert np.array_equal(np.asarray(out[name]), np.asarray(want)), (k, name)
    assert (enc.stats.rows, enc.stats.encoded) == (48, 48)
