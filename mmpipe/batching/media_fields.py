"""The per-item layout of a batch, written once for every kind of family: a kind declares its
media items as data (``fam.media.MEDIA_ITEMS``: a `MediaItems` for images, one for videos);
collate concatenates their layout fields over the rows with the offsets that slice them back out
(`collate_layout`), unbatch cuts each row's own back out (`cut_layout`)."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from mmpipe.records.codec import pixel_rows
from mmpipe.records.columns import offsets, to_numpy


class MediaItems(NamedTuple):
    """One kind of media item (images, videos). ``offsets``: the batch field int64 [B+1] of each
    row's items; ``fields``: its layout fields ``(name, dtype, width)``, [I, width] (width None:
    [I]) in the batch, the first counting a row's items (a row without it, None: none, and the
    batch's field is None); ``units``: the batch field int64 [B+1] of each row's pixel units
    (patches, tiles), an item's units the product of its row of ``unit_field``; ``pixels``: the
    per-unit batch fields `cut_layout` cuts by ``units``. What unbatch checks
    (`mmpipe.batching.media_checks`): ``rows``, the per-unit pixel fields as ``(name, the family's
    width attribute or None)``; ``code``, the items' ``mm_token_type_ids`` code, and ``tokens``, the
    family's rule (a method name) giving each item's token count from its first layout field."""

    offsets: str
    fields: tuple
    units: Optional[str] = None
    unit_field: Optional[str] = None
    pixels: tuple = ()
    rows: tuple = ()
    code: Optional[int] = None
    tokens: Optional[str] = None

    @property
    def modality(self) -> str:
        """What the items are, from their offsets field: ``"image"`` (``image_offsets``), ``"video"``."""
        return self.offsets.removesuffix("_offsets")


def collate_layout(rows: Sequence, items: Sequence[MediaItems]) -> dict:
    """Records -> each layout field in row order (numpy of its dtype) and the offsets int64
    [B+1] of the items and of their pixel units."""
    out: dict = {}
    for it in items:
        out[it.offsets] = offsets([0 if (v := getattr(r, it.fields[0][0])) is None else len(v) for r in rows])
        for name, dtype, width in it.fields:
            values = [getattr(r, name) for r in rows]
            out[name] = None if any(v is None for v in values) else \
                np.concatenate(values).astype(dtype).reshape((-1,) if width is None else (-1, width))
        if it.units is not None:
            out[it.units] = offsets([pixel_rows(getattr(r, it.unit_field)) for r in rows])
    return out


def cut_layout(batch, items: Sequence[MediaItems]) -> list[dict]:
    """A batch -> each row's own layout and ``pixels`` fields (numpy copies; None where the
    batch's field is None), cut out by the batch's offsets."""
    rows: list[dict] = [{} for _ in range(batch.batch_size)]
    for it in items:
        for by, names in ((it.offsets, [f[0] for f in it.fields]), (it.units, it.pixels)):
            off = to_numpy(getattr(batch, by)).tolist() if names else ()  # python ints: faster slicing
            for name in names:
                arr = None if getattr(batch, name) is None else to_numpy(getattr(batch, name))
                for b, row in enumerate(rows):
                    row[name] = None if arr is None else arr[off[b]:off[b + 1]].copy()
    return rows
