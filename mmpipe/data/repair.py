"""The safe repairs of `mmpipe.data.validate.validate_dataset(..., fix=True)`: Arrow-level
conversions that change no value.

Each takes a column (or the table) and returns the repaired Arrow data:

- `lossless_cast`: a column cast to the schema type when every value survives the round trip
  (int64 -> int32 when every value fits, large_list -> list, large_binary -> binary, float64
  -> float32 when exact, a column holding no value at all, ``list<null>`` after a pandas round
  trip, to its typed empty lists);
- `u8_list_to_binary`: compact pixels stored as ``list<uint8>`` (older layout) -> ``binary``
  with the end marker (when every value is a byte, `u8_values_fit`);
- `class_ids_to_names`: a string column (``family``) a ``datasets`` ClassLabel turned into
  integer class ids (``class_encode_column``, wanted by ``stratify_by_column``) -> its names, as
  the ClassLabel the table's schema metadata records lists them (`class_label_names`);
- `add_empty_column`: a missing video column, empty for every row (no videos);
- `recompute_rope_deltas`: a missing ``rope_delta`` as ``max(position_ids) + 1 - L``;
- `pixel_digests`: a missing ``pixel_digest`` computed from the pixel data as stored now
  (this blesses the bytes as they are: the report says so).
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmpipe.records.columns import END_MARKER


def lossless_cast(col: pa.ChunkedArray, typ: pa.DataType) -> Optional[pa.ChunkedArray]:
    """``col`` cast to ``typ`` when no value changes (the cast back gives ``col``), else None.
    A column that holds no value at all (all null, or lists of nulls and empty lists: Arrow's
    ``null`` / ``list<null>`` after a pandas round trip) casts losslessly to any type whose
    values are as many lists and nulls (checked on the Python values, which are only nulls and
    empty lists there)."""
    try:
        out = col.cast(typ, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if _holds_no_value(col.type):
        return out if out.to_pylist() == col.to_pylist() else None
    try:
        return out if out.cast(col.type).equals(col) else None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _holds_no_value(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` can hold nulls and (nested) lists only: its innermost type
    is ``null``."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_null(t)


def is_u8_list(t: pa.DataType) -> bool:
    """Whether ``t`` is a (nested) list of integers: compact pixels in the older list layout."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_uint8(t) or pa.types.is_integer(t)


def u8_values_fit(col: pa.ChunkedArray) -> bool:
    """Whether every value of a (nested) integer list column is a byte (0..255): only then is
    `u8_list_to_binary` lossless (an int64 / int16 list written by another tool may hold others)."""
    values = col
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        values = pc.list_flatten(values)
    if len(values) == values.null_count:
        return True
    mm = pc.min_max(values)
    return 0 <= mm["min"].as_py() and mm["max"].as_py() <= 255


def u8_list_to_binary(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Compact pixels stored as list<uint8> or list<list<uint8>> -> binary + end marker (nulls stay null).
    Every value must be a byte (`u8_values_fit`; the caller checks: numpy refuses others)."""
    out = []
    for v in col.to_pylist():
        if v is None:
            out.append(None)
            continue
        arr = np.asarray(v, dtype=np.uint8).reshape(-1)
        out.append(arr.tobytes() + bytes([END_MARKER]))
    return pa.chunked_array([pa.array(out, type=pa.binary())])


def class_label_names(schema: pa.Schema, name: str) -> Optional[list]:
    """The names of column ``name``'s ``datasets`` ClassLabel, as the schema metadata a Dataset
    (or its parquet / save_to_disk files) records them, else None."""
    try:
        meta = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        feature = meta.get("info", {}).get("features", {}).get(name, {})
    except (ValueError, AttributeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return list(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def class_ids_to_names(col: pa.ChunkedArray, names: list) -> Optional[pa.ChunkedArray]:
    """string [rows]: each integer class id of ``col`` replaced by ``names[id]`` (nulls stay null);
    None when an id is not one of the names' (ClassLabel's -1 for "no label" included)."""
    ids = col.combine_chunks().cast(pa.int64())
    if len(ids) > ids.null_count:
        mm = pc.min_max(ids)
        if mm["min"].as_py() < 0 or mm["max"].as_py() >= len(names):
            return None
    return pa.chunked_array([pc.take(pa.array(names, pa.string()), ids)])


def add_empty_column(table: pa.Table, f: pa.Field) -> pa.Table:
    """``table`` with column ``f`` appended, empty in every row (an end marker alone for binary pixels)."""
    n = table.num_rows
    if pa.types.is_binary(f.type):
        vals = [bytes([END_MARKER])] * n
    else:
        vals = [[] for _ in range(n)]
    return table.append_column(pa.field(f.name, f.type), pa.array(vals, type=f.type))


def recompute_rope_deltas(table: pa.Table) -> pa.Array:
    """int32 [rows]: each row's ``max(position_ids) + 1 - L`` (0 for an empty row)."""
    pos = table.column("position_ids").to_pylist()
    ids_len = pc.list_value_length(table.column("input_ids")).to_pylist()
    out = []
    for p, L in zip(pos, ids_len):
        mx = max((max(r) for r in p if r), default=-1)
        out.append(int(mx) + 1 - int(L or 0) if L else 0)
    return pa.array(out, type=pa.int32())


def pixel_digests(table: pa.Table, chunk: int = 256) -> pa.Array:
    """Each row's ``pixel_digest`` (int64) computed from its stored pixel data, null for a
    row without pixel data. Reads the rows chunk by chunk (`rows_from_arrow`)."""
    from mmpipe.records.arrow import rows_from_arrow

    out = []
    for start in range(0, table.num_rows, chunk):
        out += [r.stored_pixel_digest() for r in rows_from_arrow(table.slice(start, chunk))]
    return pa.array(out, pa.int64())
