"""The pixel buffer pool (issue 34, a steady collate): memory a live array, a numpy view of it or a
tensor made from it still uses is never handed out again; free memory is."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.images import buffers
from mmpipe.images.buffers import BufferPool
from mmpipe.images.pixels import u8_to_pixel_values

MIB = 1 << 20


def _pool() -> BufferPool:
    return BufferPool(max_buffers=2, min_bytes=1 * MIB)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_free_buffer_is_reused_and_its_owner_is_the_views_base():
    pool = _pool()
    a = pool.empty((4, MIB // 2), np.float32)  # 8 MiB
    owner = a.base
    assert owner is not None and owner.base is None and owner.flags.owndata  # the view's base is the owner itself
    where = _addr(a)
    del a, owner
    b = pool.empty((4, MIB // 2), np.float32)
    assert _addr(b) == where  # reused: memory already mapped


@pytest.mark.parametrize("keep", ["array", "slice", "view_of_view", "reshape", "tensor", "tensor_slice", "memoryview"])
def test_memory_in_use_is_never_handed_out(keep):
    pool = _pool()
    a = pool.empty((8, MIB // 4), np.float32)
    a[:] = 7.0
    held = {"array": lambda: a, "slice": lambda: a[3:5], "view_of_view": lambda: a[1:][::2].view(np.uint32),
            "reshape": lambda: a.reshape(-1)[10:20], "tensor": lambda: torch.from_numpy(a),
            "tensor_slice": lambda: torch.as_tensor(a[2:4])[0], "memoryview": lambda: memoryview(a[4:6])}[keep]()
    del a
    gc.collect()
    b = pool.empty((8, MIB // 4), np.float32)
    c = pool.empty((8, MIB // 4), np.float32)
    b[:] = 1.0
    c[:] = 2.0
    kept = np.asarray(held)
    assert not np.shares_memory(kept, b) and not np.shares_memory(kept, c)
    assert (kept.view(np.float32) == 7.0).all() if kept.dtype != np.uint32 else (kept == np.float32(7).view(np.uint32)).all()


def test_the_owner_refcount_not_a_weakref_decides():
    """A numpy view keeps the owner alive, not the intermediate view: the pool reads the owner's count."""
    pool = _pool()
    a = pool.empty((2, MIB), np.float32)
    owner = a.base
    base_count = sys.getrefcount(owner)
    v = a[1:]  # a view of the view: its base is the owner too
    same_base, count = v.base is owner, sys.getrefcount(owner)
    assert same_base and count == base_count + 1
    del a, owner
    b = pool.empty((2, MIB), np.float32)
    assert not np.shares_memory(b, v)


def test_pool_bounds_and_off_switch(monkeypatch):
    pool = _pool()
    small = pool.empty((10,), np.float32)  # under min_bytes: plain numpy
    assert small.base is None
    live = [pool.empty((MIB,), np.float32) for _ in range(3)]  # 4 MiB each; the third is not kept
    assert pool.held_bytes() <= 2 * 6 * MIB
    assert len({_addr(x) for x in live}) == 3
    assert pool.empty((4 * MIB,), np.float32).base.size < 4 * 4 * MIB * 2  # no buffer serves a request 2x smaller
    monkeypatch.setenv("MMPIPE_BUFFER_POOL", "0")
    assert pool.empty((MIB,), np.float32).base is None


def test_threads_never_share_a_buffer():
    pool = BufferPool(max_buffers=4, min_bytes=1 * MIB)
    out, errors = [], []

    def take(k):
        try:
            for _ in range(20):
                a = pool.empty((MIB // 2,), np.float32)
                a[:] = k
                out.append(a)  # all kept alive: no two may overlap
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=take, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    addrs = [_addr(a) for a in out]
    assert len(set(addrs)) == len(addrs)


def test_expansion_equal_with_and_without_pool(monkeypatch):
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, size=(8192, 3 * 14 * 14), dtype=np.uint8)  # 2 x 18 MiB of float32 output
    lut = rng.standard_normal((3, 256)).astype(np.float32)
    monkeypatch.setattr(buffers, "PIXEL_BUFFERS", BufferPool(min_bytes=1 * MIB))
    a = u8_to_pixel_values(u8, lut, 2)
    b = u8_to_pixel_values(u8, lut, 2)  # a is alive: another buffer
    assert not np.shares_memory(a, b)
    monkeypatch.setenv("MMPIPE_BUFFER_POOL", "0")
    np.testing.assert_array_equal(a, u8_to_pixel_values(u8, lut, 2))
    np.testing.assert_array_equal(a, b)


def test_collated_batches_alive_together_keep_their_pixels(monkeypatch):
    """Two batches of one Collator alive at once (DataLoader prefetch in the main process): the
    second never writes into the first's pixels; once the first is gone its buffer is reused."""
    monkeypatch.setattr(buffers, "PIXEL_BUFFERS", BufferPool(min_bytes=64 << 10))
    proc = testing.build_processor("qwen2_vl")
    photos = [p for _, p in testing.sample_photos()][:3]
    rows = [mmpipe.encode({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
                                        {"role": "assistant", "content": "ok"}], "images": [photo]}, processor=proc)
            for photo in photos]
    col = mmpipe.Collator(proc)
    first = col(rows[:2])
    keep = first.pixel_values.clone()
    row_view = first.pixel_values[3:7]  # a tensor cut from the batch outlives it
    keep_view = row_view.clone()
    del first
    second = col(rows[1:])
    assert not np.shares_memory(second.pixel_values.numpy(), row_view.numpy())
    assert torch.equal(row_view, keep_view)
    del row_view
    third = col(rows[:2])
    assert torch.equal(third.pixel_values, keep)
