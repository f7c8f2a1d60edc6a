"""Packing for the tiled families (`mmpipe.families.ModelFamily`): `MultiModalInputs` rows -> one
padding-free `PackedMultiModalInputs` sequence, and back. `mmpipe.pack`, `mmpipe.unpack`,
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
from mmpipe.batching.pack_batch import pack_batch
from mmpipe.batching.tiled import collate_tiled, processor_table, tiled_records, unbatch_tiled
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.families import ModelFamily, tiled_family_of
from mmpipe.images.tiles import effective_image_processor
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.packed import PackedMultiModalInputs

__all__ = ["pack_tiled", "TiledPackingCollator", "check_packing_allowed",
           "tiled_pack", "tiled_packing_collator"]


def check_packing_allowed(who: str, family: ModelFamily) -> None:
    """Raise `ArgumentError` with the family's ``no_packing`` reason when its model's attention
    does not allow packed rows."""
    if family.no_packing is not None:
        raise ArgumentError(f"{who}: packing is not available for {family.name}: {family.no_packing}; use "
                            f"mmpipe.Collator(processor) for padded batches")


def pack_tiled(rows: Sequence[MultiModalInputs], *, table: Optional[np.ndarray] = None, pad_token_id: int = 0,
               max_tokens: Optional[int] = None, max_images: Optional[int] = None,
               image_processor=None) -> PackedMultiModalInputs:
    """`MultiModalInputs` rows of one family -> one `PackedMultiModalInputs` (see its doc for shapes).

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
    return pack_batch(b, max_tokens, max_images)


class TiledPackingCollator:
    """`mmpipe.PackingCollator` for a tiled family's processor: picklable, holds the family
    name, the pixel table float32 [3, 256], the pad id and the budgets only."""

    def __init__(self, family: ModelFamily, table: np.ndarray, pad_token_id: int, *,
                 max_tokens: Optional[int] = None, max_images: Optional[int] = None, image_processor=None):
        check_packing_allowed("PackingCollator", family)
        self.family, self.table, self.pad_token_id = family.name, table, pad_token_id
        self.image_processor = image_processor  # pixels="source" rows (mmpipe.batching.tiled.decoded_rows)
        self.max_tokens, self.max_images = max_tokens, max_images

    def __call__(self, rows: Sequence[Any]) -> PackedMultiModalInputs:
        records = tiled_records(rows)
        if records is None:
            raise FamilyMismatchError(f"rows not encoded for {self.family!r}", row=0, column="family",
                                      expected=repr(self.family), found="rows of another family",
                                      fix="encode the dataset with this processor (mmpipe.encode)")
        _check_family(records, self.family)
        return pack_tiled(records, table=self.table, pad_token_id=self.pad_token_id, max_tokens=self.max_tokens,
                          max_images=self.max_images, image_processor=self.image_processor)


def _check_family(records: Sequence[MultiModalInputs], family: str) -> None:
    for i, r in enumerate(records):
        if not tiled_family_of(family).accepts(r.family):
            raise FamilyMismatchError(f"encoded for model family {r.family!r} but this pack is for {family!r}",
                                      row=i, column="family", expected=repr(family), found=repr(r.family),
                                      fix="re-encode the dataset with this model's processor")


# ---- the dispatch from mmpipe.pack / mmpipe.PackingCollator ----------------------------------
def tiled_pack(rows: Any, *, processor=None, family: Any = None, pad_token_id: Optional[int] = None,
               max_tokens: Optional[int] = None, max_images: Optional[int] = None) -> Optional[PackedMultiModalInputs]:
    """`mmpipe.pack` for tiled rows (records, stored dicts or Arrow): a `PackedMultiModalInputs`;
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
