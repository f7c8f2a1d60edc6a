"""Pixel arrays that grow turn by turn without copying the earlier turns (multi-turn appends).

A VRAG-style loop appends an image (or a few) per turn. Concatenating the row's pixels with the
new turn's (``np.concatenate([old, new])``) copies every earlier turn's pixels again on every
append: N turns copy O(N^2) pixel bytes (40 turns of 300x400 images: ~14 MB of uint8 patches
copied ~20 times over; float32 ``pixel_values`` 8x that). `grow` writes the new rows into spare
room after the old ones instead, amortised O(new bytes) an append:

- the rows live at the start of a `_Store` (an ndarray with room for 1.5x the rows at its last
  growth) and the row's field is a plain ndarray view of its first ``used`` rows;
- an append to the NEWEST view of a store writes after its rows and hands out a longer view of
  the same store (the earlier view still sees exactly its own rows: nothing it holds is written);
- an append to an older view (a branch: two observations tried on one conversation), to an
  array that is not such a view (a fresh row, an unpickled one), or with another dtype or
  trailing shape copies into a new store, as concatenation did.

The values are those of ``np.concatenate([old, *blocks])`` (dtype, shape, bytes); the views
are C-contiguous and writable. Successive conversations of one loop share the store's memory
for their common rows (they are immutable records of the same turns). `compact` gives a done
conversation's field its own exact-size array (no spare room kept alive).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe._fork import ForkSafeLock

_CLAIM = ForkSafeLock()  # check-and-claim of a store's spare room (two threads appending to one row)


class _Store(np.ndarray):
    """The memory behind a growing field: ``used`` rows in use (by the newest view), the rest spare."""

    used: int


def _store_of(arr: Optional[np.ndarray]) -> Optional[_Store]:
    """The store ``arr`` is the prefix view of (handed out by `grow`), else None."""
    store = getattr(arr, "base", None)
    if not isinstance(store, _Store) or type(arr) is not np.ndarray:
        return None
    if arr.dtype != store.dtype or arr.shape[1:] != store.shape[1:] or arr.ctypes.data != store.ctypes.data:
        return None
    return store


def _view(store: _Store, n: int) -> np.ndarray:
    """A plain ndarray over the store's first ``n`` rows (its ``base`` is the store)."""
    return np.ndarray((n, *store.shape[1:]), store.dtype, buffer=store)


def grow(old: Optional[np.ndarray], blocks: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate([old, *blocks])`` (``old`` None: the blocks only), along dim 0, copying
    only ``blocks`` when ``old`` is the newest view of a store with room for them.

    old: [N, ...] or None; blocks: arrays [n_i, ...] of the same trailing shape. Returns
    [N + sum n_i, ...]."""
    parts = ([] if old is None else [np.asarray(old)]) + [np.asarray(b) for b in blocks]
    if not parts:
        return np.concatenate(parts)  # numpy's own error
    n_old = 0 if old is None else len(parts[0])
    n = sum(len(p) for p in parts)
    store = _store_of(old)
    if store is not None and n <= len(store) and all(
            b.dtype == store.dtype and b.shape[1:] == store.shape[1:] for b in parts[1:]):
        with _CLAIM:
            mine = store.used == n_old  # old is the newest view: the room after it is free
            if mine:
                store.used = n
        if mine:
            at = n_old
            for b in parts[1:]:
                store[at:at + len(b)] = b
                at += len(b)
            return _view(store, n)
    dtype = np.result_type(*parts)
    if any(p.ndim == 0 or p.shape[1:] != parts[0].shape[1:] for p in parts) or dtype.hasobject:
        return np.concatenate(parts)  # numpy's result (or its error), no store
    store = _Store((max(n + n // 2, 1), *parts[0].shape[1:]), dtype)
    at = 0
    for p in parts:
        store[at:at + len(p)] = p
        at += len(p)
    store.used = n
    return _view(store, n)


def compact(arr: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """``arr`` as its own exact-size array when it is a view of a store (whose spare room it
    would keep alive), else ``arr`` itself."""
    if _store_of(arr) is None:
        return arr
    return np.array(arr, copy=True)
