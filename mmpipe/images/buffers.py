"""Reused output buffers for the large float32 pixel expansions (issue 34, a steady collate).

A collate's float32 ``pixel_values`` is its largest write (hundreds of MiB for a batch of
real-size photos). Fresh memory of that size comes from the kernel page by page, zeroed on
first touch: writing 244 MiB into fresh memory took 17 ms here against 9 ms into memory already
mapped (bench/README.md). `BufferPool` keeps the few most recent large buffers and hands one
out again once nothing uses it any more.

Safety rule: a buffer is handed out only while the pool holds the ONLY reference to its owner
array. Every numpy view of it (a slice, a reshape, a view of a view) references the owner
(numpy sets a view's ``base`` to the array that owns the memory), and ``torch.from_numpy`` /
``torch.as_tensor`` keep the numpy array they wrap alive, so while a batch, a row cut from it
or a tensor made from it lives, the owner's reference count is above the pool's own and the
buffer stays taken. (Memory reached by a raw pointer alone, e.g. ``arr.ctypes.data`` kept as
an int, is not tracked: mmpipe hands no such pointer out.)

Bounds: only requests of at least `MIN_BYTES` use the pool (smaller ones are malloc's); at most
`max_buffers` buffers are kept (free or taken), each at most 2x the request it serves. A taken
buffer the pool cannot keep is a plain allocation. ``MMPIPE_BUFFER_POOL=0`` turns the pool off.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

__all__ = ["BufferPool", "PIXEL_BUFFERS", "MIN_BYTES"]

MIN_BYTES = 32 << 20  # glibc serves smaller blocks from its heap (kept mapped) once freed
_ALIGN = 2 << 20  # capacities in whole huge pages
_HEADROOM = 1.25  # a new buffer fits a batch up to 25% larger


class BufferPool:
    """Large uninitialised arrays, reused once no one references them (module doc)."""

    def __init__(self, max_buffers: int = 2, min_bytes: int = MIN_BYTES):
        self.max_buffers = int(max_buffers)
        self.min_bytes = int(min_bytes)
        self._owners: list[np.ndarray] = []  # uint8 [capacity], each owning its memory
        self._lock = threading.Lock()

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised array like ``np.empty(shape, dtype)``, from a free pooled buffer when
        one fits (its memory already mapped), else freshly allocated (and kept when there is
        room)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not self.enabled() or nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        with self._lock:
            owner = self._free(nbytes)
            if owner is None:
                owner = self._new(nbytes)
        return owner[:nbytes].view(dtype).reshape(shape)

    def enabled(self) -> bool:
        return self.max_buffers > 0 and os.environ.get("MMPIPE_BUFFER_POOL", "1") != "0"

    def clear(self) -> None:
        """Forget every buffer (those in use stay valid: their users keep them alive)."""
        with self._lock:
            self._owners = []

    def _free(self, nbytes: int):
        """The smallest free buffer of ``nbytes`` .. 2 * ``nbytes`` (None if none)."""
        best = None
        for owner in self._owners:
            # references: the list's, this loop variable's, getrefcount's argument
            if sys.getrefcount(owner) == 3 and nbytes <= owner.size <= 2 * nbytes:
                if best is None or owner.size < best.size:
                    best = owner
        return best

    def _new(self, nbytes: int) -> np.ndarray:
        cap = -(-int(nbytes * _HEADROOM) // _ALIGN) * _ALIGN
        owner = np.empty(cap, np.uint8)
        if len(self._owners) >= self.max_buffers:
            # drop a free buffer to make room (the smallest); none free: this one is not kept
            free = [o for o in self._owners if sys.getrefcount(o) == 3]  # list, loop variable, argument
            if not free:
                return owner
            drop = min(free, key=lambda o: o.size)
            self._owners = [o for o in self._owners if o is not drop]
            del free, drop
        self._owners.append(owner)
        return owner

    def held_bytes(self) -> int:
        """Bytes the pool keeps (free and taken buffers)."""
        with self._lock:
            return sum(o.size for o in self._owners)


PIXEL_BUFFERS = BufferPool()


def _forget() -> None:  # a forked child starts with its own (empty) pool: the parent's buffers are the parent's
    global PIXEL_BUFFERS
    PIXEL_BUFFERS = BufferPool(PIXEL_BUFFERS.max_buffers, PIXEL_BUFFERS.min_bytes)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
