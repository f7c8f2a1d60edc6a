"""Stored rows straight from Arrow: `rows_from_arrow` reads an Arrow table of encoded rows
into `MultiModalInputs` through the column buffers (numpy views, no Python object per token
or pixel byte), checked like `MultiModalInputs.from_dict`. Stage: records (validate).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa

from mmpipe.errors import InputError, PixelDataError
from mmpipe.families import ModelFamily
from mmpipe.records.codec import column_width
from mmpipe.records.columns import END_MARKER
from mmpipe.records.row import MultiModalInputs, row_family


def _list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) list array -> (offsets [n+1] into values, values as numpy), zero-copy."""
    return arr.offsets.to_numpy(), _values_np(arr.values)


def list_lengths(column: Union[pa.Array, pa.ChunkedArray]) -> np.ndarray:
    """Per-row lengths of an Arrow list column (Array or ChunkedArray), int64 [n]; a null
    row counts 0. Reads the offsets only: no value is decoded."""
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray) and column.num_chunks == 0:
        return np.zeros(0, np.int64)
    return pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def list_items(column: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``list<list<int>>`` Arrow array of per-row items of ``width`` values each (patch grids:
    3) -> (items per row int64 [B], each item's row int64 [n], the items int64 [n, width]); a null
    row holds none."""
    import pyarrow.compute as pc

    counts = list_lengths(column)
    items = pc.list_flatten(pc.list_flatten(column)).to_numpy(zero_copy_only=False).astype(np.int64)
    return counts, np.repeat(np.arange(len(counts)), counts), items.reshape(-1, width)


def most_per_row(ds, column: str) -> int:
    """The most items any row of ``ds`` (a ``datasets.Dataset``) holds in list column
    ``column``, from the Arrow list lengths (nothing decoded); 0 when there is no such list
    column, no row, or no Arrow table (an IterableDataset, None)."""
    data = getattr(ds, "data", None)
    if data is None or column not in getattr(ds, "column_names", ()) or len(ds) == 0:
        return 0
    col = data.table.column(column) if hasattr(data, "table") else data.column(column)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        return 0
    lengths = list_lengths(col)
    return int(lengths.max()) if lengths.size else 0


def _values_np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)  # zero-copy for primitive values without nulls


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) binary array -> (offsets [n+1] into data, data uint8), zero-copy."""
    large = pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], np.int64 if large else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return off, data


def rows_from_arrow(table: Union[pa.Table, pa.RecordBatch], *, verify_pixels: bool = False) -> list[MultiModalInputs]:
    """Stored rows as an Arrow table (or record batch) -> `MultiModalInputs`, reading the
    column buffers directly: token columns and compact pixels are numpy views of the Arrow
    memory (no Python object per token or byte), checked like `MultiModalInputs.from_dict`.
    Rows of every family kind: the columns the first row's kind declares (``fam.media.COLUMNS``)
    are read as they are stored; the other list columns of numbers (the generic path's processor
    outputs) as flat lists.

    ``table``: what ``dataset.with_format("arrow")[indices]`` returns for a dataset made by
    ``mmpipe.encode`` (see `mmpipe.collate.ArrowRows`). ``verify_pixels``: check each row's
    pixel data against its ``pixel_digest`` (see `MultiModalInputs.from_dict`)."""
    if isinstance(table, pa.Table):
        # a gathered table is often many small chunks (slices of the memory-mapped file):
        # read chunk by chunk rather than copy them into one
        rows = []
        for batch in table.to_batches():
            rows += _rows_from_batch(batch, len(rows), verify_pixels)
        return rows
    return _rows_from_batch(table, 0, verify_pixels)


def _need_list(c: pa.Array, name: str, depth: int) -> bool:
    """Check ``c`` is a list column ``depth`` levels deep; False when the inner level is
    untyped (``list<null>``) and empty in every row (then the rows are empty)."""
    t = c.type
    for level in range(depth):
        if pa.types.is_null(t) and level and len(c) == 0:
            return False
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise InputError(f"column {name!r}", where="", column=name, stage="validate",
                             expected=f"a {depth}-level list", found=str(c.type),
                             fix="check the table with mmpipe.validate_dataset")
        c, t = c.values, t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or (pa.types.is_null(t) and len(c) == 0)):
        raise InputError(f"column {name!r}", where="", column=name, stage="validate", expected="numbers",
                         found=str(c.type if depth == 0 else t), fix="check the table with mmpipe.validate_dataset")
    return True


# A column read once for the whole batch: (offsets into values, values, valid mask or None).
_Parts = tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]


def _not_encoded(column: str) -> InputError:
    return InputError(f"no {column!r} column; this is not a table of rows produced by mmpipe.encode", where="",
                      column=column, stage="validate", expected=f"a {column!r} column", found=f"no {column!r} column",
                      fix="encode the raw rows with mmpipe.encode")


def _valid(c: pa.Array) -> Optional[np.ndarray]:
    """bool [n] of non-null rows, or None when no row is null."""
    return None if c.null_count == 0 else ~np.asarray(c.is_null())


def _is_numbers(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _read_columns(table: pa.RecordBatch, columns: tuple) -> tuple[dict, dict, dict, dict]:
    """Every column but ``family``, read once for the whole batch as its kind stores it
    (``columns``: the kind's `mmpipe.records.codec.Column` declarations): (flat lists, nested
    lists, compact pixel bytes) as `_Parts`, the other declared columns as python values per
    row; of the columns not declared, the lists of numbers (flat) and nothing else."""
    declared = {c.name: c for c in columns if not callable(c)}
    flat, nested, blobs, python = {}, {}, {}, {}
    for k in table.schema.names:
        c, col = declared.get(k), table.column(k)
        if c is not None and (c.store == "object" or c.ndim == 0):  # scalars, strings, source files
            if k != "family":
                python[k] = col.to_pylist()
        elif c is not None and c.store == "bytes":
            blobs[k] = _blob_parts(col, k)
        elif c is not None and c.ndim == 2 and not c.flat:
            nested[k] = _nested_parts(col, k)
        elif (c is not None and (c.ndim == 1 or c.flat)) or k == "input_ids":
            _need_list(col, k, 1)
            flat[k] = (*_list_parts(col), _valid(col))
        elif pa.types.is_list(col.type) and _is_numbers(col.type.value_type):
            flat[k] = (*_list_parts(col), _valid(col))  # a processor output of the generic path
    return flat, nested, blobs, python


def _nested_parts(c: pa.Array, k: str) -> _Parts:
    """A two-level list column (positions, grids, float pixels): row b's values are the inner
    lists of its outer entries, back to back."""
    typed = _need_list(c, k, 2)  # before reading offsets: the column may not be a list at all
    outer = c.offsets.to_numpy()
    if not typed:  # every row empty, typed list<null> by a writer that saw no values
        return np.zeros_like(outer), np.zeros(0, np.int64), _valid(c)
    inner = c.values.offsets.to_numpy()
    return inner[outer], _values_np(c.values.values), _valid(c)


def _blob_parts(c: pa.Array, k: str) -> _Parts:
    """A compact pixel column (binary: pixel bytes + end marker)."""
    if not (pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type)):
        raise InputError(f"column {k!r}", where="", column=k, stage="validate",
                         expected="binary (pixel bytes + end marker)", found=str(c.type),
                         fix="mmpipe.validate_dataset(ds, fix=True) converts older list<uint8> layouts")
    return (*_binary_parts(c), _valid(c))


def _take(parts: _Parts, b: int) -> Optional[np.ndarray]:
    """Row b's values (a view), or None for a null row."""
    off, vals, valid = parts
    if valid is not None and not valid[b]:
        return None
    return vals[off[b]:off[b + 1]]


def _nested_value(c, v: np.ndarray, n_tokens: int, fam: ModelFamily, row: int) -> np.ndarray:
    """Row values of nested `Column` ``c`` -> [n, width] (positions [3, L]: width L; grids
    [n, 3], pixels [n, patch_dim]: the declared width); a length that is no whole number of rows
    is damage, never reshaped."""
    width = n_tokens if c.width is None else column_width(c, fam)
    if width and v.size % width:
        # pixel/grid damage is pixel data vs grids (what collate reports it as); positions are plain input
        cls = InputError if c.width is None else PixelDataError
        raise cls(f"{v.size} values are not rows of {width}; the stored row is damaged", row=row, column=c.name,
                  column_in_location=True, stage="validate", expected=f"a multiple of {width} values",
                  found=f"{v.size} values", fix="re-encode it")
    return v.reshape(-1, width) if width else np.zeros((3, 0), v.dtype)


def _blob_value(k: str, block: np.ndarray, row: int) -> np.ndarray:
    """Row pixel bytes -> the bytes without their end marker (checked)."""
    if block.size == 0 or block[-1] != END_MARKER:
        raise PixelDataError(
            f"{block.size} bytes without the 0xFF end marker; the bytes were altered or not written by mmpipe",
            row=row, column=k, column_in_location=True, stage="validate", expected="pixel bytes + the 0xFF end marker",
            found=f"{block.size} bytes, the last {int(block[-1]) if block.size else None}", fix="re-encode the row",
        )
    return block[:-1]


def _rows_from_batch(table: pa.RecordBatch, first_row: int, verify_pixels: bool = False) -> list[MultiModalInputs]:
    """One record batch of stored rows -> rows (``first_row``: index of its first row, for errors)."""
    names = set(table.schema.names)
    if "family" not in names:
        raise _not_encoded("family")
    if "input_ids" not in names:
        raise _not_encoded("input_ids")
    families = table.column("family").to_pylist()
    if not families:
        return []
    columns = row_family(families[0], first_row).media.COLUMNS
    flat, nested, blobs, python = _read_columns(table, columns)
    declared = {c.name: c for c in columns if not callable(c)}
    rows = []
    for b in range(table.num_rows):
        row = first_row + b
        fam = row_family(families[b], row)  # before the pixel widths that depend on it
        d: dict[str, Any] = {"family": fam.name, **{k: v[b] for k, v in python.items()}}
        for k, parts in flat.items():
            d[k] = _take(parts, b)
        if d["input_ids"] is None:
            raise InputError("column 'input_ids' is null", row=row, column="input_ids", stage="validate",
                             expected="token ids", found="null",
                             fix="re-encode the row with mmpipe.encode")
        for k, parts in nested.items():
            v = _take(parts, b)
            if v is not None:
                d[k] = _nested_value(declared[k], v, d["input_ids"].shape[0], fam, row)
        for k, parts in blobs.items():
            v = _take(parts, b)
            if v is not None:
                d[k] = _blob_value(k, v, row)
        rows.append(MultiModalInputs.from_dict(d, row=row, verify_pixels=verify_pixels))
    return rows
