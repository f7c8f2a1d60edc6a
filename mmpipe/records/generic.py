"""Records of the generic path (`mmpipe.encoding.generic`): rows and batches of a processor
mmpipe has no family table for, holding whatever that processor returns.

A row keeps each processor output as the processor gave it for a batch of one:

- sequence keys (``input_ids``, ``attention_mask`` and e.g. ``token_type_ids``,
  ``mm_token_type_ids``): int64 ``[L]``;
- row keys (`GenericInputs.row_keys`): axis 0 is the row, e.g. Idefics3 ``pixel_values``
  float32 ``[1, tiles, 3, H, W]`` and ``pixel_attention_mask`` bool ``[1, tiles, H, W]``;
- item keys (the other vision keys): axis 0 counts images or patches, e.g. Gemma 3
  ``pixel_values`` float32 ``[I, 3, H, W]``, LLaVA-OneVision ``image_sizes`` int64 ``[I, 2]``,
  GLM-4.1V ``pixel_values`` float32 ``[N, 1176]`` with ``image_grid_thw`` ``[I, 3]``.

Positions are 1-D (``0..L-1`` per row); families whose model needs other positions (M-RoPE)
are not handled here.

Stored (``dataset.map(mmpipe.encode, ...)``), a row is `GenericInputs.to_dict`: ``input_ids``
int32 [L], ``attention_mask`` int8 [L], ``labels`` int32 [L], each sequence key int32 [L],
each vision key its values flat (``list<float32>`` pixels, ``list<int64>`` sizes, bool or int64
masks: the processor's dtype; empty where the row has none) with its shape in `SHAPES_COLUMN`
(``list<list<int64>>``, one shape per vision key of the layout, ``[0]`` when absent; flat
values keep their Arrow type whatever the first rows of a map hold), ``family`` =
``"generic"`` and `LAYOUT_COLUMN`: the JSON of the processor's `GenericLayout` (its class and
output keys), which `GenericInputs.from_dict` and `generic_rows_from_arrow` read rows back with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import GENERIC_FAMILY
from mmpipe.records.columns import as_array

__all__ = ["GENERIC_FAMILY", "LAYOUT_COLUMN", "SHAPES_COLUMN", "GenericLayout", "GenericInputs", "GenericBatch",
           "is_generic_row", "generic_rows_from_arrow"]

LAYOUT_COLUMN = "generic_layout"  # the stored JSON of the rows' GenericLayout
SHAPES_COLUMN = "generic_shapes"  # the stored shape of each vision key (layout order)


@dataclass(frozen=True)
class GenericLayout:
    """What a processor returns, found once by a probe (`mmpipe.encoding.generic`): its class,
    its sequence keys (int [L]), its vision keys as ``(name, dtype, ndim)`` and which of those
    are row keys. Every stored row of one processor carries the same layout (one schema)."""

    processor_class: str
    sequence: tuple[str, ...] = ()
    vision: tuple[tuple[str, str, int], ...] = ()
    row_keys: tuple[str, ...] = ()
    pads: tuple = ()  # (row key, values): the processor's fill of one missing item (axis 1) where not 0

    def to_json(self) -> str:
        d = {"processor_class": self.processor_class, "sequence": list(self.sequence),
             "vision": [list(v) for v in self.vision], "row_keys": list(self.row_keys)}
        return json.dumps({**d, "pads": [[k, list(v)] for k, v in self.pads]} if self.pads else d)

    @classmethod
    def from_json(cls, text: str, row: Any = None) -> "GenericLayout":
        try:
            d = json.loads(text)
            return cls(d["processor_class"], tuple(d["sequence"]), tuple((n, t, int(k)) for n, t, k in d["vision"]),
                       tuple(d["row_keys"]), tuple((k, tuple(v)) for k, v in d.get("pads", ())))
        except (TypeError, ValueError, KeyError) as e:
            raise InputError(f"unreadable {LAYOUT_COLUMN} ({type(e).__name__}: {e})", row=row, column=LAYOUT_COLUMN,
                             stage="validate", expected="the JSON mmpipe.encode wrote", found=repr(text)[:80],
                             fix="re-encode the row with mmpipe.encode") from None


def is_generic_row(row: Any) -> bool:
    """Whether a stored row (dict or `GenericInputs`) comes from the generic path."""
    if isinstance(row, GenericInputs):
        return True
    return hasattr(row, "get") and row.get("family") == GENERIC_FAMILY


def _shaped(flat: Any, dtype: str, shape: Any, name: str, row: Any) -> Optional[np.ndarray]:
    """Stored flat values (list, numpy or torch) and their stored shape -> numpy of ``dtype``
    and that shape; None for a key the row does not have (leading axis 0)."""
    shape = [int(n) for n in shape]
    if not shape or shape[0] == 0:
        return None
    arr = as_array(flat, dtype, 1, name, row)
    if arr.size != int(np.prod(shape)):
        raise InputError(f"column {name!r} holds {arr.size} values for shape {shape}", row=row, column=name,
                         stage="validate", expected=f"{int(np.prod(shape))} values", found=str(arr.size),
                         fix="re-encode the row with mmpipe.encode")
    return arr.reshape(shape)


@dataclass(eq=False)
class GenericInputs:
    """One row encoded by a processor's own chat template and call.

    Attributes (L tokens):
        input_ids:       int64 [L], placeholders expanded by the processor.
        attention_mask:  int64 [L] (all ones).
        sequence:        other int64 [L] outputs by name (``token_type_ids``, ...).
        vision:          the other outputs by name, numpy, the processor's dtypes (float32
                         pixels); shapes as in the module doc.
        row_keys:        names in ``vision`` whose axis 0 is the row (length 1 here).
        processor_class: the processor's transformers class name.
        labels:          optional int64 [L], -100 where not trained.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    processor_class: str
    sequence: dict[str, np.ndarray] = field(default_factory=dict)
    vision: dict[str, np.ndarray] = field(default_factory=dict)
    row_keys: tuple[str, ...] = ()
    labels: Optional[np.ndarray] = None
    layout: Optional[GenericLayout] = None  # the encoder's (what `to_dict` writes); not compared

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def position_ids(self) -> np.ndarray:
        """int64 [L]: ``0..L-1``."""
        return np.arange(len(self.input_ids), dtype=np.int64)

    def validate(self, row=None) -> "GenericInputs":
        """Checks the lengths of the sequence keys and the leading axis of the row keys."""
        n = len(self.input_ids)
        for name, arr in [("attention_mask", self.attention_mask), ("labels", self.labels), *self.sequence.items()]:
            if arr is not None and arr.shape != (n,):
                raise InputError(f"{name} does not line up with input_ids", row=row, column=name, stage="encode",
                                 expected=f"shape ({n},)", found=f"shape {arr.shape}",
                                 fix="pass the processor outputs of this very row")
        for name in self.row_keys:
            if name in self.vision and self.vision[name].shape[:1] != (1,):
                raise InputError(f"{name} is a per-row output but holds {self.vision[name].shape[0]} rows", row=row,
                                 column=name, stage="encode", expected="axis 0 of length 1",
                                 found=f"shape {self.vision[name].shape}", fix="encode one row per processor call")
        return self

    def to_dict(self, layout: Optional[GenericLayout] = None) -> dict:
        """The stored row (see the module doc): every key of ``layout`` (default: the
        encoder's, else this row's own keys), empty where this row has none."""
        layout = layout or self.layout or GenericLayout(
            self.processor_class, tuple(sorted(self.sequence)),
            tuple((k, str(v.dtype), v.ndim) for k, v in sorted(self.vision.items())), tuple(self.row_keys))
        out = {"input_ids": self.input_ids.astype(np.int32), "attention_mask": self.attention_mask.astype(np.int8)}
        if self.labels is not None:
            out["labels"] = self.labels.astype(np.int32)
        for k in layout.sequence:
            out[k] = self.sequence[k].astype(np.int32) if k in self.sequence else np.zeros(len(self), np.int32)
        shapes = []
        for name, dtype, _ in layout.vision:
            arr = self.vision.get(name)
            out[name] = arr.reshape(-1) if arr is not None else np.zeros(0, dtype)
            shapes.append(list(arr.shape) if arr is not None else [0])
        out[SHAPES_COLUMN] = shapes
        out["family"] = GENERIC_FAMILY
        out[LAYOUT_COLUMN] = layout.to_json()
        return out

    @classmethod
    def from_dict(cls, d: Any, row: Any = None) -> "GenericInputs":
        """A stored row (python lists, numpy or torch formatted) -> `GenericInputs`; the inverse
        of `to_dict` (a vision key stored empty is a key the row does not have)."""
        layout = GenericLayout.from_json(d.get(LAYOUT_COLUMN), row)
        ids = as_array(d.get("input_ids"), np.int64, 1, "input_ids", row)
        shapes = d.get(SHAPES_COLUMN)
        vision, shapes = {}, [] if shapes is None else list(shapes)
        if len(shapes) != len(layout.vision):
            raise InputError(f"{SHAPES_COLUMN} holds {len(shapes)} shapes for {len(layout.vision)} vision keys",
                             row=row, column=SHAPES_COLUMN, stage="validate", fix="re-encode the row with mmpipe.encode")
        for (name, dtype, _), shape in zip(layout.vision, shapes):
            arr = _shaped(d.get(name), dtype, shape, name, row)
            if arr is not None:
                vision[name] = arr
        labels = d.get("labels")
        return cls(input_ids=ids, attention_mask=as_array(d.get("attention_mask"), np.int64, 1, "attention_mask", row),
                   processor_class=layout.processor_class,
                   sequence={k: as_array(d.get(k), np.int64, 1, k, row) for k in layout.sequence},
                   vision=vision, row_keys=tuple(k for k in layout.row_keys if k in vision), layout=layout,
                   labels=None if labels is None else as_array(labels, np.int64, 1, "labels", row)).validate(row)

    def diff(self, other: "GenericInputs") -> list[str]:
        """Names of the fields (and sequence / vision keys) whose keys, shapes, dtypes or values differ."""
        def same(a, b):
            return (a is None) == (b is None) and (a is None or (a.shape == b.shape and a.dtype == b.dtype
                                                                 and np.array_equal(a, b)))

        out = [name for name in ("processor_class", "row_keys") if getattr(self, name) != getattr(other, name)
               and not (name == "row_keys" and set(self.row_keys) == set(other.row_keys))]
        out += [name for name in ("input_ids", "attention_mask", "labels")
                if not same(getattr(self, name), getattr(other, name))]
        for d1, d2 in ((self.sequence, other.sequence), (self.vision, other.vision)):
            out += sorted(k for k in d1.keys() | d2.keys() if k not in d1 or k not in d2 or not same(d1[k], d2[k]))
        return out

    def equals(self, other: "GenericInputs") -> bool:
        """Same keys, shapes, dtypes and values (NaN-free data)."""
        return not self.diff(other)


@dataclass(eq=False)
class GenericBatch:
    """A padded batch of `GenericInputs` (B rows, L the longest).

    Attributes:
        input_ids, attention_mask, position_ids: int64 [B, L] (pads: the pad id, 0, 0).
        sequence:  int64 [B, L] per sequence key (pads 0).
        vision:    per vision key: row keys [B, max..., ...] (missing rows and padding zero,
                   as the processor pads a batch), item keys concatenated on axis 0 with
                   trailing axes zero-padded to the largest.
        labels:    int64 [B, L] (pads -100) or None.
        lengths:   int64 [B] tokens per row; shapes: each row's own shape per vision key
                   (None where the row lacks it), what `unbatch_generic` cuts back to.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    processor_class: str
    padding_side: str
    lengths: np.ndarray
    sequence: dict[str, np.ndarray] = field(default_factory=dict)
    vision: dict[str, np.ndarray] = field(default_factory=dict)
    row_keys: tuple[str, ...] = ()
    shapes: dict[str, list] = field(default_factory=dict)
    labels: Optional[np.ndarray] = None
    columns: Optional[dict] = None  # pass-through columns (collate's keep_columns): name -> B values

    family = GENERIC_FAMILY

    @property
    def seq_lengths(self) -> np.ndarray:
        """int64 [B] tokens per row (`lengths`, under the name `BatchedMultiModalInputs` uses)."""
        return self.lengths

    def model_inputs(self, device=None, *, positions: str = "1d", labels: bool = True) -> dict:
        """torch tensors for ``model(**batch.model_inputs())``: ids, mask, ``position_ids``
        [B, L] (``positions="none"``: left out, for a model that builds its own), the sequence
        keys, every vision key, and ``labels`` [B, L] when any token is labelled."""
        import torch

        if positions not in ("1d", "none"):
            raise ArgumentError(f"positions must be '1d' or 'none' on the generic path, got {positions!r}")
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, **self.sequence, **self.vision}
        if positions == "1d":
            out["position_ids"] = self.position_ids
        if labels and self.labels is not None and bool((self.labels != -100).any()):
            out["labels"] = self.labels
        return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in out.items()}


def _arrow_cell(column, i: int, dtype: str) -> Optional[np.ndarray]:
    """Row ``i`` of a (chunked) Arrow list column -> flat numpy of ``dtype`` (None when null)."""
    arr = column.slice(i, 1)
    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    if arr.null_count:
        return None
    return arr.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def generic_rows_from_arrow(table) -> list[GenericInputs]:
    """Stored generic rows as one Arrow table (`mmpipe.ArrowRows`) -> `GenericInputs`, read from
    the column buffers (no python lists)."""
    layouts = table.column(LAYOUT_COLUMN).to_pylist()
    all_shapes = table.column(SHAPES_COLUMN).to_pylist() if SHAPES_COLUMN in table.column_names else [[]] * len(layouts)
    rows = []
    for i, text in enumerate(layouts):
        layout = GenericLayout.from_json(text, i)

        def cell(name, dtype, i=i):
            if name not in table.column_names:
                raise InputError(f"column {name!r} is missing", row=i, column=name, stage="validate",
                                 fix="re-encode the row with mmpipe.encode")
            return _arrow_cell(table.column(name), i, dtype)

        shapes = all_shapes[i]
        if len(shapes) != len(layout.vision):
            raise InputError(f"{SHAPES_COLUMN} holds {len(shapes)} shapes for {len(layout.vision)} vision keys",
                             row=i, column=SHAPES_COLUMN, stage="validate", fix="re-encode the row with mmpipe.encode")
        vision = {n: a for (n, t, _), shape in zip(layout.vision, shapes)
                  if (a := _shaped(cell(n, t), t, shape, n, i)) is not None}
        labels = cell("labels", "int64") if "labels" in table.column_names else None
        rows.append(GenericInputs(
            input_ids=cell("input_ids", "int64"), attention_mask=cell("attention_mask", "int64"),
            processor_class=layout.processor_class, sequence={k: cell(k, "int64") for k in layout.sequence},
            vision=vision, row_keys=tuple(k for k in layout.row_keys if k in vision), labels=labels,
            layout=layout).validate(i))
    return rows
