"""Padding and cutting of processor-defined outputs, written once for whatever declares them: a
record's ``vision`` arrays, typed by its `mmpipe.records.processor_layout.ProcessorLayout` (which
keys are per row, which the processor's batch call joins, its fill of a missing item), padded
into the batch's arrays as the processor's own batch call pads them, and cut back out.

- a row key (axis 0 = the row, ``[1, n, ...]``, e.g. Idefics3's ``pixel_values`` [1, tiles, 3,
  H, W]) becomes [B, max n, ...], zero-padded (or with the processor's own fill of a missing
  item, ``ProcessorLayout.pads``); a row without it is all padding;
- a token-aligned row key (``[1, L, ...]``, Mllama's ``cross_attention_mask`` [1, L, images,
  tiles]) is padded on its token axis at the padding side, as the tokens are (`token_aligned`);
- a joined key (``ProcessorLayout.joins``: ``[1, ...]`` per row, the batch ONE such array, e.g.
  MiniCPM-V's ``pixel_values`` [1, 3, 14, patches x 14]) is the rows' arrays joined along that
  axis, as the processor's batch call joins them (`join_vision`);
- any other key (axis 0 = images, e.g. LLaVA's ``pixel_values`` [I, 3, H, W]) is concatenated
  over the rows, its trailing axes zero-padded to the largest.

The processor kind (`mmpipe.media.processor_collate`) decides what its rows hold and checks them;
this module only pads and cuts what the layout declares.
"""

from __future__ import annotations

import numpy as np

from mmpipe.errors import InputError

__all__ = ["token_aligned", "collate_vision", "join_vision", "cut_vision"]


def _padded(arr: np.ndarray, shape: tuple) -> np.ndarray:
    """``arr`` zero-padded at the end of every axis to ``shape``."""
    if arr.shape == tuple(shape):
        return arr
    out = np.zeros(shape, arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def token_aligned(rows: list, key: str) -> bool:
    """Whether row key ``key`` is ``[1, L, ...]`` in every row holding it, L the row's tokens
    (Mllama's ``cross_attention_mask`` ``[1, L, images, tiles]``): its axis 1 is padded as the tokens."""
    present = [(r.vision[key], len(r)) for r in rows if key in r.vision]
    return bool(present) and all(a.ndim >= 2 and a.shape[1] == n for a, n in present)


def collate_vision(rows: list, key: str, row_key: bool, L: int = 0,
                   padding_side: str = "right") -> tuple[np.ndarray, list]:
    """Vision output ``key`` of every row -> (the batch's array, each row's own shape or None
    where the row lacks it); ``row_key``: axis 0 is the row; ``L``: the padded length."""
    present = [r.vision[key] for r in rows if key in r.vision]
    trailing = tuple(np.max([a.shape[1:] for a in present], axis=0))
    shapes = [r.vision[key].shape if key in r.vision else None for r in rows]
    if row_key and token_aligned(rows, key):  # axis 1 on the tokens' side and length
        out = np.zeros((len(rows), L, *trailing[1:]), present[0].dtype)
        for b, r in enumerate(rows):
            if key in r.vision:
                a, n = r.vision[key], len(r)
                start = 0 if padding_side == "right" else L - n
                out[b:b + 1, start:start + n][tuple(slice(0, k) for k in (1, n, *a.shape[2:]))] = a
        return out, shapes
    if row_key:  # [1, n, ...] per row; a row without it is all padding, as the processor pads
        empty = np.zeros((1, *trailing), present[0].dtype)
        blocks = [_padded(r.vision[key], (1, *trailing)) if key in r.vision else empty for r in rows]
        fill = dict(rows[0].layout.pads if rows[0].layout is not None else ()).get(key)
        if fill is not None and len(trailing) >= 2 and len(fill) == int(np.prod(trailing[1:])):
            for b, r in enumerate(rows):  # missing items (axis 1) as the processor pads them
                start = r.vision[key].shape[1] if key in r.vision else 0
                if start < trailing[0]:
                    blocks[b] = blocks[b].copy()
                    blocks[b][0, start:] = np.reshape(fill, trailing[1:])
    else:
        blocks = [_padded(a, (a.shape[0], *trailing)) for a in present]
        fill = dict(rows[0].layout.pads if rows[0].layout is not None else ()).get(key)
        if fill is not None and len(fill) == 1 and len(trailing) >= 2:  # missing items as the processor fills them
            for a, b in zip(present, blocks):
                if a.shape[1] < trailing[0]:  # b: a new, padded array
                    b[:, a.shape[1]:] = fill[0]
    return np.concatenate(blocks), shapes


def join_vision(rows: list, key: str, axis: int) -> tuple[np.ndarray, list]:
    """Joined output ``key`` (`ProcessorLayout.joins`) of every row -> (the rows' arrays joined
    along ``axis``, as the processor's batch call joins them; each row's own shape or None). Rows
    whose other axes differ cannot be joined: `InputError`."""
    present = [(i, r.vision[key]) for i, r in enumerate(rows) if key in r.vision]
    first = present[0][1]
    for i, a in present:
        if a.shape[:axis] + a.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]:
            raise InputError(f"{key} is joined along axis {axis} by the processor, but its other axes differ "
                             "between rows", row=i, column=key, stage="collate",
                             expected=f"shape {first.shape} apart from axis {axis}", found=f"shape {a.shape}",
                             fix="batch rows encoded with the same image-processor settings")
    shapes = [r.vision[key].shape if key in r.vision else None for r in rows]
    return np.concatenate([a for _, a in present], axis=axis), shapes


def cut_vision(vision: dict, shapes: dict, row_keys: set, b: int, n: int, cols: slice, starts: dict,
               joins: dict = None) -> dict:
    """Row ``b``'s own vision outputs cut out of the batch's arrays ``vision`` (numpy), to its
    ``shapes``; ``n``: its tokens at ``cols`` of the padded length; ``starts``: per key not a row
    key, the row's first item (advanced here past its items); ``joins``: key -> the axis its
    rows are joined along (there the row starts at ``starts[key]``)."""
    out, joins = {}, joins or {}
    for key, arr in vision.items():
        shape = shapes[key][b]
        if shape is None:
            continue
        cut = [slice(0, s) for s in shape]
        if key in joins:
            ax = joins[key]
            cut[ax] = slice(starts[key], starts[key] + shape[ax])
            out[key] = arr[tuple(cut)].copy()
            starts[key] += shape[ax]
            continue
        start = b if key in row_keys else starts[key]
        if key in row_keys and len(shape) >= 2 and shape[1] == n:  # token-aligned (see token_aligned)
            cut[1] = cols
        out[key] = arr[start:start + shape[0]][tuple(cut)].copy()
        starts[key] += 0 if key in row_keys else shape[0]
    return out
