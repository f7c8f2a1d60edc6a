"""Encoded rows -> one padded `BatchedMultiModalInputs` (a DataLoader ``collate_fn``).

Rows may hold any number of images (zero included) and come as ``MultiModalInputs``,
plain python dicts (``datasets`` rows) or numpy/torch formatted rows. Pixel data is
concatenated in row order; compact uint8 rows become float32 ``pixel_values`` here, equal
to the transformers processor's output. Positions are the rows' own (M-RoPE positions do
not depend on padding), placed under the padding.

Example::

    loader = DataLoader(enc, batch_size=8, collate_fn=mmpipe.Collator(processor), num_workers=2)
    batch = next(iter(loader))
    out = model(**batch.model_inputs())
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.errors import FamilyMismatchError, InputError, PixelDataError
from mmpipe.families import ModelFamily, family_of, get_family
from mmpipe.images.spec import VisionSpec
from mmpipe.images.pixels import u8_to_pixel_values, u8_video_to_pixel_values
from mmpipe.records.columns import IGNORE_INDEX, offsets
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.batch import BatchedMultiModalInputs

logger = logging.getLogger("mmpipe")


def collate(
    rows: Sequence[Any],
    *,
    processor=None,
    spec: Optional[VisionSpec] = None,
    family: Any = None,
    padding_side: str = "left",
    pad_to_multiple_of: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    pad_to_length: Optional[int] = None,
) -> BatchedMultiModalInputs:
    """Pad and pack encoded rows into a batch.

    Args:
        rows: encoded rows (``MultiModalInputs`` or dicts as stored by ``mmpipe.encode``).
        processor: optional; supplies the image normalisation constants, the pad token and
            the family the rows must belong to. Without it the family table's defaults are used.
        padding_side: ``"left"`` (generation) or ``"right"``.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        pad_to_length: pad to exactly this length (error if a row is longer).

    Returns a `BatchedMultiModalInputs` with input_ids/attention_mask/mm_token_type_ids
    int64 [B, L], position_ids int64 [3, B, L], pixel_values float32 [sum N, D], image_grid_thw
    int64 [sum I, 3], image_offsets / patch_offsets int64 [B+1].

    Bad rows raise `mmpipe.errors.InputError` subclasses naming the row (index in ``rows``)
    and column, all O(rows) or vectorised checks: pixel data that disagree with the grids or
    the image tokens, NaN/inf in float pixel values, integer pixel values or float token ids,
    rows encoded for another model family (`FamilyMismatchError`), and rows that failed to
    encode under ``on_error="skip"`` (filter them with `mmpipe.drop_failed`).
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if not len(rows):
        raise InputError("collate got an empty list of rows", where="", stage="collate",
                         fix="drop empty batches (DataLoader(drop_last=...)) or filter before collating")
    table = _arrow_table(rows)
    try:
        if table is not None:  # stored rows as Arrow (ArrowRows): numpy views of the column buffers
            _check_error_column(table.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in table.column_names else ())
            recs = [r.validate(i) for i, r in enumerate(rows_from_arrow(table))]
        else:
            _check_error_column([r.get(ERROR_COLUMN) if isinstance(r, dict) else None for r in rows])
            recs = []
            for i, r in enumerate(rows):
                _check_dtypes(r, i)
                recs.append(MultiModalInputs.from_dict(r, row=i).validate(i))
    except InputError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise _as_row_error(e) from e

    want: Optional[ModelFamily] = None
    if family is not None:
        want = family_of(family)
    elif processor is not None:
        want = family_of(processor)
    fam = get_family(recs[0].family) if want is None else want
    for i, r in enumerate(recs):
        if r.family != fam.name:
            raise FamilyMismatchError(
                f"encoded for model family {r.family!r} but this batch is for {fam.name!r}", row=i,
                column="family", expected=repr(fam.name), found=repr(r.family),
                fix="re-encode the dataset with this model's processor (token ids, patch size and "
                    "positions differ between families)",
            )
    if spec is None:
        spec = VisionSpec.from_processor(processor) if (processor is not None and fam.is_vision) else VisionSpec.from_family(fam)
    if pad_token_id is None:
        tok = getattr(processor, "tokenizer", processor)
        pad_token_id = getattr(tok, "pad_token_id", None) if tok is not None else None
        pad_token_id = 0 if pad_token_id is None else int(pad_token_id)

    B = len(recs)
    lengths = np.asarray([r.num_tokens for r in recs], dtype=np.int64)
    L = int(lengths.max()) if B else 0
    if pad_to_length is not None:
        if pad_to_length < L:
            raise ValueError(
                f"row {int(lengths.argmax())} has {L} tokens, more than pad_to_length={pad_to_length}; "
                "compute the length from these rows (e.g. DataPacker.policy_compute_max_len)"
            )
        L = pad_to_length
    if pad_to_multiple_of:
        L = -(-L // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = np.full((B, L), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((B, L), dtype=np.int64)
    mm_types = np.zeros((B, L), dtype=np.int64)
    position_ids = np.zeros((3, B, L), dtype=np.int64)
    row_has_labels = np.asarray([r.labels is not None for r in recs])
    labels = np.full((B, L), IGNORE_INDEX, dtype=np.int64) if row_has_labels.any() else None
    for b, r in enumerate(recs):
        n = r.num_tokens
        sl = slice(L - n, L) if padding_side == "left" else slice(0, n)
        input_ids[b, sl] = r.input_ids
        attention_mask[b, sl] = r.attention_mask
        mm_types[b, sl] = r.mm_token_type_ids
        position_ids[:, b, sl] = r.position_ids
        if r.labels is not None:
            labels[b, sl] = r.labels
    rope_deltas = np.asarray([[r.rope_delta] for r in recs], dtype=np.int64)

    image_grid = np.concatenate([r.image_grid_thw for r in recs]).reshape(-1, 3)
    video_grid = np.concatenate([r.video_grid_thw for r in recs]).reshape(-1, 3)
    sec = np.concatenate([r.second_per_grid_ts for r in recs]).astype(np.float32)
    image_offsets = offsets([r.num_images for r in recs])
    patch_offsets = offsets([r.num_image_patches for r in recs])
    video_offsets = offsets([r.num_videos for r in recs])
    video_patch_offsets = offsets([r.num_video_patches for r in recs])

    formats = {r.pixel_format for r in recs if r.num_images or r.num_videos}
    missing = [i for i, r in enumerate(recs) if (r.num_images or r.num_videos) and not r.has_pixels]
    pixel_format = formats.pop() if len(formats) == 1 else ("mixed" if formats else "none")
    pv = pv_u8 = pvv = pvv_u8 = None
    with_pixels = [i for i, r in enumerate(recs) if (r.num_images or r.num_videos) and r.has_pixels]
    if missing and with_pixels:
        # a text-only batch would silently drop the pixels of the other rows (found by fuzzing)
        from mmpipe.errors import PixelDataError

        raise PixelDataError(
            f"rows {missing} hold images but no pixel data (layout-only encoding) while rows {with_pixels} "
            "carry pixels; one batch cannot mix them", row=missing[0], column="pixel_values_u8",
            stage="collate", fix="encode every row with pixels='uint8' (or filter layout-only rows out)",
        )
    if missing:
        logger.warning(
            "rows %s hold images but no pixel data (layout-only encoding?); the batch is text-only: "
            "the model will not see any image. Encode with pixels='uint8' to train on images.",
            missing,
        )
        pixel_format = "none"
    elif image_grid.shape[0] or video_grid.shape[0]:
        lut = None
        if image_grid.shape[0]:
            if pixel_format == "uint8":
                pv_u8 = np.concatenate([r.pixel_values_u8 for r in recs if r.num_images])
                lut = spec.lut()
                pv = u8_to_pixel_values(pv_u8, lut, spec.temporal_patch_size)
            else:
                pv = np.concatenate([_float_images(r, spec) for r in recs])
                _check_finite(pv, patch_offsets, "pixel_values")
        if video_grid.shape[0]:
            if pixel_format == "uint8":
                pvv_u8 = np.concatenate([r.pixel_values_videos_u8 for r in recs if r.num_videos])
                pvv = u8_video_to_pixel_values(pvv_u8, spec.lut() if lut is None else lut)
            else:
                pvv = np.concatenate([_float_videos(r, spec) for r in recs])
                _check_finite(pvv, video_patch_offsets, "pixel_values_videos")

    import torch

    t = torch.from_numpy
    return BatchedMultiModalInputs(
        input_ids=t(input_ids),
        attention_mask=t(attention_mask),
        mm_token_type_ids=t(mm_types),
        position_ids=t(position_ids),
        rope_deltas=t(rope_deltas),
        image_grid_thw=t(image_grid.astype(np.int64)),
        image_offsets=t(image_offsets),
        patch_offsets=t(patch_offsets),
        video_grid_thw=t(video_grid.astype(np.int64)),
        second_per_grid_ts=t(sec),
        video_offsets=t(video_offsets),
        video_patch_offsets=t(video_patch_offsets),
        seq_lengths=t(lengths),
        padding_side=padding_side,
        family=fam.name,
        pixel_format=pixel_format,
        labels=t(labels) if labels is not None else None,
        row_has_labels=t(row_has_labels),
        row_pixel_formats=[r.pixel_format for r in recs],
        spec=spec,
        pixel_values=t(pv) if pv is not None else None,
        pixel_values_u8=t(pv_u8) if pv_u8 is not None else None,
        pixel_values_videos=t(pvv) if pvv is not None else None,
        pixel_values_videos_u8=t(pvv_u8) if pvv_u8 is not None else None,
    )


ERROR_COLUMN = "mmpipe_error"  # (mmpipe.encoding.encoder.ERROR_COLUMN; not imported: collate stays light)
_INT_COLUMNS = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "labels",
                "image_grid_thw", "video_grid_thw")
_FLOAT_PIXELS = ("pixel_values", "pixel_values_videos")
_U8_PIXELS = ("pixel_values_u8", "pixel_values_videos_u8")


def _check_error_column(values) -> None:
    """Rows that failed under ``on_error="skip"`` are empty placeholders: never train on them."""
    for i, v in enumerate(values):
        if v:
            raise InputError(
                f"this row failed to encode ({v})", row=i, stage="collate", column=ERROR_COLUMN,
                fix="filter failed rows first: ds, errors = mmpipe.drop_failed(ds), or use mmpipe.encode_dataset",
            )


def _dtype_of(value):
    dt = getattr(value, "dtype", None)  # numpy or torch; python lists are typed by their Arrow schema
    return None if dt is None else str(dt).replace("torch.", "")


def _check_dtypes(r: Any, i: int) -> None:
    """O(columns) per row: values whose dtype would be silently cast into something wrong."""
    if not isinstance(r, dict):
        return
    for name in _INT_COLUMNS:
        dt = _dtype_of(r.get(name))
        if dt is not None and ("float" in dt or "complex" in dt):
            raise InputError(
                f"{name} holds {dt} values; casting them to int64 would silently truncate", row=i, column=name,
                stage="collate",
                expected="an integer dtype", found=dt, fix="store token ids, masks, positions and grids as int64",
            )
    for name in _FLOAT_PIXELS:
        dt = _dtype_of(r.get(name))
        if dt is not None and not ("float" in dt):
            raise PixelDataError(
                f"{name} holds {dt} values, not normalised float pixels", row=i, column=name,
                expected="float32 (the processor's normalised pixel_values)", found=dt,
                fix="store raw uint8 patches in pixel_values_u8, or the processor's float output in pixel_values",
            )
    for name in _U8_PIXELS:
        dt = _dtype_of(r.get(name))
        if dt is not None and dt != "uint8" and ("int" in dt or "float" in dt or "bool" in dt):  # bytes are fine
            raise PixelDataError(
                f"{name} holds {dt} values", row=i, column=name, expected="uint8", found=dt,
                fix="store compact pixels as uint8 (mmpipe.encode does)",
            )


def _check_finite(pv: np.ndarray, offsets: np.ndarray, name: str) -> None:
    """One vectorised pass (a sum: NaN and inf propagate; about a third of the concatenation's
    time); the row is looked for only when the sum is not finite."""
    if not pv.size or np.isfinite(pv.sum()):
        return
    bad = np.flatnonzero(~np.isfinite(pv).all(axis=1))
    if not len(bad):  # finite values whose float32 sum overflowed: not this check's business
        return
    bad_patch = int(bad[0])
    row = int(np.searchsorted(offsets, bad_patch, side="right") - 1)
    raise PixelDataError(
        f"{name} hold NaN or inf (first at patch {bad_patch - int(offsets[row])} of the row)", row=row, column=name,
        expected="finite normalised pixel values", found="NaN/inf",
        fix="re-encode the row from its image (mmpipe.encode pixels='uint8' cannot produce NaN)",
    )


def _as_row_error(e: Exception) -> InputError:
    """A records-level ValueError (its message already says 'row i, column ...') -> typed."""
    msg = str(e)
    cls = PixelDataError if ("pixel" in msg or "grid" in msg or "image tokens" in msg) else InputError
    fix = None if "re-encode" in msg else "re-encode the row with mmpipe.encode"
    return cls(msg, where="", stage="collate", fix=fix)


def _float_images(r: MultiModalInputs, spec: VisionSpec) -> np.ndarray:
    if r.pixel_values is not None:
        return r.pixel_values
    if r.pixel_values_u8 is not None:
        return u8_to_pixel_values(r.pixel_values_u8, spec.lut(), spec.temporal_patch_size)
    return np.zeros((0, r.fam.patch_dim), np.float32)


def _float_videos(r: MultiModalInputs, spec: VisionSpec) -> np.ndarray:
    if r.pixel_values_videos is not None:
        return r.pixel_values_videos
    if r.pixel_values_videos_u8 is not None:
        return u8_video_to_pixel_values(r.pixel_values_videos_u8, spec.lut())
    return np.zeros((0, r.fam.patch_dim), np.float32)


def _arrow_table(rows):
    """The rows as one Arrow table if they came as Arrow (a table, a record batch, or a list
    of one-row tables from ``ArrowRows.__getitem__``), else None."""
    import pyarrow as pa

    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return rows
    if isinstance(rows, (list, tuple)) and isinstance(rows[0], (pa.Table, pa.RecordBatch)):
        return pa.concat_tables([r if isinstance(r, pa.Table) else pa.Table.from_batches([r]) for r in rows])
    return None


class ArrowRows:
    """An encoded ``datasets.Dataset`` as a DataLoader dataset that hands collate Arrow rows.

    ``DataLoader(ArrowRows(enc), batch_size=32, collate_fn=mmpipe.Collator(processor))``
    builds the same batches as ``DataLoader(enc, ...)``, faster: the DataLoader asks for a
    whole batch with ``__getitems__`` and gets one Arrow table, which collate reads through
    numpy views of its column buffers instead of datasets' per-row Python lists (a Python
    int per token, a bytes copy per row). Picklable (for ``num_workers``) like the dataset.
    """

    def __init__(self, dataset):
        self.dataset = dataset.with_format("arrow")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[[int(index)]]

    def __getitems__(self, indices):
        return self.dataset[[int(i) for i in indices]]


def collator_constants(who: str, processor, family, pad_token_id) -> tuple[ModelFamily, VisionSpec, int]:
    """What a collate_fn keeps of a processor: the family, its `VisionSpec` (the processor's
    resize bounds and normalisation) and the pad id (the tokenizer's, else 0). ``family`` and
    ``pad_token_id`` override; one of ``processor`` / ``family`` is required."""
    if processor is None and family is None:
        raise ValueError(f"{who} needs a processor (or family=...) to know the model family")
    fam = family_of(family if family is not None else processor)
    spec = (VisionSpec.from_processor(processor) if (processor is not None and fam.is_vision)
            else VisionSpec.from_family(fam))
    if pad_token_id is None and processor is not None:
        pad_token_id = getattr(getattr(processor, "tokenizer", processor), "pad_token_id", None)
    return fam, spec, 0 if pad_token_id is None else int(pad_token_id)


class Collator:
    """Picklable DataLoader ``collate_fn`` bound to a processor's constants.

    Holds only small derived values (family, `VisionSpec`, pad id), not the processor, so
    it ships cheaply to ``num_workers > 0`` worker processes.
    """

    def __init__(self, processor=None, *, padding_side: str = "left", pad_to_multiple_of: Optional[int] = None,
                 family: Any = None, pad_token_id: Optional[int] = None):
        self.family, self.spec, self.pad_token_id = collator_constants("Collator", processor, family, pad_token_id)
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, rows: Sequence[Any]) -> BatchedMultiModalInputs:
        return collate(
            rows, spec=self.spec, family=self.family, padding_side=self.padding_side,
            pad_to_multiple_of=self.pad_to_multiple_of, pad_token_id=self.pad_token_id,
        )
