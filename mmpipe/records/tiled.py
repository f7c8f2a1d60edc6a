"""Records of the tiled families (`mmpipe.families.TiledFamily`: Gemma 3, InternVL,
LLaVA-OneVision): `TiledInputs` (one row) and `TiledBatch` (a padded batch).

A row keeps its images as compact uint8 tiles (``pixel_values_u8`` uint8 [N, S, S, 3], the
resized tiles before the processor's per-pixel normalisation; 1/4 of the float32 bytes) or,
layout-only, no pixels at all; collate expands the tiles to the processor's float32
``pixel_values`` [N, 3, S, S] (`mmpipe.batching.tiled`). Positions are 1-D (``0..L-1``).

Stored (``dataset.map(mmpipe.encode, ...)``), a row is `TiledInputs.to_dict`: ``input_ids``
int32 [L], ``attention_mask`` int8 [L], ``labels`` int32 [L] (with labels),
``mm_token_type_ids`` int32 [L] (1 at the family's feature tokens), ``image_hw`` int64 [2*I]
(each image's upright (height, width), flat), ``tiles_per_image`` int64 [I], ``family``; with
pixels also ``pixel_values_u8`` uint8 [N*S*S*3] (flat), ``tile_hw`` int64 [2] (S, S) and
``pixel_digest`` int64 (xxh3-64 of the tile bytes, checked when a row is read back); with
``pixels="source"`` instead ``image_sources`` list<binary> [I] (each image's encoded file, as the
Qwen rows' source mode stores it: `mmpipe.encoding.sources`), ``pixel_digest`` int64 (of the
sources) and, for a torchvision-backend processor, ``image_backend``; rows encoded with
``images_kwargs`` (e.g. Gemma 3 pan-and-scan) also ``images_kwargs`` (JSON string).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import json

import numpy as np

from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.families import TILED_FAMILIES, TiledFamily, get_family
from mmpipe.records.columns import IGNORE_INDEX, as_array, pixel_digest, source_list, sources_digest
from mmpipe.records.display_hooks import render

__all__ = ["TiledInputs", "TiledBatch", "is_tiled_row", "tiled_rows_from_arrow", "TILED_COLUMNS"]

# the stored columns of a tiled row (pixels: the last two)
TILED_COLUMNS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "image_hw", "tiles_per_image",
                 "family", "pixel_values_u8", "tile_hw", "image_sources", "pixel_digest", "image_backend",
                 "images_kwargs")


def is_tiled_row(row: Any) -> bool:
    """Whether a stored row (dict) or record is a tiled family's."""
    if isinstance(row, TiledInputs):
        return True
    return hasattr(row, "get") and isinstance(row.get("family"), str) and row.get("family") in TILED_FAMILIES


def _same(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
    return (a is None) == (b is None) and (a is None or (a.shape == b.shape and a.dtype == b.dtype
                                                         and np.array_equal(a, b)))


@dataclass(eq=False)
class TiledInputs:
    """One row of a tiled family.

    Attributes (L tokens, I images, N tiles):
        family:            the `TiledFamily` name.
        input_ids:         int64 [L], each image placeholder expanded to the family's text.
        attention_mask:    int64 [L] (all ones).
        mm_token_type_ids: int64 [L], 1 at the family's feature tokens, else 0.
        image_hw:          int64 [I, 2], each image's upright (height, width).
        tiles_per_image:   int64 [I].
        pixel_values_u8:   uint8 [N, S, S, 3] (N = tiles_per_image.sum()), or None (layout-only).
        labels:            optional int64 [L], -100 where not trained.
        image_sources:     ``pixels="source"``: each image's encoded file (bytes [I]); collate
                           decodes and tiles them (`mmpipe.batching.tiled`). None otherwise.
        images_kwargs:     the encoder's ``images_kwargs`` (None: the processor's defaults).
        image_backend:     the image processor backend the tiles reproduce (``"pil"`` / ``"torchvision"``).
    """

    family: str
    input_ids: np.ndarray
    attention_mask: np.ndarray
    mm_token_type_ids: np.ndarray
    image_hw: np.ndarray
    tiles_per_image: np.ndarray
    pixel_values_u8: Optional[np.ndarray] = None
    labels: Optional[np.ndarray] = None
    image_sources: Optional[list] = None
    images_kwargs: Optional[dict] = None
    image_backend: str = "pil"

    def __len__(self) -> int:
        return len(self.input_ids)

    def _repr_html_(self) -> str:
        """Jupyter display (`mmpipe.view`, found through `mmpipe.records.display_hooks`)."""
        return render("row_html", self)

    def describe(self, *, tokenizer: Any = None) -> str:
        """Plain-text description for terminals (`mmpipe.view.describe`)."""
        return render("describe", self, tokenizer=tokenizer)

    @property
    def num_images(self) -> int:
        return len(self.tiles_per_image)

    @property
    def has_pixels(self) -> bool:
        """Stored tiles or stored source files (collate decodes those)."""
        return self.pixel_values_u8 is not None or self.image_sources is not None

    @property
    def position_ids(self) -> np.ndarray:
        """int64 [L]: ``0..L-1``."""
        return np.arange(len(self.input_ids), dtype=np.int64)

    def validate(self, row: Any = None) -> "TiledInputs":
        """Lengths line up, the tiles match ``tiles_per_image``, the family is tiled."""
        def bad(column, expected, found, fix="re-encode the row with mmpipe.encode"):
            return InputError(f"{column} does not match the row", row=row, column=column, stage="validate",
                              expected=expected, found=found, fix=fix)

        if self.family not in TILED_FAMILIES:
            raise bad("family", f"one of {sorted(TILED_FAMILIES)}", repr(self.family))
        n = len(self.input_ids)
        for name in ("attention_mask", "mm_token_type_ids", "labels"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (n,):
                raise bad(name, f"shape ({n},)", f"shape {arr.shape}")
        if self.image_hw.shape != (self.num_images, 2):
            raise bad("image_hw", f"shape ({self.num_images}, 2)", f"shape {self.image_hw.shape}")
        u8 = self.pixel_values_u8
        if u8 is not None and (u8.ndim != 4 or u8.shape[0] != int(self.tiles_per_image.sum()) or u8.shape[3] != 3):
            raise bad("pixel_values_u8", f"[{int(self.tiles_per_image.sum())}, S, S, 3]", f"shape {u8.shape}")
        if self.image_sources is not None and len(self.image_sources) != self.num_images:
            raise bad("image_sources", f"{self.num_images} sources", str(len(self.image_sources)))
        return self

    def to_dict(self) -> dict:
        """The stored row (see the module doc)."""
        out = {"input_ids": self.input_ids.astype(np.int32), "attention_mask": self.attention_mask.astype(np.int8)}
        if self.labels is not None:
            out["labels"] = self.labels.astype(np.int32)
        out["mm_token_type_ids"] = self.mm_token_type_ids.astype(np.int32)
        out["image_hw"] = self.image_hw.astype(np.int64).reshape(-1)
        out["tiles_per_image"] = self.tiles_per_image.astype(np.int64)
        out["family"] = self.family
        if self.pixel_values_u8 is not None:
            out["pixel_values_u8"] = self.pixel_values_u8.reshape(-1)
            out["tile_hw"] = np.asarray(self.pixel_values_u8.shape[1:3], np.int64)
            out["pixel_digest"] = np.int64(pixel_digest(self.pixel_values_u8))
        if self.image_sources is not None:
            out["image_sources"] = [bytes(b) for b in self.image_sources]
            out["pixel_digest"] = np.int64(sources_digest(self.image_sources))
            if self.image_backend != "pil":
                out["image_backend"] = self.image_backend
        if self.images_kwargs:
            out["images_kwargs"] = json.dumps(self.images_kwargs, sort_keys=True)
        return out

    @classmethod
    def from_dict(cls, d: Any, row: Any = None) -> "TiledInputs":
        """A stored row (python lists, numpy or torch formatted) -> `TiledInputs`."""
        tiles = as_array(d.get("tiles_per_image"), np.int64, 1, "tiles_per_image", row)
        u8 = d.get("pixel_values_u8")
        if u8 is not None:
            hw = as_array(d.get("tile_hw"), np.int64, 1, "tile_hw", row)
            flat = as_array(u8, np.uint8, 1, "pixel_values_u8", row) if not isinstance(u8, (bytes, bytearray)) \
                else np.frombuffer(u8, np.uint8)
            want = int(tiles.sum()) * int(np.prod(hw)) * 3
            if flat.size != want:
                raise InputError(f"pixel_values_u8 holds {flat.size} bytes", row=row, column="pixel_values_u8",
                                 stage="validate", expected=f"{want} ({int(tiles.sum())} tiles of {hw.tolist()} x 3)",
                                 found=str(flat.size), fix="re-encode the row with mmpipe.encode")
            u8 = flat.reshape(int(tiles.sum()), int(hw[0]), int(hw[1]), 3)
            if d.get("pixel_digest") is not None and int(d["pixel_digest"]) != int(np.int64(pixel_digest(u8))):
                raise PixelDataError("the stored tiles do not hash to the row's pixel_digest: a byte changed after "
                                     "encoding", row=row, column="pixel_values_u8", stage="validate",
                                     fix="re-encode the row with mmpipe.encode")
        labels, sources = d.get("labels"), source_list(d.get("image_sources"), len(tiles), row)
        if sources is not None and d.get("pixel_digest") is not None and \
                int(d["pixel_digest"]) != int(np.int64(sources_digest(sources))):
            raise PixelDataError("the stored image files do not hash to the row's pixel_digest: a byte changed "
                                 "after encoding", row=row, column="image_sources", stage="validate",
                                 fix="re-encode the row with pixels='source'")
        kwargs = d.get("images_kwargs")
        return cls(family=str(d.get("family")), input_ids=as_array(d.get("input_ids"), np.int64, 1, "input_ids", row),
                   attention_mask=as_array(d.get("attention_mask"), np.int64, 1, "attention_mask", row),
                   mm_token_type_ids=as_array(d.get("mm_token_type_ids"), np.int64, 1, "mm_token_type_ids", row),
                   image_hw=as_array(d.get("image_hw"), np.int64, 1, "image_hw", row).reshape(-1, 2),
                   tiles_per_image=tiles, pixel_values_u8=u8, image_sources=sources,
                   images_kwargs=json.loads(kwargs) if isinstance(kwargs, str) and kwargs else None,
                   image_backend=str(d.get("image_backend") or "pil"),
                   labels=None if labels is None else as_array(labels, np.int64, 1, "labels", row)).validate(row)

    def diff(self, other: "TiledInputs") -> list[str]:
        """Names of the fields whose shapes, dtypes or values differ."""
        out = [] if get_family(self.family).accepts(other.family) else ["family"]
        out += [n for n in ("image_sources", "images_kwargs", "image_backend") if getattr(self, n) != getattr(other, n)]
        return out + [n for n in ("input_ids", "attention_mask", "mm_token_type_ids", "image_hw", "tiles_per_image",
                                  "pixel_values_u8", "labels") if not _same(getattr(self, n), getattr(other, n))]

    def equals(self, other: "TiledInputs") -> bool:
        return not self.diff(other)


@dataclass(eq=False)
class TiledBatch:
    """A padded batch of `TiledInputs` (B rows, L the longest, I images, N tiles).

    Attributes:
        input_ids, attention_mask, position_ids, mm_token_type_ids: int64 [B, L] (pads: the pad
            id, 0, 0, 0); positions ``0..n-1`` over each row's own tokens.
        labels:          int64 [B, L] (pads -100) or None.
        image_hw:        int64 [I, 2]; tiles_per_image int64 [I]; images_per_row int64 [B].
        pixel_values_u8: uint8 [N, S, S, 3] (None: layout-only rows).
        pixel_values:    the processor's float32 pixels (default layout [N, 3, S, S]; the
                         family module's ``batch_pixel_values`` may reshape), None without pixels.
        extras:          further model inputs by name (the family module's ``extra_inputs``,
                         e.g. LLaVA-OneVision ``image_sizes`` int64 [I, 2]).
        lengths:         int64 [B] tokens per row.
        columns:         pass-through columns (collate's keep_columns): name -> B values.
    """

    family: str
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    mm_token_type_ids: np.ndarray
    padding_side: str
    lengths: np.ndarray
    image_hw: np.ndarray
    tiles_per_image: np.ndarray
    images_per_row: np.ndarray
    pixel_values_u8: Optional[np.ndarray] = None
    pixel_values: Optional[np.ndarray] = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    labels: Optional[np.ndarray] = None
    columns: Optional[dict] = None

    def _repr_html_(self) -> str:
        """Jupyter display (`mmpipe.view`, found through `mmpipe.records.display_hooks`)."""
        return render("batch_html", self)

    def describe(self, *, tokenizer: Any = None) -> str:
        """Plain-text description for terminals (`mmpipe.view.describe`)."""
        return render("describe", self, tokenizer=tokenizer)

    @property
    def seq_lengths(self) -> np.ndarray:
        """int64 [B] tokens per row (`lengths`, under the name `BatchedMultiModalInputs` uses)."""
        return self.lengths

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def family_table(self) -> TiledFamily:
        return get_family(self.family)

    def model_inputs(self, device=None, *, positions: str = "1d", labels: bool = True) -> dict:
        """torch tensors for ``model(**batch.model_inputs())``: ``input_ids``, ``attention_mask``,
        ``position_ids`` [B, L] (``positions="none"``: left out), the token types under the
        family's ``token_type_key`` (Gemma 3: ``token_type_ids``), ``pixel_values`` (when the
        batch holds images and pixels), the family's extra inputs, and ``labels`` [B, L] when
        any token is labelled."""
        import torch

        if positions not in ("1d", "none"):
            raise ArgumentError(f"positions must be '1d' or 'none' for a tiled family, got {positions!r}")
        fam = self.family_table
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if positions == "1d":
            out["position_ids"] = self.position_ids
        if fam.token_type_key is not None:
            out[fam.token_type_key] = self.mm_token_type_ids
        if self.pixel_values is not None and len(self.tiles_per_image):
            out["pixel_values"] = self.pixel_values
            out.update(self.extras)
        if labels and self.labels is not None and bool((self.labels != IGNORE_INDEX).any()):
            out["labels"] = self.labels
        return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in out.items()}


# ---- Arrow ---------------------------------------------------------------------------------
def _list_column(table, name: str, dtype) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A list column -> (values numpy of ``dtype``, offsets int64 [rows + 1]); None when absent."""
    import pyarrow as pa

    if name not in table.column_names:
        return None
    col = table.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ChunkedArray):  # zero chunks
        arr = pa.array([], type=col.type)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, offsets - offsets[0] if len(offsets) else offsets


def tiled_rows_from_arrow(table) -> list[TiledInputs]:
    """Stored tiled rows as one Arrow table -> `TiledInputs`, read from the column buffers (the
    pixel bytes are numpy views, no python lists)."""
    cols = {name: _list_column(table, name, dtype) for name, dtype in (
        ("input_ids", np.int64), ("attention_mask", np.int64), ("labels", np.int64),
        ("mm_token_type_ids", np.int64), ("image_hw", np.int64), ("tiles_per_image", np.int64),
        ("pixel_values_u8", np.uint8), ("tile_hw", np.int64))}
    for name in ("input_ids", "attention_mask", "mm_token_type_ids", "image_hw", "tiles_per_image"):
        if cols[name] is None:
            raise InputError(f"column {name!r} is missing", row=0, column=name, stage="validate",
                             fix="re-encode the rows with mmpipe.encode")
    families = table.column("family").to_pylist()
    scalars = {n: table.column(n).to_pylist() for n in ("image_sources", "pixel_digest", "image_backend", "images_kwargs")
               if n in table.column_names}  # pixels="source" and images_kwargs rows
    rows = []
    for i, fam in enumerate(families):
        cell = {name: (None if c is None else c[0][c[1][i]:c[1][i + 1]]) for name, c in cols.items()}
        cell.update({n: v[i] for n, v in scalars.items()})
        cell["family"] = fam
        rows.append(TiledInputs.from_dict(cell, i))
    return rows
