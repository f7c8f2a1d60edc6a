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

from mmpipe.batching.checks import arrow_table, check_finite, check_vision_tokens, checked_records
from mmpipe.batching.tiled import other_path_collate, other_path_collator, refuse_packing
from mmpipe.encoding.sources import with_pixels
from mmpipe.encoding.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError, PixelDataError
from mmpipe.families import ModelFamily, family_of, get_family, tiled_family_of
from mmpipe.images.spec import VisionSpec
from mmpipe.images.pixels import u8_to_pixel_values, u8_video_to_pixel_values
from mmpipe.records.columns import IGNORE_INDEX, offsets
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.batch import BatchedMultiModalInputs

logger = logging.getLogger("mmpipe")

PADDING_SIDES = ("left", "right")


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
    vision_tokens: Optional[VisionTokens] = None,
    keep_columns: Sequence[str] = (),
    verify_pixels: bool = False,
) -> BatchedMultiModalInputs:
    """Pad and pack encoded rows into a batch.

    Args:
        rows: encoded rows (``MultiModalInputs`` or dicts as stored by ``mmpipe.encode``).
        processor: optional; supplies the image normalisation constants, the pad token and
            the family the rows must belong to. Without it the family table's defaults are used.
        padding_side: ``"left"`` (generation) or ``"right"``.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        pad_to_length: pad to exactly this length (error if a row is longer).
        vision_tokens: the tokens `check_vision_tokens` looks for; default the processor's,
            else the pads the batch's own image blocks show.
        keep_columns: pass-through columns (``id``, ``data_source``, ``reward_model``, ...)
            carried as ``batch.columns`` (name -> list of B values); a row without one raises.
        verify_pixels: hash each row's stored pixel data and compare with its ``pixel_digest``
            (a `PixelDataError` naming the row when a byte changed on disk; about 10 GB/s).

    Returns a `BatchedMultiModalInputs` with input_ids/attention_mask/mm_token_type_ids
    int64 [B, L], position_ids int64 [3, B, L], pixel_values float32 [sum N, D], image_grid_thw
    int64 [sum I, 3], image_offsets / patch_offsets int64 [B+1].

    Bad rows raise `mmpipe.errors.InputError` subclasses naming the row (index in ``rows``)
    and column, all O(rows) or vectorised checks: pixel data that disagree with the grids or
    the image tokens, NaN/inf in float pixel values, integer pixel values or float token ids,
    rows encoded for another model family (`FamilyMismatchError`), and rows that failed to
    encode under ``on_error="skip"`` (filter them with `mmpipe.drop_failed`), and image /
    video pad tokens at text positions (`mmpipe.batching.checks.check_vision_tokens`: a sampled
    ``<|image_pad|>`` in a response would break the model's image-token count).

    The steps: rows -> checked records (`mmpipe.batching.checks.checked_records`), the batch's family
    (`_batch_family`), token tensors and positions placed under the padding (`_pad_tokens`),
    grids and offsets (`_media_layout`), pixel data in row order (`_pixel_format`,
    `_assemble_pixels`), the batch record (`_batch_record`).
    """
    if padding_side not in PADDING_SIDES:
        raise ArgumentError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if (other := other_path_collate(rows, processor=processor, padding_side=padding_side, keep_columns=keep_columns,
                                    pad_token_id=pad_token_id, pad_to_length=pad_to_length,
                                    pad_to_multiple_of=pad_to_multiple_of)) is not None:  # tiled / generic rows
        return other
    table = arrow_table(rows)  # Arrow rows concatenated once, for the records and the kept columns
    if table is not None:
        rows = table
    recs = checked_records(rows, verify_pixels)
    fam = _batch_family(recs, family, processor)
    if vision_tokens is None and processor is not None:
        vision_tokens = VisionTokens.from_processor(processor, family=fam)
    check_vision_tokens(recs, vision_tokens)
    if spec is None:
        spec = _vision_spec(fam, processor)
    recs = [with_pixels(r, spec, i) for i, r in enumerate(recs)]  # pixels="source" rows: decode + resize here
    if pad_token_id is None:
        pad_token_id = _pad_token_id(processor)
    tokens = _pad_tokens(recs, padding_side, pad_token_id, pad_to_length, pad_to_multiple_of)
    media = _media_layout(recs)
    pixel_format, layout_only = _pixel_format(recs)
    spec = spec.for_rows([r.image_backend if r.has_pixels and r.num_images else None for r in recs])  # images only
    pixels = {} if layout_only else _assemble_pixels(recs, spec, pixel_format, media)
    batch = _batch_record(recs, tokens, media, pixels, padding_side=padding_side, family=fam.name,
                          pixel_format=pixel_format, spec=spec)
    batch.columns = kept_columns(rows, keep_columns)
    return batch


def kept_columns(rows: Sequence[Any], names: Sequence[str]) -> Optional[dict[str, list]]:
    """The pass-through columns ``names`` of ``rows`` (dicts or Arrow), each a list of B values
    in row order; None when ``names`` is empty. A row without one raises `InputError`."""
    if isinstance(names, str):
        raise ArgumentError(f"keep_columns must be a list of column names, got the string {names!r}")
    if not names:
        return None
    table = arrow_table(rows)  # collate passes its table: returned as is, not concatenated again
    if table is not None:
        have = [list(table.column_names)] * table.num_rows
        values = {n: table.column(n).to_pylist() for n in names if n in table.column_names}
    else:
        have = [list(r.keys()) if hasattr(r, "keys") else [] for r in rows]
        values = {n: [r[n] for r in rows] for n in names if all(n in h for h in have)}
    for n in names:
        if n not in values:
            i = next(i for i, h in enumerate(have) if n not in h)
            raise InputError(f"has no column {n!r} to keep", row=i, column=n, stage="collate",
                             expected=f"a {n!r} value in every row", found=f"columns {sorted(have[i])}",
                             fix="keep the column when encoding (encode_dataset(..., keep_columns=[...]) or "
                                 "ds.map without removing it), or drop it from keep_columns")
    return values


def _batch_family(recs: list[MultiModalInputs], family: Any, processor) -> ModelFamily:
    """The family the batch is for (``family``, else the processor's, else the first row's);
    every row must have been encoded for it."""
    want: Optional[ModelFamily] = None
    if family is not None:
        want = family_of(family)
    elif processor is not None:
        want = family_of(processor)
    fam = get_family(recs[0].family) if want is None else want
    for i, r in enumerate(recs):
        if not fam.accepts(r.family):
            raise FamilyMismatchError(
                f"encoded for model family {r.family!r} but this batch is for {fam.name!r}", row=i,
                column="family", expected=repr(fam.name), found=repr(r.family),
                fix="re-encode the dataset with this model's processor (token ids, patch size and "
                    "positions differ between families)",
            )
    return fam


def _vision_spec(fam: ModelFamily, processor) -> VisionSpec:
    """The processor's resize bounds and normalisation, else the family table's defaults
    (a text-only tokenizer has no image processor to read them from)."""
    return VisionSpec.from_processor(processor) if (processor is not None and fam.is_vision) else VisionSpec.from_family(fam)


def _pad_token_id(processor) -> int:
    """The tokenizer's pad id (a processor's tokenizer, or the tokenizer itself), else 0."""
    tok = getattr(processor, "tokenizer", processor)
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    return 0 if pad is None else int(pad)


def _pad_tokens(recs: list[MultiModalInputs], padding_side: str, pad_token_id: int,
                pad_to_length: Optional[int], pad_to_multiple_of: Optional[int]) -> dict[str, Optional[np.ndarray]]:
    """Each row's tokens placed under the padding: input_ids (pad id) / attention_mask /
    mm_token_type_ids / labels (-100; None when no row has labels) int64 [B, L],
    position_ids int64 [3, B, L] (the rows' own positions: M-RoPE does not depend on padding),
    rope_deltas int64 [B, 1], seq_lengths int64 [B], row_has_labels bool [B]."""
    B = len(recs)
    lengths = np.asarray([r.num_tokens for r in recs], dtype=np.int64)
    L = int(lengths.max()) if B else 0
    if pad_to_length is not None:
        if pad_to_length < L:
            row = int(lengths.argmax())
            raise InputError(
                f"row {row} has {L} tokens, more than pad_to_length={pad_to_length}", where="", row=row,
                column="input_ids", stage="collate",
                fix="compute the length from these rows (e.g. DataPacker.policy_compute_max_len)",
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
    return {
        "input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm_types,
        "position_ids": position_ids, "labels": labels, "row_has_labels": row_has_labels,
        "rope_deltas": np.asarray([[r.rope_delta] for r in recs], dtype=np.int64), "seq_lengths": lengths,
    }


def _media_layout(recs: list[MultiModalInputs]) -> dict[str, np.ndarray]:
    """Grids in row order (image_grid_thw / video_grid_thw int64 [sum I, 3],
    second_per_grid_ts float32 [sum V]) and the offsets int64 [B+1] that slice each row's
    images, image patches, videos and video patches back out."""
    return {
        "image_grid_thw": np.concatenate([r.image_grid_thw for r in recs]).reshape(-1, 3).astype(np.int64),
        "video_grid_thw": np.concatenate([r.video_grid_thw for r in recs]).reshape(-1, 3).astype(np.int64),
        "second_per_grid_ts": np.concatenate([r.second_per_grid_ts for r in recs]).astype(np.float32),
        "image_offsets": offsets([r.num_images for r in recs]),
        "patch_offsets": offsets([r.num_image_patches for r in recs]),
        "video_offsets": offsets([r.num_videos for r in recs]),
        "video_patch_offsets": offsets([r.num_video_patches for r in recs]),
    }


def _pixel_format(recs: list[MultiModalInputs]) -> tuple[str, bool]:
    """``(pixel_format, layout_only)``: the rows' shared pixel storage ("uint8", "float32",
    "mixed", or "none" without media) and whether the batch is text-only because its rows
    with images carry no pixel data (layout-only encoding; logged). Rows with and rows
    without pixel data cannot share a batch."""
    formats = {r.pixel_format for r in recs if r.num_images or r.num_videos}
    missing = [i for i, r in enumerate(recs) if (r.num_images or r.num_videos) and not r.has_pixels]
    pixel_format = formats.pop() if len(formats) == 1 else ("mixed" if formats else "none")
    with_pixels = [i for i, r in enumerate(recs) if (r.num_images or r.num_videos) and r.has_pixels]
    if missing and with_pixels:
        # a text-only batch would silently drop the pixels of the other rows (found by fuzzing)
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
        return "none", True
    return pixel_format, False


def _assemble_pixels(recs: list[MultiModalInputs], spec: VisionSpec, pixel_format: str,
                     media: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Pixel data concatenated in row order: pixel_values float32 [sum N, D] (rebuilt from
    compact uint8 rows bit for bit, kept as pixel_values_u8), and the same for videos. Float
    rows are checked for NaN/inf in one vectorised pass."""
    out: dict[str, np.ndarray] = {}
    if media["image_grid_thw"].shape[0]:
        if pixel_format == "uint8":
            pv_u8 = out["pixel_values_u8"] = np.concatenate([r.pixel_values_u8 for r in recs if r.num_images])
            out["pixel_values"] = u8_to_pixel_values(pv_u8, spec.lut(), spec.temporal_patch_size)
        else:
            pv = out["pixel_values"] = np.concatenate([_float_images(r, spec) for r in recs])
            check_finite(pv, media["patch_offsets"], "pixel_values")
    if media["video_grid_thw"].shape[0]:
        if pixel_format == "uint8":
            pvv_u8 = out["pixel_values_videos_u8"] = np.concatenate(
                [r.pixel_values_videos_u8 for r in recs if r.num_videos])
            out["pixel_values_videos"] = u8_video_to_pixel_values(pvv_u8, spec.for_videos().lut())  # videos: torchvision rule
        else:
            pvv = out["pixel_values_videos"] = np.concatenate([_float_videos(r, spec) for r in recs])
            check_finite(pvv, media["video_patch_offsets"], "pixel_values_videos")
    return out


def _batch_record(recs: list[MultiModalInputs], tokens: dict, media: dict, pixels: dict, *, padding_side: str,
                  family: str, pixel_format: str, spec: VisionSpec) -> BatchedMultiModalInputs:
    """The numpy pieces as torch tensors (zero-copy) in a `BatchedMultiModalInputs`."""
    import torch

    t = torch.from_numpy

    def maybe(a: Optional[np.ndarray]):
        return t(a) if a is not None else None

    return BatchedMultiModalInputs(
        input_ids=t(tokens["input_ids"]),
        attention_mask=t(tokens["attention_mask"]),
        mm_token_type_ids=t(tokens["mm_token_type_ids"]),
        position_ids=t(tokens["position_ids"]),
        rope_deltas=t(tokens["rope_deltas"]),
        image_grid_thw=t(media["image_grid_thw"]),
        image_offsets=t(media["image_offsets"]),
        patch_offsets=t(media["patch_offsets"]),
        video_grid_thw=t(media["video_grid_thw"]),
        second_per_grid_ts=t(media["second_per_grid_ts"]),
        video_offsets=t(media["video_offsets"]),
        video_patch_offsets=t(media["video_patch_offsets"]),
        seq_lengths=t(tokens["seq_lengths"]),
        padding_side=padding_side,
        family=family,
        pixel_format=pixel_format,
        labels=maybe(tokens["labels"]),
        row_has_labels=t(tokens["row_has_labels"]),
        row_pixel_formats=[r.pixel_format for r in recs],
        spec=spec,
        pixel_values=maybe(pixels.get("pixel_values")),
        pixel_values_u8=maybe(pixels.get("pixel_values_u8")),
        pixel_values_videos=maybe(pixels.get("pixel_values_videos")),
        pixel_values_videos_u8=maybe(pixels.get("pixel_values_videos_u8")),
    )


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
        return u8_video_to_pixel_values(r.pixel_values_videos_u8, spec.for_videos().lut())
    return np.zeros((0, r.fam.patch_dim), np.float32)


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
        raise ArgumentError(f"{who} needs a processor (or family=...) to know the model family; got neither")
    if tiled_family_of(family if family is not None else processor) is not None:  # no VisionSpec: tiles, not grids
        raise ArgumentError(f"{who} takes the Qwen-VL and text families, not {tiled_family_of(family or processor).name}"
                            " rows: batch them with mmpipe.Collator(processor) (BatchedMultiModalInputs.model_inputs())")
    refuse_packing(who, processor)  # Collator takes the generic path before; PackingCollator cannot
    fam = family_of(family if family is not None else processor)
    return fam, _vision_spec(fam, processor), _pad_token_id(processor) if pad_token_id is None else int(pad_token_id)


class Collator:
    """Picklable DataLoader ``collate_fn`` bound to a processor's constants.

    Holds only small derived values (family, `VisionSpec`, pad id), not the processor, so
    it ships cheaply to ``num_workers > 0`` worker processes. ``keep_columns``: pass-through
    columns each batch carries as ``batch.columns``; ``verify_pixels``: check each row's pixel
    digest (see `collate`).
    """

    def __init__(self, processor=None, *, padding_side: str = "left", pad_to_multiple_of: Optional[int] = None,
                 family: Any = None, pad_token_id: Optional[int] = None, keep_columns: Sequence[str] = (),
                 verify_pixels: bool = False):
        self.generic = other_path_collator(processor, family, pad_token_id, padding_side, pad_to_multiple_of, keep_columns)
        if self.generic is not None:  # a tiled family's processor, or one on the generic path
            return
        self.family, self.spec, self.pad_token_id = collator_constants("Collator", processor, family, pad_token_id)
        kept_columns([], keep_columns)  # a string is refused here, not at the first batch
        self.keep_columns = tuple(keep_columns)
        self.verify_pixels = verify_pixels
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.vision_tokens = None if processor is None else VisionTokens.from_processor(processor, family=self.family)

    def __call__(self, rows: Sequence[Any]) -> BatchedMultiModalInputs:
        return self.generic(rows) if self.generic is not None else collate(
            rows, spec=self.spec, family=self.family, padding_side=self.padding_side,
            pad_to_multiple_of=self.pad_to_multiple_of, pad_token_id=self.pad_token_id,
            vision_tokens=self.vision_tokens, keep_columns=self.keep_columns, verify_pixels=self.verify_pixels,
        )
