"""The ``processor`` kind (the generic path: a VLM processor without a family row of its own,
`mmpipe.media.processor_encode`): a row holds what the processor's own call returned, typed by the
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
    """What a processor returns, found once by a probe (`mmpipe.media.processor_encode`): its class,
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



def has_pixels(r) -> bool:
    return bool(r.vision)


def layout_repr(r) -> str:
    return f"processor={r.processor_class}"


def position_inputs(batch, positions) -> dict:
    from mmpipe.media import one_d_position_inputs

    return one_d_position_inputs(batch, positions)


def pack_token_types(fam, token_types) -> dict:
    return {}  # the generic path does not pack


def model_inputs(batch, token_types=None) -> dict:
    """The processor's own outputs: its sequence keys [B, L] and every vision key."""
    return {**batch.sequence, **batch.vision}


# ---- rollout ----
NO_ROLLOUT = ("the generic path (a processor without a mmpipe family table) has no rollout rules: no vLLM "
              "prompt (placeholder) rule, no vision-token table to ban, no way to extend its processor-defined "
              "outputs over a response; train on its rows with mmpipe.Collator(processor), or add a family "
              "row for its processor class (mmpipe.families) to roll it out")


def vision_tokens(fam) -> dict[str, Optional[str]]:
    """None known: the generic path has no table of its processor's tokens."""
    return {}


def rollout_refusal(fam, stage: str) -> Optional[str]:
    """Every rollout stage refuses the generic path's rows (`NO_ROLLOUT`)."""
    return NO_ROLLOUT


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                index: int = 0) -> dict:
    """Refused (`NO_ROLLOUT`): `mmpipe.rollout.support.check_rollout` says so before this."""
    from mmpipe.errors import ArgumentError

    raise ArgumentError(f"row {index}: vLLM prompts are not available for generic rows: {NO_ROLLOUT}")


# ---- view ----
# What the view stage (mmpipe.view) and `mmpipe inspect` ask of this kind: token spans, span
# labels, pictures from the stored pixels, counts from the stored columns; the same names in
# every kind. The code is in mmpipe/media/processor_view.py (this module is shared by every stage).
from mmpipe.media.processor_view import (  # noqa: E402  (a section of its own, at the end)
    PIXEL_UNIT, STATS_COLUMNS, table_counts, view_images, view_layout, view_notes, view_size, view_spans,
    view_summary, view_video_frames,
)


# ---- encode ----
# What mmpipe.Encoder asks of this kind: its options, one image's layout and stored payload, a
# parsed row's fields, an empty row, the bytes of one image, the processor layout; the same
# names in every kind. The code is in mmpipe/media/processor_encode.py (it imports nothing from
# this module: the layout found by its probe is typed here).
from mmpipe.media.processor_encode import (  # noqa: E402  (a section of its own, at the end)
    ENCODE_OPTIONS, ENCODE_PIXELS, encode_empty, encode_image, encode_image_bytes, encode_row, encode_settings,
    probe,
)


def encode_layout(enc) -> ProcessorLayout:
    """The processor's outputs, found once per encoder by probe calls (`probe`)."""
    return ProcessorLayout(enc.processor_class, *probe(enc))


# ---- collate ----
# What mmpipe.collate / unbatch / pack ask of this kind; the same names in every kind. The vision
# padding is in mmpipe/media/processor_collate.py (it imports nothing from this module).
from mmpipe.media.processor_collate import collate_outputs, unbatch_media  # noqa: E402,F401

BATCH_ROWS = "generic-path"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a natively encoded row"  # a row of another kind in such a batch
BATCH_ARRAYS = "numpy"  # the batch's fields stay numpy (as always; as_torch / model_inputs convert)
POSITION_ROWS = ()  # position_ids [L] per row, [B, L] per batch
COLLATOR_NEEDS_PROCESSOR = None  # rows carry their processor's outputs: nothing to take from it
CHECK_STORED_DTYPES = False  # the processor's own dtypes, typed by the layout: read as the layout says


def collator_state(processor, fam) -> dict:
    """``{"processor_class": str or None}``: the transformers class every row must have been
    encoded by (None without a processor: the rows' first)."""
    from mmpipe.families import processor_class_name

    return {"processor_class": None if processor is None else processor_class_name(processor)}


def collate_media(rows: list, ctx) -> dict:
    """The media fields of a batch (`mmpipe.media.processor_collate.collate_outputs`: the
    processor's outputs padded as it pads them, numpy) and the rows' `ProcessorLayout` (the
    layout of what the batch holds when the rows were probed differently). Rows must come
    from the processor class of ``ctx.state`` (when collated with a processor)."""
    from mmpipe.errors import FamilyMismatchError

    want = ctx.state.get("processor_class")
    for i, r in enumerate(rows):
        if want is not None and r.processor_class != want:
            raise FamilyMismatchError(f"encoded by {r.processor_class} (the generic path) but collated with {want}",
                                      row=i, column=LAYOUT_COLUMN, expected=want, found=r.processor_class,
                                      fix="collate with the processor that encoded the rows, or re-encode them")
    out = collate_outputs(rows, ctx)
    if "layout" not in out:
        out["layout"] = ProcessorLayout.of(rows[0].processor_class, rows[0].sequence,
                                           {k: v[:0] for k, v in out["vision"].items()}, out.pop("row_keys"))
    out.pop("row_keys", None)
    return out


# ---- validate ----
KIND_COLUMN = LAYOUT_COLUMN  # only processor rows store it (names a table without a family)
_REQUIRED = ("input_ids", "attention_mask", "family", LAYOUT_COLUMN, SHAPES_COLUMN)


def _stored_layout(text: Any) -> Optional[ProcessorLayout]:
    """A stored layout, None when unreadable (reading its rows reports it)."""
    try:
        return ProcessorLayout.from_json(text)
    except InputError:
        return None


def expected_columns(table, *, labels: bool, pixel_format: str) -> list:
    """The stored columns (module doc), any Arrow type of the same shape, and the keys the
    rows' layouts name (the processor's own dtypes: not checked; a missing one fails its rows)."""
    from mmpipe.data.column_rules import ExpectedColumn

    optional = ("labels", "image_hw")
    fixed = [ExpectedColumn.stored(n, "processor") for n in _REQUIRED] + \
        [ExpectedColumn.stored(n, "processor", if_missing="optional") for n in optional]
    has_layouts = LAYOUT_COLUMN in table.column_names
    texts = table.column(LAYOUT_COLUMN).unique().to_pylist() if has_layouts else []
    layouts = [x for x in map(_stored_layout, texts) if x is not None]
    # without a row there is no layout: any column may be one of the processor's
    keys = {k for x in layouts for k in x.sequence + tuple(v[0] for v in x.vision)} if texts \
        else set(table.column_names)
    keys -= set(_REQUIRED + optional)
    return fixed + [ExpectedColumn(k, if_missing="optional") for k in sorted(keys)]


def dataset_checks(table, processor=None) -> list:
    """One processor layout per dataset (a batch is collated with one layout): an error naming
    the first row of each other layout."""
    from mmpipe.data.report import Issue

    first: dict = {}
    for i, text in enumerate(table.column(LAYOUT_COLUMN).to_pylist()):
        first.setdefault(text, i)
    layouts = [_stored_layout(t) for t in first]
    classes = ", ".join(sorted({"an unreadable layout" if x is None else x.processor_class
                                for x in layouts}))
    old = [] if "image_hw" in table.column_names or not table.num_rows else [Issue(
        "warning", "missing_column", "image_hw", "rows of an earlier mmpipe store no image_hw: which row owns "
        "which image is unknown (a batch's sample_to_image_indices refuses); ids, pixels and model inputs are "
        "right", "re-encode the dataset with mmpipe.encode (or `mmpipe encode`), which stores each image's size")]
    return old + [Issue("error", "content", LAYOUT_COLUMN, f"rows encoded by {len(first)} different "
                  f"processor layouts ({classes}): a batch is collated with one layout",
                  "encode every row with one processor, or split the dataset",
                  sorted(first.values())[1:])] if len(first) > 1 else old


def row_checks(table, *, processor=None, images_kwargs: Optional[dict] = None, positions=True):
    """None: reading a row checks all this kind can (each vision key fills its stored shape,
    the sequences line up); the image-token counts are the processor's own model's rule."""
    return None
