from typing import Any
from mmpipe.records.columns import END_MARKER
from mmpipe.errors import InputError
from mmpipe.records.row import MultiModalInputs
from mmpipe.families import get_family
import numpy as np
import pyarrow as pa
# ---- stored rows straight from Arrow ------------------------------------------------------
def _list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) list array -> (offsets [n+1] into values, values as numpy), zero-copy."""
    return arr.offsets.to_numpy(), _values_np(arr.values)


def list_lengths(column) -> np.ndarray:
    """Per-row lengths of an Arrow list column (Array or ChunkedArray), int64 [n]; a null
    row counts 0. Reads the offsets only: no value is decoded."""
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray) and column.num_chunks == 0:
        return np.zeros(0, np.int64)
    return pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _values_np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)  # zero-copy for primitive values without nulls


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) binary array -> (offsets [n+1] into data, data uint8), zero-copy."""
    large = pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], np.int64 if large else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return off, data


def rows_from_arrow(table) -> list["MultiModalInputs"]:
    """Stored rows as an Arrow table (or record batch) -> `MultiModalInputs`, reading the
    column buffers directly: token columns and compact pixels are numpy views of the Arrow
    memory (no Python object per token or byte), checked like `MultiModalInputs.from_dict`.

    ``table``: what ``dataset.with_format("arrow")[indices]`` returns for a dataset made by
    ``mmpipe.encode`` (see `mmpipe.collate.ArrowRows`)."""
    if isinstance(table, pa.Table):
        # a gathered table is often many small chunks (slices of the memory-mapped file):
        # read chunk by chunk rather than copy them into one
        rows = []
        for batch in table.to_batches():
            rows += _rows_from_batch(batch, len(rows))
        return rows
    return _rows_from_batch(table, 0)


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


def _rows_from_batch(table: pa.RecordBatch, first_row: int) -> list["MultiModalInputs"]:
    names = set(table.schema.names)
    if "family" not in names:
        raise ValueError("no 'family' column; this is not a table of rows produced by mmpipe.encode")
    n = table.num_rows

    def col(name):
        return table.column(name)

    def lists(name):
        if name not in names:
            return None
        c = col(name)
        _need_list(c, name, 1)
        off, vals = _list_parts(c)
        valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
        return off, vals, valid, c

    families = col("family").to_pylist()
    ids = lists("input_ids")
    if ids is None:
        raise ValueError("no 'input_ids' column; this is not a table of rows produced by mmpipe.encode")
    per_row = {k: lists(k) for k in ("attention_mask", "mm_token_type_ids", "labels", "second_per_grid_ts")}
    nested = {}
    for k in ("position_ids", "image_grid_thw", "video_grid_thw", "pixel_values", "pixel_values_videos"):
        if k in names:
            c = col(k)
            valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
            # row b's values: the inner lists of outer entries off[b]..off[b+1], back to back
            typed = _need_list(c, k, 2)
            outer = c.offsets.to_numpy()
            if typed:
                inner = c.values.offsets.to_numpy()
                nested[k] = (inner[outer], _values_np(c.values.values), valid, len(c.values))
            else:  # every row empty, typed list<null> by a writer that saw no values
                nested[k] = (np.zeros_like(outer), np.zeros(0, np.int64), valid, 0)
    blobs = {}
    for k in ("pixel_values_u8", "pixel_values_videos_u8"):
        if k in names:
            c = col(k)
            if not (pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type)):
                raise InputError(f"column {k!r}: expected binary (pixel bytes + end marker), found {c.type}",
                                 where="", column=k, stage="validate",
                                 fix="mmpipe.validate_dataset(ds, fix=True) converts older list<uint8> layouts")
            valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
            blobs[k] = (*_binary_parts(c), valid)
    deltas = col("rope_delta").to_numpy(zero_copy_only=False) if "rope_delta" in names else None

    def take(entry, b):
        off, vals, valid, _ = entry
        if valid is not None and not valid[b]:
            return None
        return vals[off[b]:off[b + 1]]

    rows = []
    for b in range(n):
        d: dict[str, Any] = {"family": families[b], "input_ids": take(ids, b)}
        if deltas is not None:  # else from_dict derives it from the positions
            d["rope_delta"] = deltas[b]
        if d["input_ids"] is None:
            raise InputError("column 'input_ids' is null", row=first_row + b, column="input_ids", stage="validate",
                             fix="re-encode the row with mmpipe.encode")
        L = d["input_ids"].shape[0]
        for k, entry in per_row.items():
            if entry is not None:
                d[k] = take(entry, b)
        for k, (off, vals, valid, _) in nested.items():
            if valid is not None and not valid[b]:
                continue
            v = vals[off[b]:off[b + 1]]
            if k == "position_ids":
                width = L
            elif k.endswith("grid_thw"):
                width = 3
            else:
                width = get_family(d["family"]).patch_dim
            if width and v.size % width:
                raise ValueError(
                    f"row {first_row + b}, column {k!r}: {v.size} values are not rows of {width}; "
                    "the stored row is damaged - re-encode it"
                )
            d[k] = v.reshape(-1, width) if width else np.zeros((3, 0), v.dtype)
        for k, (off, data, valid) in blobs.items():
            if valid is not None and not valid[b]:
                continue
            block = data[off[b]:off[b + 1]]
            if block.size == 0 or block[-1] != END_MARKER:
                raise ValueError(
                    f"row {first_row + b}, column {k!r}: {block.size} bytes without the 0xFF end marker; the bytes were "
                    "altered or not written by mmpipe - re-encode the row"
                )
            d[k] = block[:-1]
        rows.append(MultiModalInputs.from_dict(d, row=first_row + b))
    return rows

