"""Collate and unbatch on the generic path: `MultiModalInputs` rows (a processor mmpipe has no
family table for, `mmpipe.encoding.generic`) <-> one padded `BatchedMultiModalInputs`.

`mmpipe.collate` and `mmpipe.Collator` come here for such rows or processors
(`generic_collate`): stored dicts, Arrow tables (`mmpipe.ArrowRows`) or records. Padding
is what the processor's own batch call gives (right padding: equal to it, checked on
Idefics3); ragged tiles and images are zero-padded; positions are ``0..n-1`` per row::

    >>> batch = collate_generic(rows, pad_token_id=0, padding_side="left")  # doctest: +SKIP
    >>> model(**batch.model_inputs()).logits                                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.checks import check_path_rows
from mmpipe.batching.text import pad_sequences, text_fields, text_row_fields
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.families import GENERIC_FAMILY, processor_class_name, takes_generic_path, tiled_family_of
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.media.processor import LAYOUT_COLUMN
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.kinds import is_generic_row
from mmpipe.records.row import MultiModalInputs

logger = logging.getLogger("mmpipe")

__all__ = ["collate_generic", "unbatch_generic", "generic_collate", "generic_collator", "generic_records",
           "refuse_packing", "GenericCollator", "padded_length", "pad_sequences", "token_aligned"]


def _padded(arr: np.ndarray, shape: tuple) -> np.ndarray:
    """``arr`` zero-padded at the end of every axis to ``shape``."""
    if arr.shape == tuple(shape):
        return arr
    out = np.zeros(shape, arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def token_aligned(rows: list[MultiModalInputs], key: str) -> bool:
    """Whether row key ``key`` is ``[1, L, ...]`` in every row holding it, L the row's tokens
    (Mllama's ``cross_attention_mask`` ``[1, L, images, tiles]``): its axis 1 is padded as the tokens."""
    present = [(r.vision[key], len(r)) for r in rows if key in r.vision]
    return bool(present) and all(a.ndim >= 2 and a.shape[1] == n for a, n in present)


def _collate_vision(rows: list[MultiModalInputs], key: str, row_key: bool, L: int = 0,
                    padding_side: str = "right") -> tuple[np.ndarray, list]:
    present = [r.vision[key] for r in rows if key in r.vision]
    trailing = tuple(np.max([a.shape[1:] for a in present], axis=0))
    if row_key and token_aligned(rows, key):  # axis 1 on the tokens' side and length
        out = np.zeros((len(rows), L, *trailing[1:]), present[0].dtype)
        for b, r in enumerate(rows):
            if key in r.vision:
                a, n = r.vision[key], len(r)
                start = 0 if padding_side == "right" else L - n
                out[b:b + 1, start:start + n][tuple(slice(0, k) for k in (1, n, *a.shape[2:]))] = a
        return out, [r.vision[key].shape if key in r.vision else None for r in rows]
    if row_key:  # [1, n, ...] per row; a row without it is all padding, as the processor pads
        blocks = [_padded(r.vision[key], (1, *trailing)) if key in r.vision else np.zeros((1, *trailing), present[0].dtype)
                  for r in rows]
        fill = dict(rows[0].layout.pads if rows[0].layout is not None else ()).get(key)
        if fill is not None and len(trailing) >= 2 and len(fill) == int(np.prod(trailing[1:])):
            for b, r in enumerate(rows):  # missing items (axis 1) as the processor pads them
                start = r.vision[key].shape[1] if key in r.vision else 0
                if start < trailing[0]:
                    blocks[b] = blocks[b].copy()
                    blocks[b][0, start:] = np.reshape(fill, trailing[1:])
    else:
        blocks = [_padded(a, (a.shape[0], *trailing)) for a in present]
    return np.concatenate(blocks), [r.vision[key].shape if key in r.vision else None for r in rows]


def padded_length(lengths: np.ndarray, pad_to_length: Optional[int], pad_to_multiple_of: Optional[int]) -> int:
    """The padded length L of a batch whose rows have ``lengths`` (int [B]): the longest, or
    ``pad_to_length`` (`InputError` naming the row when a row is longer), rounded up to
    ``pad_to_multiple_of``."""
    L = int(lengths.max())
    if pad_to_length is not None:
        if pad_to_length < L:
            raise InputError(f"row {int(lengths.argmax())} has {L} tokens, more than pad_to_length={pad_to_length}",
                             row=int(lengths.argmax()), column="input_ids", stage="collate",
                             fix="compute pad_to_length from these rows")
        L = pad_to_length
    if pad_to_multiple_of:
        L = -(-L // pad_to_multiple_of) * pad_to_multiple_of
    return L


CROSS_ATTENTION_WARNED: set = set()  # processor classes warned about (once per process)


def _warn_cross_attention_counts(rows: list[MultiModalInputs]) -> None:
    """A cross-attention model (Mllama: ``cross_attention_mask`` [1, L, images, tiles]) attends
    from a row's text before its first image to every image slot of the batch, padding images
    included, so a batch of rows with different image counts differs from each row alone (the
    processor's own batch does the same). Logged once per processor class."""
    counts = {r.vision["cross_attention_mask"].shape[2] for r in rows if "cross_attention_mask" in r.vision}
    cls = rows[0].processor_class
    if len(counts) > 1 and cls not in CROSS_ATTENTION_WARNED:
        CROSS_ATTENTION_WARNED.add(cls)
        logger.warning("mmpipe: %s batch with %s images per row: its cross-attention sees the batch's padding "
                       "images, so logits differ from each row alone (as with the processor's own batch); batch "
                       "rows of equal image counts for per-row results (e.g. group the dataset by image count)",
                       cls, sorted(counts))


def collate_generic(rows: list[MultiModalInputs], *, pad_token_id: int = 0, padding_side: str = "right",
                    pad_to_length: Optional[int] = None, pad_to_multiple_of: Optional[int] = None) -> BatchedMultiModalInputs:
    """`MultiModalInputs` rows -> one padded `BatchedMultiModalInputs` (see its doc for the shapes).

    Every row must come from the same processor class. ``position_ids`` are ``0..n-1`` over
    each row's own tokens (pads 0), so left and right padding give the per-row positions.
    """
    if not rows:
        raise ArgumentError("collate_generic needs at least one row")
    if padding_side not in ("left", "right"):
        raise ArgumentError(f"padding_side must be 'left' or 'right', found {padding_side!r}")
    for i, r in enumerate(rows):
        if r.processor_class != rows[0].processor_class:
            raise InputError("rows of different processors in one batch", row=i, column="processor_class",
                             stage="collate", expected=rows[0].processor_class, found=r.processor_class,
                             fix="batch rows encoded by one processor")
    lengths = np.array([len(r) for r in rows], np.int64)
    L = padded_length(lengths, pad_to_length, pad_to_multiple_of)
    _warn_cross_attention_counts(rows)
    from mmpipe.media.processor import ProcessorLayout

    row_keys = tuple(sorted({k for r in rows for k in r.row_keys}))
    vision, shapes = {}, {}
    for key in sorted({k for r in rows for k in r.vision}):
        vision[key], shapes[key] = _collate_vision(rows, key, key in row_keys, L, padding_side)
    layout = rows[0].layout if all(r.layout == rows[0].layout for r in rows) else ProcessorLayout.of(
        rows[0].processor_class, rows[0].sequence, {k: v[:0] for k, v in vision.items()}, row_keys)
    return BatchedMultiModalInputs(
        **text_fields(rows, L, pad_token_id, padding_side), family=rows[0].family, padding_side=padding_side,
        pixel_format="float32" if vision else "none", patch_offsets=np.zeros(len(rows) + 1, np.int64),
        image_hw=(np.concatenate([r.image_hw if r.image_hw is not None else np.zeros((0, 2), np.int64)
                                                  for r in rows]).astype(np.int64).reshape(-1, 2)),
        layout=layout, shapes=shapes, vision=vision,
        sequence={k: (pad_sequences([r.sequence[k] for r in rows], L, 0, padding_side))
                  for k in sorted({k for r in rows for k in r.sequence})})


def unbatch_generic(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """A generic-path batch -> its rows, exactly as collated (``unbatch_generic(collate_generic(rows))``
    equals ``rows``, their `ProcessorLayout` included, so written back they store as before)."""
    from mmpipe.records.columns import to_numpy

    rows, offsets = [], {k: 0 for k in batch.vision}
    L = batch.input_ids.shape[1]
    io = to_numpy(batch.image_offsets).tolist()
    hw = to_numpy(batch.image_hw) if batch.image_hw is not None else None
    vision_np = {k: to_numpy(v) for k, v in batch.vision.items()}
    row_keys = set(batch.layout.row_keys) if batch.layout is not None else set()
    for b, text in enumerate(text_row_fields(batch)):
        n = len(text["input_ids"])
        cols = slice(0, n) if batch.padding_side == "right" else slice(L - n, L)
        vision = {}
        for key, arr in vision_np.items():
            shape = batch.shapes[key][b]
            if shape is None:
                continue
            start = b if key in row_keys else offsets[key]
            cut = [slice(0, s) for s in shape]
            if key in row_keys and len(shape) >= 2 and shape[1] == n:  # token-aligned (see token_aligned)
                cut[1] = cols
            vision[key] = arr[start:start + shape[0]][tuple(cut)].copy()
            offsets[key] += 0 if key in row_keys else shape[0]
        rows.append(MultiModalInputs(
            family=batch.family, layout=batch.layout, vision=vision,
            sequence={k: to_numpy(v)[b, cols].copy() for k, v in batch.sequence.items()},
            image_hw=None if hw is None else hw[io[b]:io[b + 1]].copy(), **text))
    return rows


# ---- the dispatch from mmpipe.collate / mmpipe.Collator ----------------------------------------
def generic_records(rows: Any) -> Optional[list[MultiModalInputs]]:
    """``rows`` as `MultiModalInputs` when they come from the generic path (records, stored dicts
    of the generic family, or an Arrow table of them), else None (native rows). A batch
    mixing both, or holding a row that failed under ``on_error="skip"``, raises `InputError`."""
    import pyarrow as pa

    if isinstance(rows, (list, tuple)) and rows and isinstance(rows[0], (pa.Table, pa.RecordBatch)):
        first = rows[0]  # one-row tables (ArrowRows): native batches are not concatenated here (collate does)
        if "family" not in first.column_names or first.column("family")[0].as_py() != GENERIC_FAMILY:
            return None
        rows = pa.concat_tables([r if isinstance(r, pa.Table) else pa.Table.from_batches([r]) for r in rows])
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        if "family" not in rows.column_names:
            return None
        fams = rows.column("family").to_pylist()
        flags = [f == GENERIC_FAMILY for f in fams]
        errors = rows.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in rows.column_names else [None] * len(fams)
        records = None
    else:
        if not len(rows):
            return None
        flags = [is_generic_row(r) for r in rows]
        errors = [r.get(ERROR_COLUMN) if isinstance(r, dict) else None for r in rows]
        records = rows
    if not any(flags):
        return None
    check_path_rows(flags, errors, "generic-path", "a natively encoded row")
    if records is None:
        return rows_from_arrow(rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows]))
    return [r if isinstance(r, MultiModalInputs) else MultiModalInputs.from_dict(r, i) for i, r in enumerate(records)]


def pad_id(processor, pad_token_id: Optional[int] = None) -> int:
    """``pad_token_id``, else the processor's tokenizer's pad id, else 0."""
    if pad_token_id is not None:
        return int(pad_token_id)
    tok = getattr(processor, "tokenizer", processor)
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    return 0 if pad is None else int(pad)


def generic_collate(records: list[MultiModalInputs], rows: Any, *, processor=None, padding_side: str,
                    pad_token_id: Optional[int] = None, pad_to_length: Optional[int] = None,
                    pad_to_multiple_of: Optional[int] = None, keep_columns: Sequence[str] = ()) -> BatchedMultiModalInputs:
    """`collate_generic` with `mmpipe.collate`'s arguments (the pad id from ``processor`` unless
    given) and its pass-through ``keep_columns`` (read from ``rows``)."""
    from mmpipe.batching.checks import arrow_table

    if processor is not None and processor_class_name(processor) != records[0].processor_class:
        raise FamilyMismatchError(f"encoded by {records[0].processor_class} (the generic path) but collated with "
                                  f"{processor_class_name(processor)}", row=0, column=LAYOUT_COLUMN,
                                  expected=processor_class_name(processor), found=records[0].processor_class,
                                  fix="collate with the processor that encoded the rows, or re-encode them")
    batch = collate_generic(records, pad_token_id=pad_id(processor, pad_token_id),
                            padding_side=padding_side, pad_to_length=pad_to_length,
                            pad_to_multiple_of=pad_to_multiple_of)
    if keep_columns:
        table = arrow_table(rows)
        source = table.to_pylist() if table is not None else rows
        missing = [(i, n) for n in keep_columns for i, r in enumerate(source) if n not in r]
        if missing:
            i, n = missing[0]
            raise InputError(f"has no column {n!r} to keep", row=i, column=n, stage="collate",
                             fix="keep the column when encoding, or drop it from keep_columns")
        batch.columns = {n: [r[n] for r in source] for n in keep_columns}
    return batch


class GenericCollator:
    """`mmpipe.Collator` for a processor on the generic path: picklable, holds the processor
    class name and pad id only. Rows must come from that processor class."""

    def __init__(self, processor_class: str, pad_token_id: int, *, padding_side: str = "left",
                 pad_to_multiple_of: Optional[int] = None, keep_columns: Sequence[str] = ()):
        self.processor_class = processor_class
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.keep_columns = tuple(keep_columns)

    def __call__(self, rows: Sequence[Any]) -> BatchedMultiModalInputs:
        records = generic_records(rows)
        if records is None:
            raise InputError("natively encoded rows for a processor on the generic path", row=0, column="family",
                             stage="collate", expected=repr(GENERIC_FAMILY), found="a native family",
                             fix=f"encode the dataset with this {self.processor_class} processor (mmpipe.encode)")
        for i, r in enumerate(records):
            if r.processor_class != self.processor_class:
                raise InputError("encoded by another processor", row=i, column="generic_layout", stage="collate",
                                 expected=self.processor_class, found=r.processor_class,
                                 fix="collate with the processor that encoded the rows")
        return generic_collate(records, rows, padding_side=self.padding_side, pad_token_id=self.pad_token_id,
                               pad_to_multiple_of=self.pad_to_multiple_of, keep_columns=self.keep_columns)


def generic_collator(processor, family, pad_token_id: Optional[int], padding_side: str,
                     pad_to_multiple_of: Optional[int], keep_columns: Sequence[str]) -> Optional[GenericCollator]:
    """`mmpipe.Collator`'s generic twin for a processor on the generic path (None otherwise)."""
    if family is not None or not takes_generic_path(processor):
        return None
    return GenericCollator(processor_class_name(processor), pad_id(processor, pad_token_id), padding_side=padding_side,
                           pad_to_multiple_of=pad_to_multiple_of, keep_columns=keep_columns)


def refuse_packing(who: str, obj) -> None:
    """Raise `ArgumentError` when ``obj`` (a processor, or the batch `mmpipe.pack` collated) is
    on the generic path: mmpipe cannot know whether an unlisted model's attention allows packed
    rows (Gemma 3's bidirectional image attention, cross-attention models); or is a tiled
    family's whose row refuses packing (`mmpipe.families.ModelFamily.no_packing` says why)."""
    tiled = tiled_family_of(obj.family if isinstance(obj, BatchedMultiModalInputs) else obj) if obj is not None else None
    if tiled is not None:  # a tiled family packs unless its row says why not (mmpipe.batching.tiled_packing)
        if tiled.no_packing:
            raise ArgumentError(f"{who}: packing is not available for {tiled.name}: {tiled.no_packing}; use "
                                f"mmpipe.Collator(processor) for padded batches")
        return
    if isinstance(obj, BatchedMultiModalInputs):
        if obj.fam.kind != "processor":
            return
        cls = obj.processor_class
    elif takes_generic_path(obj):
        cls = processor_class_name(obj)
    else:
        return
    raise ArgumentError(f"{who}: packing is not available for {cls}: it has no mmpipe family table and takes the "
                        f"generic path (whether its model's attention allows packed rows is unknown); use "
                        f"mmpipe.Collator(processor) for padded batches")
