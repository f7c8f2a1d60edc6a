"""Collate and unbatch for the tiled families (`mmpipe.families.ModelFamily`): `MultiModalInputs`
rows <-> one padded `BatchedMultiModalInputs`, the compact uint8 tiles expanded here to the processor's
float32 ``pixel_values`` (`mmpipe.images.tiles.normalise_tiles`, bit-exact); ``pixels="source"``
rows' image files are decoded and tiled first (`decoded_rows`: in the DataLoader worker that
builds the batch), bit for bit the tiles a ``"uint8"`` encode stores.

`mmpipe.collate` and `mmpipe.Collator` come here by themselves for tiled rows or processors
(`other_path_collate` / `other_path_collator`, which also route the generic path's rows and
processors to `mmpipe.batching.generic`)::

    >>> batch = mmpipe.Collator(processor)(rows)              # doctest: +SKIP
    >>> model(**batch.model_inputs()).logits                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.checks import arrow_table, check_path_rows
from mmpipe.batching.generic import (
    generic_collate, generic_collator, generic_records, pad_id, pad_sequences, padded_length, refuse_packing,
)
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError, PixelDataError
from mmpipe.families import get_family, tiled_family_of
from mmpipe.images.tiles import effective_image_processor, image_tiles, normalise_table, normalise_tiles, with_images_kwargs
from mmpipe.batching.text import text_fields, text_row_fields
from mmpipe.records.columns import ERROR_COLUMN, offsets, to_numpy
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.kinds import is_tiled_row
from mmpipe.records.row import MultiModalInputs

__all__ = ["collate_tiled", "unbatch_tiled", "tiled_records", "TiledCollator", "other_path_collate",
           "other_path_collator", "processor_table", "refuse_packing", "decoded_rows"]


def processor_table(processor) -> np.ndarray:
    """float32 [3, 256]: the pixel table of ``processor``'s image processor as its call uses it."""
    return normalise_table(effective_image_processor(processor))


def decoded_rows(rows: list[MultiModalInputs], image_processor) -> list[MultiModalInputs]:
    """``pixels="source"`` rows -> the same rows with uint8 tiles (other rows as they are): each
    image file decoded, turned upright and tiled as the ``"uint8"`` encode does
    (`mmpipe.images.tiles.image_tiles`) with ``image_processor`` (`effective_image_processor` of
    the processor that encoded the rows) and the row's own ``images_kwargs``; each image's size
    and tile count checked against the row's."""
    if not any(r.image_sources is not None for r in rows):
        return rows
    if image_processor is None:
        raise ArgumentError("collating pixels='source' tiled rows needs the processor (their files are tiled here): "
                            "mmpipe.collate(rows, processor=processor) or mmpipe.Collator(processor)")
    own, out = getattr(image_processor, "backend", "pil"), []
    for i, r in enumerate(rows):
        if r.image_sources is None:
            out.append(r)
            continue
        if r.image_backend != own:
            raise InputError(f"the row was encoded for the {r.image_backend} image backend, collated with a {own} "
                             "image processor", row=i, column="image_backend", stage="collate",
                             expected=repr(own), found=repr(r.image_backend),
                             fix="collate with the processor (image backend) the rows were encoded with")
        ip, module = with_images_kwargs(image_processor, r.images_kwargs), get_family(r.family).images()
        blocks = []
        for k, data in enumerate(r.image_sources):
            hw, tiles = image_tiles({"bytes": bytes(data), "path": None}, ip, module, where=f"row {i}, image {k}")
            want = (tuple(int(x) for x in r.image_hw[k]), int(r.tiles_per_image[k]))
            if (hw, len(tiles)) != want:
                raise PixelDataError(f"image {k}'s file decodes to size {hw} in {len(tiles)} tile(s) but the row "
                                     f"stores {want[0]} in {want[1]}", row=i, column="image_sources",
                                     stage="collate", expected=str(want), found=str((hw, len(tiles))),
                                     fix="collate with the processor (and its settings) the rows were encoded with")
            blocks.append(tiles)
        if not blocks:  # no images: an empty block of this processor's tile size
            from PIL import Image

            blocks = [module.tiles_u8(Image.new("RGB", (8, 8)), ip)[:0]]
        out.append(dataclasses.replace(r, image_sources=None, pixel_values_u8=np.concatenate(blocks)))
    return out


def _pixels(rows: list[MultiModalInputs], table: Optional[np.ndarray], fam) -> tuple:
    """(uint8 tiles [N, S, S, 3], float32 pixel_values in the family's layout), or (None, None)
    for layout-only rows."""
    with_pixels = [r.has_pixels for r in rows]
    if not any(with_pixels):
        return None, None
    if not all(with_pixels):
        i = with_pixels.index(False)
        raise InputError("a layout-only row (no pixels) in a batch of rows with pixels", row=i,
                         column="pixel_values_u8", stage="collate", fix="encode every row with the same pixels= option")
    shapes = {r.pixel_values_u8.shape[1:] for r in rows if r.num_images}
    if len(shapes) > 1:
        raise InputError(f"tiles of different sizes in one batch: {sorted(shapes)}", row=0, column="pixel_values_u8",
                         stage="collate", fix="encode every row with the same processor")
    u8 = np.concatenate([r.pixel_values_u8 for r in rows])
    if not len(u8):
        return u8, np.zeros((0, 3, *u8.shape[1:3]), np.float32)
    if table is None:
        raise ArgumentError("collating tiled rows with pixels needs the processor (its normalisation): "
                            "mmpipe.collate(rows, processor=processor) or mmpipe.Collator(processor)")
    pv = normalise_tiles(u8, table)
    reshape = getattr(fam.images(), "batch_pixel_values", None)
    tiles = np.concatenate([r.tiles_per_image for r in rows])
    return u8, (reshape(pv, tiles) if reshape is not None else pv)


def collate_tiled(rows: list[MultiModalInputs], *, table: Optional[np.ndarray] = None, pad_token_id: int = 0,
                  padding_side: str = "right", pad_to_length: Optional[int] = None,
                  pad_to_multiple_of: Optional[int] = None, image_processor=None) -> BatchedMultiModalInputs:
    """`MultiModalInputs` rows of one family -> a padded `BatchedMultiModalInputs` (see its doc for the shapes).

    ``table``: float32 [3, 256] (`processor_table`), needed when the rows hold pixels;
    ``image_processor`` (`effective_image_processor`), needed for ``pixels="source"`` rows
    (`decoded_rows`; the batch then holds their tiles). Positions
    are ``0..n-1`` over each row's own tokens (pads 0), so either padding side gives the rows'
    own positions; token types pad with 0, labels with -100.
    """
    if not rows:
        raise ArgumentError("collate_tiled needs at least one row")
    if padding_side not in ("left", "right"):
        raise ArgumentError(f"padding_side must be 'left' or 'right', found {padding_side!r}")
    rows = decoded_rows(list(rows), image_processor)
    fam = get_family(rows[0].family)
    for i, r in enumerate(rows):
        if not fam.accepts(r.family):
            raise FamilyMismatchError("rows of different model families in one batch", row=i, column="family",
                                      expected=repr(rows[0].family), found=repr(r.family),
                                      fix="batch rows encoded by one processor")
    lengths = np.array([len(r) for r in rows], np.int64)
    L = padded_length(lengths, pad_to_length, pad_to_multiple_of)
    u8, pv = _pixels(rows, table, fam)
    image_hw = np.concatenate([r.image_hw for r in rows]).astype(np.int64).reshape(-1, 2)
    tiles = np.concatenate([r.tiles_per_image for r in rows]).astype(np.int64)
    extra = getattr(fam.images(), "extra_inputs", None)
    def tensor(a):  # numpy fields, as the 1-D kinds' batches keep them (model_inputs makes torch)
        return a

    return BatchedMultiModalInputs(
        **text_fields(rows, L, pad_token_id, padding_side), family=fam.name, padding_side=padding_side,
        pixel_format="uint8" if u8 is not None else "none", image_hw=tensor(image_hw), tiles_per_image=tensor(tiles),
        patch_offsets=tensor(offsets([int(r.tiles_per_image.sum()) for r in rows])),
        pixel_values_u8=None if u8 is None else tensor(u8), pixel_values=None if pv is None else tensor(pv),
        extras={k: tensor(np.asarray(v)) for k, v in extra(image_hw).items()} if extra is not None and len(image_hw)
        else {})


def unbatch_tiled(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """A tiles-kind batch -> its rows, exactly as collated (``unbatch_tiled(collate_tiled(rows))``
    equals ``rows``)."""
    io, to = to_numpy(batch.image_offsets).tolist(), to_numpy(batch.patch_offsets).tolist()
    hw, tiles = to_numpy(batch.image_hw), to_numpy(batch.tiles_per_image)
    u8 = to_numpy(batch.pixel_values_u8) if batch.pixel_values_u8 is not None else None
    return [MultiModalInputs(family=batch.family, image_hw=hw[io[b]:io[b + 1]].copy(),
                             tiles_per_image=tiles[io[b]:io[b + 1]].copy(),
                             pixel_values_u8=None if u8 is None else u8[to[b]:to[b + 1]].copy(), **text)
            for b, text in enumerate(text_row_fields(batch))]


# ---- the dispatch from mmpipe.collate / mmpipe.Collator ----------------------------------------
def tiled_records(rows: Any) -> Optional[list[MultiModalInputs]]:
    """``rows`` as `MultiModalInputs` when they are a tiled family's (records, stored dicts or Arrow),
    else None. A batch mixing them with other rows, or holding a row that failed under
    ``on_error="skip"``, raises `InputError`."""
    table = arrow_table(rows)
    if table is not None:
        if "family" not in table.column_names or not table.num_rows:
            return None
        flags = [is_tiled_row({"family": f}) for f in table.column("family").to_pylist()]
        errors = table.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in table.column_names else [None] * len(flags)
    else:
        if not len(rows):
            return None
        flags = [is_tiled_row(r) for r in rows]
        errors = [r.get(ERROR_COLUMN) if isinstance(r, dict) else None for r in rows]
    if not any(flags):
        return None
    check_path_rows(flags, errors, "tiled-family", "a row of another family")
    if table is not None:
        return rows_from_arrow(table)
    return [r if isinstance(r, MultiModalInputs) else MultiModalInputs.from_dict(r, i) for i, r in enumerate(rows)]


def _kept(rows: Any, names: Sequence[str]) -> Optional[dict]:
    if isinstance(names, str):
        raise ArgumentError(f"keep_columns must be a list of column names, got the string {names!r}")
    if not names:
        return None
    table = arrow_table(rows)
    source = table.to_pylist() if table is not None else rows
    for n in names:
        for i, r in enumerate(source):
            if not hasattr(r, "keys") or n not in r:
                raise InputError(f"has no column {n!r} to keep", row=i, column=n, stage="collate",
                                 fix="keep the column when encoding, or drop it from keep_columns")
    return {n: [r[n] for r in source] for n in names}


class TiledCollator:
    """`mmpipe.Collator` for a tiled family's processor: picklable, holds the family name, the
    pixel table float32 [3, 256] and the pad id only."""

    def __init__(self, family: str, table: np.ndarray, pad_token_id: int, *, padding_side: str = "left",
                 pad_to_multiple_of: Optional[int] = None, keep_columns: Sequence[str] = (), image_processor=None):
        _kept([], keep_columns)  # a string is refused here, not at the first batch
        self.family, self.table, self.pad_token_id = family, table, pad_token_id
        self.image_processor = image_processor  # pixels="source" rows are tiled with it (decoded_rows)
        self.padding_side, self.pad_to_multiple_of, self.keep_columns = padding_side, pad_to_multiple_of, tuple(keep_columns)

    def __call__(self, rows: Sequence[Any]) -> BatchedMultiModalInputs:
        records = tiled_records(rows)
        if records is None and (generic := generic_records(rows)) is not None:  # GenericEncoder taken explicitly
            return generic_collate(generic, rows, padding_side=self.padding_side, pad_token_id=self.pad_token_id,
                                   pad_to_multiple_of=self.pad_to_multiple_of, keep_columns=self.keep_columns)
        if records is None:
            raise FamilyMismatchError(f"rows not encoded for {self.family!r}", row=0, column="family",
                                      expected=repr(self.family), found="rows of another family",
                                      fix="encode the dataset with this processor (mmpipe.encode)")
        _check_family(records, self.family)
        batch = collate_tiled(records, table=self.table, pad_token_id=self.pad_token_id, padding_side=self.padding_side,
                              pad_to_multiple_of=self.pad_to_multiple_of, image_processor=self.image_processor)
        batch.columns = _kept(rows, self.keep_columns)
        return batch


def _check_family(records: list[MultiModalInputs], family: str) -> None:
    for i, r in enumerate(records):
        if not get_family(family).accepts(r.family):
            raise FamilyMismatchError(f"encoded for model family {r.family!r} but this batch is for {family!r}",
                                      row=i, column="family", expected=repr(family), found=repr(r.family),
                                      fix="re-encode the dataset with this model's processor")


def other_path_collate(rows: Any, *, processor=None, padding_side: str, keep_columns: Sequence[str] = (),
                       pad_token_id: Optional[int] = None, pad_to_length: Optional[int] = None,
                       pad_to_multiple_of: Optional[int] = None):
    """`mmpipe.collate` for rows that are not a table family's: a `BatchedMultiModalInputs` for tiled rows, a
    `BatchedMultiModalInputs` for the generic path's; None for native (Qwen / text) rows."""
    if (generic := generic_records(rows)) is not None:
        return generic_collate(generic, rows, processor=processor, padding_side=padding_side, keep_columns=keep_columns,
                               pad_token_id=pad_token_id, pad_to_length=pad_to_length, pad_to_multiple_of=pad_to_multiple_of)
    records = tiled_records(rows)
    if records is None:
        return None
    table = image_processor = None
    if processor is not None:
        fam = tiled_family_of(processor)
        if fam is None:
            raise FamilyMismatchError(f"rows of {records[0].family!r} collated with another family's processor", row=0,
                                      column="family", expected=repr(records[0].family), found=type(processor).__name__,
                                      fix="collate with the processor that encoded the rows")
        _check_family(records, fam.name)
        table = processor_table(processor) if any(r.has_pixels and r.num_images for r in records) else None
        if any(r.image_sources is not None for r in records):
            image_processor = effective_image_processor(processor)
    batch = collate_tiled(records, table=table, pad_token_id=pad_id(processor, pad_token_id), padding_side=padding_side,
                          pad_to_length=pad_to_length, pad_to_multiple_of=pad_to_multiple_of,
                          image_processor=image_processor)
    batch.columns = _kept(rows, keep_columns)
    return batch


def other_path_collator(processor, family, pad_token_id: Optional[int], padding_side: str,
                        pad_to_multiple_of: Optional[int], keep_columns: Sequence[str]):
    """`mmpipe.Collator`'s twin for a tiled family's processor (`TiledCollator`) or one on the
    generic path (`GenericCollator`); None for a table family's."""
    fam = tiled_family_of(family if family is not None else processor)
    if fam is None:
        return generic_collator(processor, family, pad_token_id, padding_side, pad_to_multiple_of, keep_columns)
    if processor is None:
        raise ArgumentError(f"Collator for {fam.name!r} needs the processor (its pixel normalisation)")
    return TiledCollator(fam.name, processor_table(processor), pad_id(processor, pad_token_id),
                         padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of, keep_columns=keep_columns,
                         image_processor=effective_image_processor(processor))
