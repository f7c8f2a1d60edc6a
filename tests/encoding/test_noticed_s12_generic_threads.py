"""Guard: two generic-path encoders and two Collators (left and right padding) on ONE processor
(LLaVA, no family row) from four threads give the rows and batches each gives alone. mmpipe's
generic path never sets the tokenizer's padding or truncation (the probe's padded call passes
them per call), so there is no shared state to race; measured 3 x 200 rows on LLaVA and Idefics3.
(A caller's own ``tokenizer(..., truncation=True, max_length=2)`` on the same tokenizer at the same
time does break rows: transformers sets the fast tokenizer's truncation for the length of a call.)"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.offline.other_vlms import build_foreign_processor

N = 48


def _same(a, b) -> bool:
    if hasattr(a, "__dataclass_fields__"):
        a, b = vars(a), vars(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def rows():
    photo = testing.sample_photos()[0][1].resize((40, 30))
    return [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q" * (1 + i % 7)}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "answer " * (1 + i % 5)}]}],
             "images": [photo]} for i in range(N)]


def test_generic_encoders_and_collators_on_one_processor_from_threads(rows):
    p = build_foreign_processor("llava")
    alone = [mmpipe.Encoder(p).encode_row(r).to_dict() for r in rows]

    def batches(side):
        collate = mmpipe.Collator(p, padding_side=side)
        return [collate(alone[i:i + 4]) for i in range(0, N, 4)]

    want = {side: batches(side) for side in ("left", "right")}
    got, failed = {}, []

    def encode(key):
        try:
            enc = mmpipe.Encoder(p)
            got[key] = [enc.encode_row(r).to_dict() for r in rows]
        except Exception as e:  # noqa: BLE001 - reported below
            failed.append(repr(e))

    def collate(side):
        try:
            got[side] = batches(side)
        except Exception as e:  # noqa: BLE001 - reported below
            failed.append(repr(e))

    threads = [threading.Thread(target=encode, args=(k,), daemon=True) for k in ("a", "b")]
    threads += [threading.Thread(target=collate, args=(s,), daemon=True) for s in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and not failed, failed
    assert all(_same(x, y) for k in ("a", "b") for x, y in zip(got[k], alone, strict=True))
    assert all(_same(x, y) for s in ("left", "right") for x, y in zip(got[s], want[s], strict=True))
