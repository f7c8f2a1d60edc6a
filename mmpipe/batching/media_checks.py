"""Unbatch's checks of a batch's media items, written once for every kind of family and driven by
what the kind declares (``fam.media.MEDIA_ITEMS``, `mmpipe.batching.media_fields.MediaItems`):
each item kind's offsets start at 0, never decrease and cover its layout rows; its other layout
fields hold one value per item; its unit offsets (patches, tiles) equal the units its layout
calls for; its per-unit pixel fields hold those units (of the family's declared width); and,
where the kind declares a token code and rule, each row's media tokens equal its items' tokens.

A failure raises `PixelDataError` at stage "validate" naming the batch row and the field (a batch
edited by hand, or assembled by another tool, would otherwise give rows that disagree with
themselves).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.batching.media_fields import MediaItems
from mmpipe.errors import PixelDataError
from mmpipe.records.columns import to_numpy

FIX = "build the batch with mmpipe.collate(rows) and do not edit its fields in place"


def _array(batch, name):
    value = getattr(batch, name)
    return None if value is None else to_numpy(value)


def check_media_items(batch, items: Sequence[MediaItems]) -> None:
    """Every item kind of ``items`` against the batch (module doc): first that each layout field
    holds one value per item (the others are read by item); the first kind's token check
    also catches unknown token types while it is the batch's only media (``typed``: whether a
    later kind holds items, the token types then tell the kinds apart)."""
    mm = to_numpy(batch.mm_token_type_ids)
    layouts = [_array(batch, it.fields[0][0]) for it in items]
    typed = any(x is not None and len(x) for x in layouts[1:])
    for it, layout in zip(items, layouts):  # the other layout fields: one value per item
        for name, _, _ in it.fields[1:]:
            values = _array(batch, name)
            if layout is not None and values is not None and len(values) != len(layout):
                raise PixelDataError(where="", column=name, stage="validate", found=len(values), fix=FIX,
                                     expected=f"{len(layout)} values (one per {it.modality})")
    for k, (it, layout) in enumerate(zip(items, layouts)):
        if layout is not None:
            _check_items(batch, it, layout, mm, typed, first=k == 0)


def _pixels(batch, it: MediaItems) -> list:
    """(name, array or None, width or None) of each per-unit pixel field the item declares."""
    fam = batch.fam
    return [(name, _array(batch, name), None if width is None else getattr(fam, width)) for name, width in it.rows]


def _check_items(batch, it: MediaItems, layout: np.ndarray, mm: np.ndarray, typed: bool, first: bool) -> None:
    """Offsets, unit offsets, pixel rows and per-row media tokens of one item kind."""
    B, kind, oname, uname = batch.batch_size, it.modality, it.offsets, it.units
    off = to_numpy(getattr(batch, oname))
    uoff = to_numpy(getattr(batch, uname)) if uname is not None else np.zeros(B + 1, np.int64)
    pixels = _pixels(batch, it)
    if not len(layout) and off.shape == uoff.shape == (B + 1,) and not off.any() and not uoff.any():
        # no items: no token of this kind (the first kind alone: no media token at all)
        bad = ((mm == it.code) if typed else (mm != 0)) if first and it.code is not None else None
        if bad is not None and bad.any():
            b = int(np.flatnonzero(bad.any(1))[0])
            raise PixelDataError(f"media tokens in mm_token_type_ids but the batch holds no {kind}", row=b,
                                 column=it.fields[0][0], stage="validate", expected=f"no media tokens (no {kind})",
                                 found=f"{int(np.count_nonzero(bad[b]))} media token(s) in row {b}", fix=FIX)
        for name, arr, _ in pixels:
            if arr is not None and len(arr):
                raise PixelDataError(where="", column=name, stage="validate", expected=f"no rows (no {kind})",
                                     found=tuple(arr.shape), fix=FIX)
        return
    for name, o in ((oname, off), (uname, uoff)):
        if name is not None and (o.shape != (B + 1,) or o[0] != 0 or (o[1:] < o[:-1]).any()):
            b = int(np.flatnonzero(o[1:] < o[:-1])[0]) if o.shape == (B + 1,) and o[0] == 0 else None
            raise PixelDataError(row=b, where=None if b is not None else "", column=name, stage="validate",
                                 expected=f"shape ({B + 1},), starting at 0, non-decreasing",
                                 found=o.tolist()[:8], fix=FIX)
    lname = it.fields[0][0]
    if off[-1] != len(layout):
        raise PixelDataError(row=B - 1, column=oname, stage="validate",
                             expected=f"{oname}[-1] = {len(layout)} ({lname} rows)", found=int(off[-1]), fix=FIX)
    if uname is not None:
        _check_units(batch, it, layout, off, uoff, pixels)
    if it.code is not None and it.tokens is not None:
        _check_tokens(batch, it, layout, off, mm, typed)


def _check_units(batch, it: MediaItems, layout, off, uoff, pixels: list) -> None:
    """The unit offsets equal the units the layout calls for (a grid's t*h*w, a tile count), and
    each per-unit pixel field holds them."""
    lname, uname = it.unit_field, it.units
    grid = to_numpy(getattr(batch, lname))
    units = np.zeros(len(grid) + 1, np.int64)
    np.cumsum(grid.prod(-1) if grid.ndim == 2 else grid, out=units[1:])
    if (uoff != units[off]).any():
        b = max(int(np.flatnonzero(uoff != units[off])[0]) - 1, 0)
        raise PixelDataError(f"{uname} {int(uoff[b])}:{int(uoff[b + 1])} disagree with the row's {lname} "
                             f"({int(units[off[b + 1]] - units[off[b]])} {_UNIT.get(grid.ndim, 'units')})",
                             row=b, column=uname, stage="validate",
                             expected=f"{int(units[off[b + 1]] - units[off[b]])} {_UNIT.get(grid.ndim, 'units')}",
                             found=f"{int(uoff[b + 1] - uoff[b])} {_UNIT.get(grid.ndim, 'units')}", fix=FIX)
    for name, arr, width in pixels:  # [units, width], or [units, ...] without a declared width
        want = (int(units[-1]),) if width is None else (int(units[-1]), width)
        if arr is not None and (tuple(arr.shape) if width is not None else tuple(arr.shape[:1])) != want:
            raise PixelDataError(row=None, where="", column=name, stage="validate",
                                 expected=f"shape {want if width is not None else (*want, '...')} from {lname}",
                                 found=tuple(arr.shape), fix=FIX)


_UNIT = {2: "patches", 1: "tiles"}  # what a grid's (a tile count's) units are, in messages


def _check_tokens(batch, it: MediaItems, layout, off, mm, typed: bool) -> None:
    """Each row's tokens of the item's code equal its items' tokens (the family's rule)."""
    kind, code = it.modality, it.code
    tokens = np.zeros(len(layout) + 1, np.int64)
    np.cumsum(getattr(batch.fam, it.tokens)(layout), out=tokens[1:])
    have = np.count_nonzero(mm == code, axis=1) if typed else mm.sum(1)  # one kind only: 0/1 types, a sum counts
    want = tokens[off[1:]] - tokens[off[:-1]]
    if (have != want).any():
        b = int(np.flatnonzero(have != want)[0])
        raise PixelDataError(f"{int(have[b])} {kind} tokens (type {code}) in mm_token_type_ids but its "
                             f"{it.fields[0][0]} need {int(want[b])}", row=b, column=it.fields[0][0],
                             stage="validate", expected=f"{int(want[b])} {kind} tokens",
                             found=f"{int(have[b])} {kind} tokens", fix=FIX)
