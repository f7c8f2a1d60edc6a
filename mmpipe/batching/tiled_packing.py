"""Packing for the tiled families (`mmpipe.families.TiledFamily`): `TiledInputs` rows -> one
padding-free `TiledPackedInputs` sequence, and back. `mmpipe.pack`, `mmpipe.unpack`,
`mmpipe.batching.packing.to_padded` and `mmpipe.PackingCollator` come here by themselves for
tiled rows or a tiled family's processor.

What a pack holds (T = sum of the row lengths), as the Qwen pack (`mmpipe.batching.packing`):

- the rows' tokens end to end, ``input_ids`` / ``mm_token_type_ids`` int64 ``[1, T]``;
- ``position_ids`` int64 ``[1, T]``: ``0..L_k-1`` for each row k. With no attention mask,
  transformers finds the rows where the position does not advance by one and builds a
  block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``);
- ``labels`` with -100 on each row's first token (its own label kept in ``first_labels``);
- the pixels of the padded batch of the same rows (`mmpipe.batching.tiled.collate_tiled`): every
  row's tiles in row order (InternVL float32 [N, 3, S, S]; LLaVA-OneVision its per-image layout
  float32 [I, max tiles, 3, S, S] + ``image_sizes`` int64 [I, 2]).

Checked on the tiny offline InternVL and LLaVA-OneVision models (fp32, eager and sdpa): packed logits
equal each row's logits alone with 0..3 images per row. A family whose ``no_packing`` names a
reason (Gemma 3) is refused with it::

    >>> packed = mmpipe.pack(rows, processor=processor, max_tokens=8192)   # doctest: +SKIP
    >>> out = model(**packed.model_inputs())                               # doctest: +SKIP
    >>> mmpipe.unpack(packed)   # the rows, exactly                         # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.generic import pad_id
from mmpipe.batching.tiled import collate_tiled, processor_table, tiled_records, unbatch_tiled
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.families import TiledFamily, tiled_family_of
from mmpipe.images.tiles import effective_image_processor
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.tiled import TiledBatch, TiledInputs
from mmpipe.records.tiled_packed import TiledPackedInputs

__all__ = ["pack_tiled", "unpack_tiled", "tiled_to_padded", "TiledPackingCollator", "check_packing_allowed",
           "tiled_pack", "tiled_packing_collator"]


def check_packing_allowed(who: str, family: TiledFamily) -> None:
    """Raise `ArgumentError` with the family's ``no_packing`` reason when its model's attention
    does not allow packed rows."""
    if family.no_packing is not None:
        raise ArgumentError(f"{who}: packing is not available for {family.name}: {family.no_packing}; use "
                            f"mmpipe.Collator(processor) for padded batches")


def _check_budgets(b: TiledBatch, max_tokens: Optional[int], max_images: Optional[int]) -> None:
    n, total = len(b.lengths), int(b.lengths.sum())
    if max_tokens is not None and total > max_tokens:
        raise InputError(
            f"the {n} rows hold {total} tokens (lengths {b.lengths.tolist()}), over the pack budget "
            f"max_tokens={max_tokens}", where="", column="input_ids", stage="collate",
            fix=f"build batches with TokenBudgetBatchSampler(cost='packed', max_tokens={max_tokens}) or raise max_tokens")
    n_img = int(b.images_per_row.sum())
    if max_images is not None and n_img > max_images:
        raise InputError(
            f"the {n} rows hold {n_img} images (per row {b.images_per_row.tolist()}), over the pack budget "
            f"max_images={max_images}", where="", column="tiles_per_image", stage="collate",
            fix=f"build batches with TokenBudgetBatchSampler(max_images={max_images})")


def _check_unpadded(rows: Sequence[TiledInputs]) -> None:
    for r, row in enumerate(rows):
        zeros = int((row.attention_mask == 0).sum())
        if zeros:
            raise InputError(
                f"attention_mask has {zeros} zero(s) inside the row; packing attends every token of a row, so the "
                "row must be unpadded (attention_mask all ones)", row=r, column="attention_mask", stage="collate",
                fix="strip the masked tokens")


def pack_tiled(rows: Sequence[TiledInputs], *, table: Optional[np.ndarray] = None, pad_token_id: int = 0,
               max_tokens: Optional[int] = None, max_images: Optional[int] = None,
               image_processor=None) -> TiledPackedInputs:
    """`TiledInputs` rows of one family -> one `TiledPackedInputs` (see its doc for shapes).

    ``table``: float32 [3, 256] (`mmpipe.batching.tiled.processor_table`), needed when the rows
    hold pixels (and ``image_processor`` for ``pixels="source"`` rows, as `collate_tiled`).
    ``max_tokens`` / ``max_images``: the pack's budgets; a batch over either raises.
    Rows must be unpadded (attention_mask all ones), as ``mmpipe.encode`` stores them.
    """
    if not rows:
        raise ArgumentError("pack needs at least one row")
    b = collate_tiled(list(rows), table=table, pad_token_id=pad_token_id, padding_side="right",
                      image_processor=image_processor)
    check_packing_allowed("pack", b.family_table)
    _check_budgets(b, max_tokens, max_images)
    _check_unpadded(rows)
    n = len(rows)
    cu = np.zeros(n + 1, np.int32)
    cu[1:] = np.cumsum(b.lengths)
    starts = cu[:-1].astype(np.int64)
    labels = first_labels = None
    if b.labels is not None:
        labels = np.concatenate([b.labels[k, :int(m)] for k, m in enumerate(b.lengths)])[None]
        first_labels = labels[0, starts].copy()
        labels[0, starts] = IGNORE_INDEX
    flat = {name: np.concatenate([getattr(r, name) for r in rows]).astype(np.int64)[None]
            for name in ("input_ids", "mm_token_type_ids", "position_ids")}
    none = np.zeros((n, 0), np.int64)  # the pack owns the tokens; `meta` keeps the rest
    meta = TiledBatch(**{**b.__dict__, "input_ids": none, "attention_mask": none, "position_ids": none,
                         "mm_token_type_ids": none, "labels": None})
    return TiledPackedInputs(cu_seqlens=cu, labels=labels, first_labels=first_labels, meta=meta, **flat)


def tiled_to_padded(packed: TiledPackedInputs, padding_side: str = "right") -> TiledBatch:
    """The same rows as a padded `TiledBatch` (what `collate_tiled` builds, pad id 0)."""
    if padding_side not in ("left", "right"):
        raise ArgumentError(f"padding_side must be 'left' or 'right', found {padding_side!r}")
    m, lengths = packed.meta, packed.seq_lengths
    n, L = packed.num_rows, int(lengths.max())
    bounds = packed.cu_seqlens.astype(np.int64)

    def place(flat: np.ndarray, fill: int) -> np.ndarray:
        out = np.full((n, L), fill, np.int64)
        for k in range(n):
            a, e = int(bounds[k]), int(bounds[k + 1])
            out[k, slice(0, e - a) if padding_side == "right" else slice(L - (e - a), L)] = flat[a:e]
        return out

    labels = None
    if packed.labels is not None:
        flat = packed.labels[0].copy()
        flat[bounds[:-1]] = packed.first_labels
        labels = place(flat, IGNORE_INDEX)
    return TiledBatch(**{
        **m.__dict__, "input_ids": place(packed.input_ids[0], 0),
        "attention_mask": place(np.ones(packed.num_tokens, np.int64), 0),
        "position_ids": place(packed.position_ids[0], 0), "mm_token_type_ids": place(packed.mm_token_type_ids[0], 0),
        "labels": labels, "padding_side": padding_side})


def unpack_tiled(packed: TiledPackedInputs) -> list[TiledInputs]:
    """The packed rows back, exactly: ``unpack_tiled(pack_tiled(rows))`` equals ``rows``."""
    return unbatch_tiled(tiled_to_padded(packed))


class TiledPackingCollator:
    """`mmpipe.PackingCollator` for a tiled family's processor: picklable, holds the family
    name, the pixel table float32 [3, 256], the pad id and the budgets only."""

    def __init__(self, family: TiledFamily, table: np.ndarray, pad_token_id: int, *,
                 max_tokens: Optional[int] = None, max_images: Optional[int] = None, image_processor=None):
        check_packing_allowed("PackingCollator", family)
        self.family, self.table, self.pad_token_id = family.name, table, pad_token_id
        self.image_processor = image_processor  # pixels="source" rows (mmpipe.batching.tiled.decoded_rows)
        self.max_tokens, self.max_images = max_tokens, max_images

    def __call__(self, rows: Sequence[Any]) -> TiledPackedInputs:
        records = tiled_records(rows)
        if records is None:
            raise FamilyMismatchError(f"rows not encoded for {self.family!r}", row=0, column="family",
                                      expected=repr(self.family), found="rows of another family",
                                      fix="encode the dataset with this processor (mmpipe.encode)")
        _check_family(records, self.family)
        return pack_tiled(records, table=self.table, pad_token_id=self.pad_token_id, max_tokens=self.max_tokens,
                          max_images=self.max_images, image_processor=self.image_processor)


def _check_family(records: Sequence[TiledInputs], family: str) -> None:
    for i, r in enumerate(records):
        if not tiled_family_of(family).accepts(r.family):
            raise FamilyMismatchError(f"encoded for model family {r.family!r} but this pack is for {family!r}",
                                      row=i, column="family", expected=repr(family), found=repr(r.family),
                                      fix="re-encode the dataset with this model's processor")


# ---- the dispatch from mmpipe.pack / mmpipe.PackingCollator ----------------------------------
def tiled_pack(rows: Any, *, processor=None, family: Any = None, pad_token_id: Optional[int] = None,
               max_tokens: Optional[int] = None, max_images: Optional[int] = None) -> Optional[TiledPackedInputs]:
    """`mmpipe.pack` for tiled rows (records, stored dicts or Arrow): a `TiledPackedInputs`;
    None for rows of any other kind."""
    records = tiled_records(rows)
    if records is None:
        return None
    given = family if family is not None else processor
    fam = tiled_family_of(records[0].family if given is None else given)
    if fam is None:
        raise FamilyMismatchError(f"rows of {records[0].family!r} packed with another family's processor", row=0,
                                  column="family", expected=repr(records[0].family),
                                  found=type(processor).__name__ if family is None else repr(family),
                                  fix="pack with the processor that encoded the rows")
    check_packing_allowed("pack", fam)
    _check_family(records, fam.name)
    needs_table = processor is not None and any(r.has_pixels and r.num_images for r in records)
    return pack_tiled(records, table=processor_table(processor) if needs_table else None,
                      pad_token_id=pad_id(processor, pad_token_id), max_tokens=max_tokens, max_images=max_images,
                      image_processor=effective_image_processor(processor) if needs_table else None)


def tiled_packing_collator(processor, family: Any, pad_token_id: Optional[int], max_tokens: Optional[int],
                           max_images: Optional[int]) -> Optional[TiledPackingCollator]:
    """`TiledPackingCollator` for a tiled family's processor (or ``family``); None otherwise."""
    fam = tiled_family_of(family if family is not None else processor)
    if fam is None:
        return None
    check_packing_allowed("PackingCollator", fam)
    if processor is None:
        raise ArgumentError(f"PackingCollator for {fam.name!r} needs the processor (its pixel normalisation)")
    return TiledPackingCollator(fam, processor_table(processor), pad_id(processor, pad_token_id),
                                max_tokens=max_tokens, max_images=max_images,
                                image_processor=effective_image_processor(processor))
