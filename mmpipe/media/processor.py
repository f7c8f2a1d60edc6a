"""The ``processor`` kind (the generic path: a VLM processor without a family row of its own,
`mmpipe.encoding.generic`): a row holds what the processor's own call returned, typed by the
processor's `ProcessorLayout` (found once by a probe): its sequence keys (int [L], e.g.
``token_type_ids``) in ``sequence``, its other outputs (float32 ``pixel_values``, masks, sizes)
in ``vision``, and each image's upright (height, width) in ``image_hw``. Positions are 1-D.

Stored columns: ``input_ids`` int32 [L], ``attention_mask`` int8 [L], ``labels`` int32 [L], each
sequence key int32 [L], each vision key its values flat (``list<float32>`` pixels, ``list<int64>``
sizes, bool or int64 masks: the processor's dtype; empty where the row has none) with its shape
in `SHAPES_COLUMN` (``list<list<int64>>``, one shape per vision key of the layout, ``[0]`` when
absent), ``image_hw`` int64 [2*I] (flat), ``family`` = ``"generic"`` and `LAYOUT_COLUMN`: the JSON
of the `ProcessorLayout`. Rows written before the one-record change have no ``image_hw``: they
load, and their image count is unknown (``num_images`` counts 0; re-encode for per-image indices).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mmpipe.errors import InputError
from mmpipe.records.columns import as_array

LAYOUT_COLUMN = "generic_layout"  # the stored JSON of the rows' ProcessorLayout
SHAPES_COLUMN = "generic_shapes"  # the stored shape of each vision key (layout order)

IMAGE_LAYOUT_COLUMN = "image_hw"  # the stored per-image layout (what error messages name)


@dataclass(frozen=True)
class ProcessorLayout:
    """What a processor returns, found once by a probe (`mmpipe.encoding.generic`): its class,
    its sequence keys (int [L]), its vision keys as ``(name, dtype, ndim)`` and which of those
    are row keys (axis 0 = the row). Every stored row of one processor carries the same layout
    (one schema)."""

    processor_class: str
    sequence: tuple[str, ...] = ()
    vision: tuple[tuple[str, str, int], ...] = ()
    row_keys: tuple[str, ...] = ()
    pads: tuple = ()  # (row key, values): the processor's fill of one missing item (axis 1) where not 0

    @classmethod
    def of(cls, processor_class: str, sequence: dict, vision: dict, row_keys=()) -> "ProcessorLayout":
        """The layout of one row's own outputs (a row built without its encoder's layout)."""
        return cls(processor_class, tuple(sorted(sequence)),
                   tuple((k, str(v.dtype), v.ndim) for k, v in sorted(vision.items())), tuple(row_keys))

    def to_json(self) -> str:
        d = {"processor_class": self.processor_class, "sequence": list(self.sequence),
             "vision": [list(v) for v in self.vision], "row_keys": list(self.row_keys)}
        return json.dumps({**d, "pads": [[k, list(v)] for k, v in self.pads]} if self.pads else d)

    @classmethod
    def from_json(cls, text: str, row: Any = None) -> "ProcessorLayout":
        try:
            d = json.loads(text)
            return cls(d["processor_class"], tuple(d["sequence"]), tuple((n, t, int(k)) for n, t, k in d["vision"]),
                       tuple(d["row_keys"]), tuple((k, tuple(v)) for k, v in d.get("pads", ())))
        except (TypeError, ValueError, KeyError) as e:
            raise InputError(f"unreadable {LAYOUT_COLUMN} ({type(e).__name__}: {e})", row=row, column=LAYOUT_COLUMN,
                             stage="validate", expected="the JSON mmpipe.encode wrote", found=repr(text)[:80],
                             fix="re-encode the row with mmpipe.encode") from None


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


def validate(r, row: Any = None) -> None:
    """The lengths of the sequence keys and the leading axis of the row keys."""
    n = len(r.input_ids)
    for name, arr in [("attention_mask", r.attention_mask), ("mm_token_type_ids", r.mm_token_type_ids),
                      ("labels", r.labels), *r.sequence.items()]:
        if arr is not None and arr.shape != (n,):
            raise InputError(f"{name} does not line up with input_ids", row=row, column=name, stage="encode",
                             expected=f"shape ({n},)", found=f"shape {arr.shape}",
                             fix="pass the processor outputs of this very row")
    for name in r.row_keys:
        if r.vision[name].shape[:1] != (1,):
            raise InputError(f"{name} is a per-row output but holds {r.vision[name].shape[0]} rows", row=row,
                             column=name, stage="encode", expected="axis 0 of length 1",
                             found=f"shape {r.vision[name].shape}", fix="encode one row per processor call")


def stored_pixel_digest(r) -> Optional[int]:
    return None  # the processor's float outputs are stored as they are (no digest, as before)


def pixel_columns(r) -> str:
    return " / ".join(sorted(r.vision)) or "pixel_values"


def to_columns(r, layout: Optional[ProcessorLayout] = None) -> dict:
    """The stored row (see the module doc): every key of ``layout`` (default: the row's), empty
    where this row has none."""
    layout = layout or r.layout or ProcessorLayout.of(r.processor_class or "", r.sequence, r.vision)
    out = {"input_ids": r.input_ids.astype(np.int32), "attention_mask": r.attention_mask.astype(np.int8)}
    if r.labels is not None:
        out["labels"] = r.labels.astype(np.int32)
    for k in layout.sequence:
        out[k] = r.sequence[k].astype(np.int32) if k in r.sequence else np.zeros(len(r), np.int32)
    shapes = []
    for name, dtype, _ in layout.vision:
        arr = r.vision.get(name)
        out[name] = arr.reshape(-1) if arr is not None else np.zeros(0, dtype)
        shapes.append(list(arr.shape) if arr is not None else [0])
    out[SHAPES_COLUMN] = shapes
    if r.image_hw is not None:
        out["image_hw"] = r.image_hw.astype(np.int64).reshape(-1)
    out["family"] = r.family
    out[LAYOUT_COLUMN] = layout.to_json()
    return out


def from_columns(cls, d: Any, fam, row: Any = None, *, verify_pixels: bool = False):
    """A stored row (python lists, numpy or torch formatted) -> the record; the inverse of
    `to_columns` (a vision key stored empty is a key the row does not have)."""
    layout = ProcessorLayout.from_json(d.get(LAYOUT_COLUMN), row)
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
    labels, hw = d.get("labels"), d.get("image_hw")
    return cls(input_ids=ids, attention_mask=as_array(d.get("attention_mask"), np.int64, 1, "attention_mask", row),
               family=fam.name, sequence={k: as_array(d.get(k), np.int64, 1, k, row) for k in layout.sequence},
               vision=vision, layout=layout,
               image_hw=None if hw is None else as_array(hw, np.int64, 1, "image_hw", row).reshape(-1, 2),
               labels=None if labels is None else as_array(labels, np.int64, 1, "labels", row)).validate(row)


def _arrow_cell(column, i: int, dtype: str) -> Optional[np.ndarray]:
    """Row ``i`` of a (chunked) Arrow list column -> flat numpy of ``dtype`` (None when null)."""
    arr = column.slice(i, 1)
    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    if arr.null_count:
        return None
    return arr.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def rows_from_arrow(cls, table) -> list:
    """Stored processor-kind rows as one Arrow table (`mmpipe.ArrowRows`) -> records, read from
    the column buffers (no python lists)."""
    layouts = table.column(LAYOUT_COLUMN).to_pylist()
    all_shapes = table.column(SHAPES_COLUMN).to_pylist() if SHAPES_COLUMN in table.column_names else [[]] * len(layouts)
    rows = []
    for i, text in enumerate(layouts):
        layout = ProcessorLayout.from_json(text, i)

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
        hw = cell("image_hw", "int64").reshape(-1, 2) if "image_hw" in table.column_names else None
        rows.append(cls(
            input_ids=cell("input_ids", "int64"), attention_mask=cell("attention_mask", "int64"),
            family=table.column("family")[i].as_py(), sequence={k: cell(k, "int64") for k in layout.sequence},
            vision=vision, labels=labels, layout=layout, image_hw=hw).validate(i))
    return rows



def model_inputs(batch, token_types=None) -> dict:
    """The processor's own outputs: its sequence keys [B, L] and every vision key."""
    return {**batch.sequence, **batch.vision}
