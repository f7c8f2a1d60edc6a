"""`BatchedMultiModalInputs` -> per-row `MultiModalInputs`: the exact inverse of collate.

Padding is stripped by each row's recorded length and padding side; each row's images
are sliced back out by the batch's offsets (never by batch index), in the pixel storage
each row came in (compact uint8 rows come back compact).

Before splitting, `check_batch` checks the batch's internal consistency in a few vectorised
passes (a batch edited by hand, or assembled by another tool, would otherwise give rows that
disagree with themselves): every text field's shape, ``seq_lengths`` within the padded length
and no real token (attention, media type, label) in the padding; then its media items as the
family's kind declares them (`mmpipe.batching.media_checks`: image/video offsets starting at 0,
non-decreasing and covering the layout; unit offsets equal to the grids' patches or the tile
counts; pixel rows equal to those units; each row's image/video tokens equal to its grids'
tokens where the kind declares the rule). A failure raises `InputError` (lengths) or `PixelDataError` (media) at stage "validate" -
the batch's stored fields are being validated, as `validate_dataset` does for stored rows -
naming the batch row and the field.
"""

from __future__ import annotations

import numpy as np

from mmpipe.batching.media_checks import check_media_items
from mmpipe.batching.media_fields import cut_layout
from mmpipe.batching.text import text_row_fields
from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import to_numpy
from mmpipe.records.row import MultiModalInputs


def unbatch(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """Split a batch of any family back into its rows: ``unbatch(collate(rows)) == rows``.

    The text part is cut by each row's length and the padding side
    (`mmpipe.batching.text.text_row_fields`) after `check_batch`; the media fields by the
    family's declarations: each row's layout fields cut out by the offsets (``fam.media.MEDIA_ITEMS``,
    `cut_layout`) and its values of the per-row batch fields (``fam.media.ROW_FIELDS``), then
    the kind's own (``fam.media.unbatch_media``: patches, or the processor's outputs, each
    checked against the batch where the kind can be). Anything but a batch (its
    ``model_inputs()`` dict, a pack, a list of rows) raises `ArgumentError` saying what to pass."""
    check_batch_type(batch)
    check_batch(batch)
    media = batch.fam.media
    check_media_items(batch, media.MEDIA_ITEMS)
    text = text_row_fields(batch)
    rows = cut_layout(batch, media.MEDIA_ITEMS)
    for field, per_row in media.ROW_FIELDS:
        for row, value in zip(rows, getattr(batch, per_row) or [None] * len(rows)):
            row[field] = value
    media_rows = media.unbatch_media(batch, rows)
    for row in media_rows:  # a row stored as its image files (pixels="source") gets them back, not the pixels decoded
        if row.get("image_sources") is not None:
            row.update(pixel_values=None, pixel_values_u8=None)
    return [MultiModalInputs(family=batch.family, **t, **m) for t, m in zip(text, media_rows)]


FIX = "build the batch with mmpipe.collate(rows) and do not edit its fields in place"


def check_batch_type(batch) -> None:
    """`ArgumentError` unless ``batch`` is a `BatchedMultiModalInputs`: the dict of
    ``model_inputs()`` has lost the lengths, padding side and offsets a split needs, and a pack
    is split by `mmpipe.batching.packing.unpack` (an attribute error deep inside otherwise)."""
    if isinstance(batch, BatchedMultiModalInputs):
        return
    from mmpipe.records.packed import PackedMultiModalInputs

    kind = type(batch).__name__
    if isinstance(batch, PackedMultiModalInputs):
        fix = "split a pack with mmpipe.unpack(packed) (or mmpipe.batching.packing.unpack)"
    elif isinstance(batch, dict):
        fix = ("pass the batch itself (what mmpipe.collate / Collator returned), not batch.model_inputs(): "
               "the dict has no row lengths, padding side or image offsets")
    else:
        fix = "pass the BatchedMultiModalInputs that mmpipe.collate / Collator returned"
    raise ArgumentError(f"unbatch takes a BatchedMultiModalInputs, got a {kind}; {fix}")


def check_batch(batch: BatchedMultiModalInputs) -> None:
    """The text part's internal consistency, vectorised (a few numpy passes over [B, L]): every
    field's shape, lengths in range, and no real token (attention, media type, label) in the
    padding. Raises `InputError` at stage "validate", naming the row and the field."""
    def opt(v):
        return to_numpy(v) if v is not None else None

    a = {"ids": to_numpy(batch.input_ids), "att": to_numpy(batch.attention_mask),
         "mm": to_numpy(batch.mm_token_type_ids), "lengths": to_numpy(batch.seq_lengths), "labels": opt(batch.labels)}
    att, mm, lengths = a["att"], a["mm"], a["lengths"]
    B, L = a["ids"].shape
    for name, arr, want in (("attention_mask", att, (B, L)), ("mm_token_type_ids", mm, (B, L)),
                            ("position_ids", to_numpy(batch.position_ids), (*batch.fam.media.POSITION_ROWS, B, L)),
                            ("rope_deltas", to_numpy(batch.rope_deltas), (B, 1)),
                            ("seq_lengths", lengths, (B,)), ("labels", a["labels"], (B, L))):
        if arr is not None and arr.shape != want:
            raise InputError(where="", column=name, stage="validate", expected=f"shape {want} (input_ids is {(B, L)})",
                             found=tuple(arr.shape), fix=FIX)
    if B and (lengths.min() < 0 or lengths.max() > L):
        b = int(np.flatnonzero((lengths < 0) | (lengths > L))[0])
        raise InputError(row=b, column="seq_lengths", stage="validate", expected=f"0..{L} (the padded length)",
                         found=int(lengths[b]), fix=FIX)
    _check_lengths(batch, a, B, L)


def _check_lengths(batch, a: dict, B: int, L: int) -> None:
    """No real token cut off by ``seq_lengths``: at most ``seq_lengths`` attended tokens per row,
    and the token just outside each row's slice (padding side) is padding (attention 0, media
    type 0, label -100). O(B) apart from one sum over [B, L]."""
    att, mm, lengths, labels = a["att"], a["mm"], a["lengths"], a["labels"]
    over = att.sum(1) > lengths  # 0/1 masks: a sum counts (confirmed by a count before raising)
    if over.any() and (np.count_nonzero(att, axis=1) > lengths).any():
        b = int(np.flatnonzero(np.count_nonzero(att, axis=1) > lengths)[0])
        raise InputError(f"{int(np.count_nonzero(att[b]))} attended tokens but seq_lengths {int(lengths[b])}: "
                         f"seq_lengths and attention_mask disagree", row=b, column="seq_lengths", stage="validate",
                         expected=f"at most {int(lengths[b])} attended tokens",
                         found=f"{int(np.count_nonzero(att[b]))} attended tokens", fix=FIX)
    rows = np.flatnonzero(lengths < L)
    flat = rows * L + ((L - 1 - lengths[rows]) if batch.padding_side == "left" else lengths[rows])
    for name, arr, empty in (("attention_mask", att, 0), ("mm_token_type_ids", mm, 0), ("labels", labels, -100)):
        if arr is not None and (arr.take(flat) != empty).any():
            b = int(rows[np.flatnonzero(arr.take(flat) != empty)[0]])
            raise InputError(f"{name} marks the token next to the row's seq_lengths {int(lengths[b])} "
                             f"({batch.padding_side} padding) as real: seq_lengths and the tokens disagree",
                             row=b, column="seq_lengths", stage="validate",
                             expected=f"{name} {empty} next to the row",
                             found=f"{name} {int(arr.take(flat)[np.flatnonzero(arr.take(flat) != empty)[0]])}",
                             fix=FIX)
