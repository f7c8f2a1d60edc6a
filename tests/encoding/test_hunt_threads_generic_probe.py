"""Thread concurrency (hunt): a fresh generic-path Encoder (a processor mmpipe has no table row for)
shared by threads. Its layout is found by probe calls on first use, two of them with padding=True,
which sets the tokenizer's padding; every thread's first call probed at once, and a plain call reset
the padding while another thread's padded probe call ran: its batch came back ragged (IndexError:
tuple index out of range, from the probe) - the first rows of a threaded server failed. Threads
now wait for one probe. Counted, not timed: a barrier, the switch interval shortened."""

from __future__ import annotations


import numpy as np

import mmpipe
from mmpipe.testing import tiny_image

from conftest import processor_for
from helpers import run_threads


def _row(k: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q" * (k + 1)}]},
                         {"role": "assistant", "content": "a" * (k + 1)}],
            "images": [tiny_image(64, 64, seed=k)]}


def _same(a: dict, b: dict) -> bool:
    def arr(v):
        return np.asarray(v, dtype=object) if isinstance(v, (list, str)) or v is None else np.asarray(v)
    return a.keys() == b.keys() and all(np.array_equal(arr(a[k]), arr(b[k])) for k in a)


def test_first_calls_of_a_shared_generic_encoder():
    """Old code: 19 failed calls in 60 rounds of 8 threads (idefics3)."""
    proc = processor_for("idefics3")
    rows = [_row(k) for k in range(8)]
    ref = [mmpipe.Encoder(proc).encode_row(r).to_dict() for r in rows]
    wrong = []
    for trial in range(80):
        enc = mmpipe.Encoder(proc)

        def work(t: int) -> None:
            try:
                if not _same(enc.encode_row(rows[t]).to_dict(), ref[t]):
                    wrong.append((trial, t, "another row"))
            except Exception as e:  # noqa: BLE001 - what the race raised
                wrong.append((trial, t, f"{type(e).__name__}: {e}"))

        run_threads(work, 8)
    assert wrong == []
