"""Stored rows straight from Arrow: `rows_from_arrow` reads an Arrow table of encoded rows
into `MultiModalInputs` through the column buffers (numpy views, no Python object per token
or pixel byte), checked like `MultiModalInputs.from_dict`. Stage: records (validate).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa

from mmpipe.errors import InputError, PixelDataError
from mmpipe.families import ALL_FAMILIES, ModelFamily, get_family
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

    ``table``: what ``dataset.with_format("arrow")[indices]`` returns for a dataset made by
    ``mmpipe.encode`` (see `mmpipe.collate.ArrowRows`). ``verify_pixels``: check each row's
    pixel data against its ``pixel_digest`` (see `MultiModalInputs.from_dict`)."""
    kind = _table_kind(table)
    if kind not in (None, "patches"):  # tiles and processor rows: their strategy reads them
        table = table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
        return get_family(_first_family(table)).media.rows_from_arrow(MultiModalInputs, table)
    if isinstance(table, pa.Table):
        # a gathered table is often many small chunks (slices of the memory-mapped file):
        # read chunk by chunk rather than copy them into one
        rows = []
        for batch in table.to_batches():
            rows += _rows_from_batch(batch, len(rows), verify_pixels)
        return rows
    return _rows_from_batch(table, 0, verify_pixels)


def _first_family(table) -> Optional[str]:
    if "family" not in table.column_names or not table.num_rows:
        return None
    return table.column("family")[0].as_py()


def _table_kind(table) -> Optional[str]:
    """The kind of the table's first row's family (None: no family column, no rows, unknown)."""
    fam = ALL_FAMILIES.get(_first_family(table))
    return None if fam is None else fam.kind


def _need_list(c: pa.Array, name: str, depth: int) -> bool:
    """Check ``c`` is a list column ``depth`` levels deep; False when the inner level is
    untyped (``list<null>``) and empty in every row (then the rows are empty)."""
    t = c.type
    for level in range(depth):
        if pa.types.is_null(t) and level and len(c) == 0:
            return False
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise InputError(f"column {name!r}: expected a {depth}-level list, found {c.type}", where="", column=name,
                             stage="validate", fix="check the table with mmpipe.validate_dataset")
        c, t = c.values, t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or (pa.types.is_null(t) and len(c) == 0)):
        raise InputError(f"column {name!r}: expected numbers, found {c.type if depth == 0 else t}", where="",
                         column=name, stage="validate", fix="check the table with mmpipe.validate_dataset")
    return True


_NESTED = ("position_ids", "image_grid_thw", "video_grid_thw", "pixel_values", "pixel_values_videos")
_PER_ROW = ("attention_mask", "mm_token_type_ids", "labels", "second_per_grid_ts")
_BLOBS = ("pixel_values_u8", "pixel_values_videos_u8")

# A column read once for the whole batch: (offsets into values, values, valid mask or None).
_Parts = tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]


def _not_encoded(column: str) -> InputError:
    return InputError(f"no {column!r} column; this is not a table of rows produced by mmpipe.encode", where="",
                      column=column, stage="validate", fix="encode the raw rows with mmpipe.encode")


def _valid(c: pa.Array) -> Optional[np.ndarray]:
    """bool [n] of non-null rows, or None when no row is null."""
    return None if c.null_count == 0 else ~np.asarray(c.is_null())


def _flat_columns(table: pa.RecordBatch) -> dict[str, _Parts]:
    """The one-level list columns present (input_ids, attention_mask, ...), as offsets + values."""
    out = {}
    for k in ("input_ids", *_PER_ROW):
        if k in table.schema.names:
            c = table.column(k)
            _need_list(c, k, 1)
            out[k] = (*_list_parts(c), _valid(c))
    return out


def _nested_columns(table: pa.RecordBatch) -> dict[str, _Parts]:
    """The two-level list columns present (positions, grids, float pixels): row b's values are
    the inner lists of its outer entries, back to back."""
    out = {}
    for k in _NESTED:
        if k not in table.schema.names:
            continue
        c = table.column(k)
        typed = _need_list(c, k, 2)  # before reading offsets: the column may not be a list at all
        outer = c.offsets.to_numpy()
        if typed:
            inner = c.values.offsets.to_numpy()
            out[k] = (inner[outer], _values_np(c.values.values), _valid(c))
        else:  # every row empty, typed list<null> by a writer that saw no values
            out[k] = (np.zeros_like(outer), np.zeros(0, np.int64), _valid(c))
    return out


def _blob_columns(table: pa.RecordBatch) -> dict[str, _Parts]:
    """The compact pixel columns present (binary: pixel bytes + end marker)."""
    out = {}
    for k in _BLOBS:
        if k not in table.schema.names:
            continue
        c = table.column(k)
        if not (pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type)):
            raise InputError(f"column {k!r}: expected binary (pixel bytes + end marker), found {c.type}",
                             where="", column=k, stage="validate",
                             fix="mmpipe.validate_dataset(ds, fix=True) converts older list<uint8> layouts")
        out[k] = (*_binary_parts(c), _valid(c))
    return out


def _take(parts: _Parts, b: int) -> Optional[np.ndarray]:
    """Row b's values (a view), or None for a null row."""
    off, vals, valid = parts
    if valid is not None and not valid[b]:
        return None
    return vals[off[b]:off[b + 1]]


def _nested_value(k: str, v: np.ndarray, n_tokens: int, fam: ModelFamily, row: int) -> np.ndarray:
    """Row values of nested column ``k`` -> [n, width] (positions [3, L], grids [n, 3], pixels
    [n, patch_dim]); a length that is no whole number of rows is damage, never reshaped."""
    if k == "position_ids":
        width = n_tokens
    elif k.endswith("grid_thw"):
        width = 3
    else:
        width = fam.patch_dim
    if width and v.size % width:
        # pixel/grid damage is pixel data vs grids (what collate reports it as); positions are plain input
        cls = InputError if k == "position_ids" else PixelDataError
        raise cls(f"{v.size} values are not rows of {width}; the stored row is damaged", row=row, column=k,
                  column_in_location=True, stage="validate", fix="re-encode it")
    return v.reshape(-1, width) if width else np.zeros((3, 0), v.dtype)


def _blob_value(k: str, block: np.ndarray, row: int) -> np.ndarray:
    """Row pixel bytes -> the bytes without their end marker (checked)."""
    if block.size == 0 or block[-1] != END_MARKER:
        raise PixelDataError(
            f"{block.size} bytes without the 0xFF end marker; the bytes were altered or not written by mmpipe",
            row=row, column=k, column_in_location=True, stage="validate", fix="re-encode the row",
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
    flat, nested, blobs = _flat_columns(table), _nested_columns(table), _blob_columns(table)
    deltas = table.column("rope_delta").to_numpy(zero_copy_only=False) if "rope_delta" in names else None
    digests = table.column("pixel_digest").to_pylist() if verify_pixels and "pixel_digest" in names else None
    backends = table.column("image_backend").to_pylist() if "image_backend" in names else None
    sources = table.column("image_sources").to_pylist() if "image_sources" in names else None  # pixels="source"
    rows = []
    for b in range(table.num_rows):
        row = first_row + b
        fam = row_family(families[b], row)  # before the pixel widths that depend on it
        d: dict[str, Any] = {"family": fam.name}
        if deltas is not None:  # else from_dict derives it from the positions
            d["rope_delta"] = deltas[b]
        for k, parts in flat.items():
            d[k] = _take(parts, b)
        if d["input_ids"] is None:
            raise InputError("column 'input_ids' is null", row=row, column="input_ids", stage="validate",
                             fix="re-encode the row with mmpipe.encode")
        for k, parts in nested.items():
            v = _take(parts, b)
            if v is not None:
                d[k] = _nested_value(k, v, d["input_ids"].shape[0], fam, row)
        for k, parts in blobs.items():
            v = _take(parts, b)
            if v is not None:
                d[k] = _blob_value(k, v, row)
        if digests is not None:
            d["pixel_digest"] = digests[b]
        if backends is not None:
            d["image_backend"] = backends[b]
        if sources is not None:
            d["image_sources"] = sources[b]
        rows.append(MultiModalInputs.from_dict(d, row=row, verify_pixels=verify_pixels))
    return rows
