"""Encoded rows -> one padded `BatchedMultiModalInputs` (a DataLoader ``collate_fn``), for every
family.

Rows may hold any number of images (zero included) and come as ``MultiModalInputs``, plain
python dicts (``datasets`` rows), numpy/torch formatted rows or Arrow (`ArrowRows`). The steps
are the same for every kind of family: the rows read and checked
(`mmpipe.batching.checks.checked_records`), the batch's family (`batch_family`), the padded
length and the text part placed under the padding (`mmpipe.batching.text`), pass-through
columns (`kept_columns`). What differs between patch grids, tiles and the generic path's
processor outputs is asked of the family's media strategy (``fam.media``, `mmpipe.media`):
``MEDIA_ITEMS`` (its per-item layout fields, concatenated with their offsets by
`mmpipe.batching.media_fields`), ``collator_state`` (what a collate_fn keeps of the processor),
``collate_media`` (pixels in row order; compact uint8 rows become the processor's float32
``pixel_values`` here, bit for bit).

Example::

    loader = DataLoader(enc, batch_size=8, collate_fn=mmpipe.Collator(processor), num_workers=2)
    batch = next(iter(loader))
    out = model(**batch.model_inputs())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe._fork import torch_fork_safe
from mmpipe.batching.checks import carries_pixels, checked_records
from mmpipe.batching.media_fields import collate_layout
from mmpipe.batching.pack_batch import refuse_packing
from mmpipe.batching.row_inputs import arrow_table, row_dicts
from mmpipe.batching.text import packed_text, pad_id, padded_length, text_fields
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.families import ModelFamily, get_family, processor_class_name, resolve_family
from mmpipe.images.spec import VisionSpec
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.vision_tokens import VisionTokens

PADDING_SIDES = ("left", "right")


@dataclass(frozen=True)
class CollateContext:
    """What a strategy's ``collate_media`` is told about the batch being built: its family, the
    collator state (``fam.media.collator_state``), the padding side, the padded length L, the
    batch's layout fields and offsets (`mmpipe.batching.media_fields.collate_layout`) and whether
    its rows carry pixels (False: layout-only rows collated with ``allow_layout_only=True``, a
    text-only batch; `carries_pixels`)."""

    fam: ModelFamily
    state: dict
    padding_side: str
    length: int
    layout: dict
    pixels: bool = True


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
    pixels_on_device: bool = False,
    allow_layout_only: bool = False,
) -> BatchedMultiModalInputs:
    """Pad and pack encoded rows of one family into a batch.

    Args:
        rows: encoded rows (``MultiModalInputs``, dicts as stored by ``mmpipe.encode``, Arrow).
        processor: optional; supplies the image normalisation, the pad token and the family the
            rows must belong to. Without it the family table's defaults are used (tiled rows with
            pixels need it: their normalisation is the processor's).
        family: the family the rows must belong to (default the processor's, else the rows').
        spec, vision_tokens: patch-grid families: the `VisionSpec` to expand pixels with and the
            tokens `check_vision_tokens` looks for (default the processor's, else the family
            table's spec and the pads the batch's own image blocks show).
        padding_side: ``"left"`` (generation) or ``"right"``.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        pad_to_length: pad to exactly this length (error if a row is longer).
        keep_columns: pass-through columns (``id``, ``data_source``, ``reward_model``, ...)
            carried as ``batch.columns`` (name -> list of B values); a row without one raises.
        verify_pixels: hash each row's stored pixel data and compare with its ``pixel_digest``
            (a `PixelDataError` naming the row when a byte changed on disk; about 10 GB/s).
        pixels_on_device: patch-grid families: keep the rows' compact uint8 pixels in the batch
            (``pixel_values`` None) and let ``batch.model_inputs(device)`` expand them on that
            device, bit for bit (`mmpipe.images.pixels.u8_to_pixel_values_torch`): the DataLoader
            workers only gather bytes and 1/8 of the float32 bytes cross to the GPU.
        allow_layout_only: collate rows that hold image / video tokens but no pixel data
            (layout-only rows, ``pixels="none"``) into a text-only batch without pixel inputs,
            on purpose (ids without pixels: token statistics, packing plans; a model given it
            does not see those images). Default False: such rows raise `PixelDataError` naming
            the row (re-encode with ``pixels="uint8"`` or ``"source"`` to train on them).
            Text-only rows (no image tokens) collate either way.

    Returns a `BatchedMultiModalInputs`: input_ids / attention_mask / mm_token_type_ids int64
    [B, L], position_ids int64 [3, B, L] (patch grids) or [B, L], image_offsets int64 [B+1],
    and the kind's media fields (patch grids: pixel_values float32 [sum N, D], image_grid_thw
    int64 [sum I, 3]; tiles: image_hw, tiles_per_image, pixel_values; the generic path: the
    processor's outputs in ``vision``). Patch-grid batches hold torch tensors, the others numpy.

    Bad rows raise `mmpipe.errors.InputError` subclasses naming the row (index in ``rows``)
    and column: pixel data that disagree with the layout or the image tokens, NaN/inf in float
    pixel values, integer pixel values or float token ids, rows encoded for another model
    family or processor (`FamilyMismatchError`), rows of another kind of family, rows that
    failed to encode under ``on_error="skip"`` (filter them with `mmpipe.drop_failed`), rows
    with images or videos but no pixel data (`PixelDataError`, see ``allow_layout_only``), and
    image / video pad tokens at text positions (`mmpipe.batching.checks.check_vision_tokens`).
    """
    check_padding_side(padding_side)
    table = arrow_table(rows)  # Arrow rows concatenated once, for the records and the kept columns
    rows = table if table is not None else row_dicts(rows)  # pandas-format rows as dicts, once
    given = None if family is None and processor is None else \
        resolve_family(family if family is not None else processor)
    recs = checked_records(rows, verify_pixels, None if given is None else given.name)
    fam, state = batch_state(recs, family, processor, spec=spec, vision_tokens=vision_tokens)
    state = device_pixels_state(fam, state, pixels_on_device)
    batch = collate_records(recs, fam, state, padding_side=padding_side, pad_token_id=pad_id(processor, pad_token_id),
                            pad_to_length=pad_to_length, pad_to_multiple_of=pad_to_multiple_of,
                            allow_layout_only=allow_layout_only)
    batch.columns = kept_columns(rows, keep_columns)
    return batch


def device_pixels_state(fam: ModelFamily, state: dict, on_device: bool) -> dict:
    """``state`` with ``pixels_on_device`` set when asked for; `ArgumentError` for a kind whose
    batches cannot keep compact pixels (``fam.media.DEVICE_PIXELS``)."""
    if not on_device:
        return state
    if not fam.media.DEVICE_PIXELS:
        raise ArgumentError(f"pixels_on_device=True is for the patch-grid families (Qwen-VL, GLM-4.xV); {fam.name} "
                            "batches expand their pixels at collate: leave it out")
    return {**state, "pixels_on_device": True}


def check_padding_side(padding_side: str) -> None:
    """`ArgumentError` unless ``padding_side`` is one of `PADDING_SIDES`."""
    if padding_side not in PADDING_SIDES:
        raise ArgumentError(f"padding_side must be 'left' or 'right', got {padding_side!r}")


def collate_records(recs: list[MultiModalInputs], fam: ModelFamily, state: dict, *, padding_side: str,
                    pad_token_id: int, pad_to_length: Optional[int] = None,
                    pad_to_multiple_of: Optional[int] = None,
                    allow_layout_only: bool = False) -> BatchedMultiModalInputs:
    """Checked records of ``fam`` -> the batch: the text part placed under the padding
    (`mmpipe.batching.text.text_fields`), the layout of the kind's media items
    (``fam.media.MEDIA_ITEMS``, `collate_layout`), the rest of the media fields from
    ``fam.media.collate_media`` (``state``: ``fam.media.collator_state``). Rows with images or
    videos but no pixel data raise unless ``allow_layout_only`` (`carries_pixels`)."""
    L = padded_length(np.array([len(r) for r in recs], np.int64), pad_to_length, pad_to_multiple_of)
    media = _media_fields(recs, fam, state, padding_side, L, allow_layout_only)
    text = text_fields(recs, L, pad_token_id, padding_side)
    batch = BatchedMultiModalInputs(**{**text, **media}, family=fam.name, padding_side=padding_side)
    return batch.as_torch() if fam.media.BATCH_ARRAYS == "torch" else batch


def collate_packed(recs: list[MultiModalInputs], fam: ModelFamily, state: dict, *,
                   allow_layout_only: bool = False) -> tuple[BatchedMultiModalInputs, dict]:
    """Checked records of ``fam`` -> what a pack is built from, without padding the tokens:
    ``(meta, flat)``: ``meta`` the right-padded batch's fields (torch) with its token fields
    zero-width ([B, 0]: media, layout, offsets, lengths, rope deltas as `collate_records` gives
    them), ``flat`` the rows' tokens end to end (`mmpipe.batching.text.packed_text`)."""
    L = padded_length(np.array([len(r) for r in recs], np.int64), None, None)
    media = _media_fields(recs, fam, state, "right", L, allow_layout_only)
    text, flat = packed_text(recs, L)
    return BatchedMultiModalInputs(**{**text, **media}, family=fam.name, padding_side="right").as_torch(), flat


def _media_fields(recs: list[MultiModalInputs], fam: ModelFamily, state: dict, padding_side: str, L: int,
                  allow_layout_only: bool) -> dict:
    """The batch's media fields: the empty defaults, the layout of the kind's media items
    (`collate_layout`) and ``fam.media.collate_media``'s fields."""
    layout = collate_layout(recs, fam.media.MEDIA_ITEMS)
    media = fam.media.collate_media(recs, CollateContext(fam, state, padding_side, L, layout,
                                                        carries_pixels(recs, allow_layout_only)))
    return {**_no_media(len(recs)), **layout, **media}


def _no_media(B: int) -> dict[str, np.ndarray]:
    """The media fields every batch has, empty (a kind's layout and ``collate_media`` fill its
    own): no grids or videos, zero offsets int64 [B+1]."""
    empty3, zeros = np.zeros((0, 3), np.int64), np.zeros(B + 1, np.int64)
    return dict(image_grid_thw=empty3, video_grid_thw=empty3, second_per_grid_ts=np.zeros(0, np.float32),
                image_offsets=zeros, patch_offsets=zeros, video_offsets=zeros, video_patch_offsets=zeros)


def batch_state(recs: list[MultiModalInputs], family: Any = None, processor=None,
                **overrides: Any) -> tuple[ModelFamily, dict]:
    """The batch's family (`batch_family`: ``family``, else the processor's, else the first
    row's) and its strategy's collator state for ``processor`` (``fam.media.collator_state``),
    with the ``overrides`` that are not None (collate's ``spec`` / ``vision_tokens``)."""
    given = None if family is None and processor is None else resolve_family(
        family if family is not None else processor)
    fam = batch_family(recs, given, None if processor is None else processor_class_name(processor))
    state = fam.media.collator_state(processor, fam)
    return fam, {**state, **{k: v for k, v in overrides.items() if v is not None}}


def batch_family(recs: list[MultiModalInputs], fam: Optional[ModelFamily] = None,
                 processor_class: Optional[str] = None) -> ModelFamily:
    """The family the batch is for: ``fam``, else the first row's. Rows that name the processor
    class that encoded them (the generic path, which a processor of any family can take:
    ``Encoder(processor, family="generic")``) are that processor's (``processor_class``) whatever
    its own family. Every row must have been encoded for it (`FamilyMismatchError` naming the row)."""
    own = recs[0].processor_class
    if fam is None or (own is not None and own == processor_class):
        fam = get_family(recs[0].family)
    for i, r in enumerate(recs):
        if not fam.accepts(r.family):
            # the generic path's rows are told apart by the processor class that encoded them
            by = f"by {r.processor_class} (the generic path)" if r.processor_class else f"for model family {r.family!r}"
            raise FamilyMismatchError(
                f"encoded {by} but this batch is for {fam.name!r}", row=i, column="family",
                expected=repr(fam.name), found=repr(r.family),
                fix="re-encode the dataset with this model's processor (token ids, patch size and "
                    "positions differ between families)",
            )
    return fam


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


def collator_family(who: str, processor, family, *, packing: bool = False) -> tuple[ModelFamily, dict]:
    """What a collate_fn keeps of a processor: the family (``family`` overrides) and its
    strategy's collator state (`mmpipe.media`). One of ``processor`` / ``family`` is required,
    and the processor when the kind cannot do without it (``COLLATOR_NEEDS_PROCESSOR``);
    ``packing``: a family whose model does not take packed rows is refused first, with the reason."""
    if processor is None and family is None:
        raise ArgumentError(f"{who} needs a processor (or family=...) to know the model family; got neither")
    fam = resolve_family(family if family is not None else processor)
    state = fam.media.collator_state(processor, fam)
    if packing:
        refuse_packing(who, fam, state.get("processor_class"))
    needs = fam.media.COLLATOR_NEEDS_PROCESSOR
    if processor is None and needs:
        raise ArgumentError(f"{who} for {fam.name!r} needs the processor ({needs})")
    return fam, state


def collator_constants(who: str, processor, family, pad_token_id) -> tuple[ModelFamily, VisionSpec, int]:
    """The family, its `VisionSpec` (the processor's resize bounds and normalisation) and the
    pad id (the tokenizer's, else 0) of a patch-grid family's processor, for a host that builds
    patch-grid batches itself (verl). ``family`` and ``pad_token_id`` override."""
    if processor is None and family is None:
        raise ArgumentError(f"{who} needs a processor (or family=...) to know the model family; got neither")
    fam = resolve_family(family if family is not None else processor)
    state = fam.media.collator_state(processor, fam)
    if "spec" not in state:  # the tiles and processor kinds have no VisionSpec
        raise ArgumentError(f"{who} takes the Qwen-VL and text families, not {fam.name} rows: batch them with "
                            "mmpipe.Collator(processor) (BatchedMultiModalInputs.model_inputs())")
    return fam, state["spec"], pad_id(processor, pad_token_id)


class Collator:
    """Picklable DataLoader ``collate_fn`` bound to a processor's constants, for every family.

    Holds only small derived values (the family, its strategy's collator state: the
    `VisionSpec` of a patch-grid family, a tiled family's pixel table, the generic path's
    processor class; the pad id), not the processor (but on the generic path, whose rows stored with
    ``audio="source"`` need its audio call), so it ships cheaply to ``num_workers > 0`` worker
    processes. ``keep_columns``: pass-through columns each batch carries as ``batch.columns``;
    ``verify_pixels``: check each row's pixel digest; ``pixels_on_device``: batches keep uint8
    pixels that ``model_inputs(device)`` expands there; ``allow_layout_only``: collate rows with
    images but no pixel data (``pixels="none"``) into text-only batches on purpose (see `collate`;
    refused by default).
    """

    def __init__(self, processor=None, *, padding_side: str = "left", pad_to_multiple_of: Optional[int] = None,
                 family: Any = None, pad_token_id: Optional[int] = None, keep_columns: Sequence[str] = (),
                 verify_pixels: bool = False, pixels_on_device: bool = False, allow_layout_only: bool = False):
        self.family, self.state = collator_family("Collator", processor, family)
        self.state = device_pixels_state(self.family, self.state, pixels_on_device)
        self.processor_class = None if processor is None else processor_class_name(processor)
        self.pad_token_id = pad_id(processor, pad_token_id)
        kept_columns([], keep_columns)  # a string is refused here, not at the first batch
        self.keep_columns = tuple(keep_columns)
        self.verify_pixels = verify_pixels
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.allow_layout_only = bool(allow_layout_only)

    @property
    def spec(self) -> Optional[VisionSpec]:
        """The `VisionSpec` pixels are expanded with (patch-grid families; None otherwise)."""
        return self.state.get("spec")

    def __call__(self, rows: Sequence[Any]) -> BatchedMultiModalInputs:
        torch_fork_safe()  # a user's forked Pool after a parallel torch op: torch's ops deadlock otherwise
        check_padding_side(self.padding_side)
        table = arrow_table(rows)
        rows = table if table is not None else row_dicts(rows)  # pandas-format rows as dicts, once
        recs = checked_records(rows, self.verify_pixels, self.family.name)
        fam = batch_family(recs, self.family, self.processor_class)
        state = self.state if fam.name == self.family.name else fam.media.collator_state(None, fam)  # see batch_family
        batch = collate_records(recs, fam, state, padding_side=self.padding_side, pad_token_id=self.pad_token_id,
                                pad_to_multiple_of=self.pad_to_multiple_of,
                                allow_layout_only=getattr(self, "allow_layout_only", False))
        batch.columns = kept_columns(rows, self.keep_columns)
        return batch
