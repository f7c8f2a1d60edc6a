"""Ray Data: encode raw rows with ``ray.data.Dataset.map_batches`` on a Ray cluster.

`RayBatchEncoder` is a callable class: Ray builds one instance per actor (worker), so the
processor is loaded once per worker, and calls it on each batch. A batch in any Ray batch
format (``"pyarrow"``, ``"numpy"``, ``"pandas"``) goes in; an Arrow table with exactly the
columns and types ``datasets.map(mmpipe.encode)`` stores comes out (`mmpipe.MultiModalInputs.
arrow_schema`: compact pixels are one ``binary`` value per row), so the rows are equal to
those of ``datasets.map`` and a parquet written by Ray loads with ``datasets``.

Example (local, or on a cluster: see the README, "Beyond one process")::

    import ray
    ds = ray.data.read_parquet("/shared/raw/")                # or ray.data.from_huggingface(hf_ds)
    enc = ds.map_batches(RayBatchEncoder, fn_constructor_args=("/shared/models/Qwen2.5-VL-7B",),
                         fn_constructor_kwargs={"max_length": 4096, "truncation": "drop"},
                         batch_size=64, concurrency=8, batch_format="pyarrow")
    enc.write_parquet("/shared/encoded/")
    train = datasets.load_dataset("parquet", data_files="/shared/encoded/*.parquet")["train"]

``ray`` is an optional extra (``pip install -e ".[ray]"``); this module does not import it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import ArgumentError
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.processors import load_processor
from mmpipe.records.row import MultiModalInputs


def _plain(value: Any) -> Any:
    """Ray's numpy batch values -> what `mmpipe.encode` parses: object arrays (lists, structs)
    become lists, numpy strings/scalars become Python ones; numeric arrays (e.g. uint8
    images) stay arrays."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value] if value.dtype == object else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.str_):
        return str(value)
    if isinstance(value, np.bytes_):
        return bytes(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def batch_rows(batch: Any) -> list[dict]:
    """One Ray batch (``pyarrow.Table``, ``pandas.DataFrame`` or dict of numpy / pyarrow
    columns) -> a list of raw row dicts."""
    if isinstance(batch, (pa.Table, pa.RecordBatch)):
        return batch.to_pylist()
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas, without importing it
        return [_plain(r) for r in batch.to_dict("records")]
    if isinstance(batch, dict):
        cols = {k: (v.to_pylist() if isinstance(v, (pa.Array, pa.ChunkedArray)) else v) for k, v in batch.items()}
        n = len(next(iter(cols.values()))) if cols else 0
        return [{k: _plain(v[i]) for k, v in cols.items()} for i in range(n)]
    raise TypeError(f"expected a Ray batch (pyarrow.Table, pandas.DataFrame or dict of columns), found {type(batch).__name__}")


def _offsets(counts) -> pa.Array:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return pa.array(out.astype(np.int32))


def _column(values: list, typ: pa.DataType) -> pa.Array:
    """Stored-row values of one column (numpy arrays from `MultiModalInputs.to_dict`) -> Arrow."""
    if pa.types.is_list(typ) and pa.types.is_list(typ.value_type):  # 2-D [n, width] per row
        inner_t = typ.value_type.value_type
        arrs = [np.asarray(v) for v in values]
        widths = [a.shape[1] if a.ndim == 2 else 0 for a in arrs]
        inner_counts = [w for a, w in zip(arrs, widths) for _ in range(a.shape[0])]
        flat = np.concatenate([a.reshape(-1) for a in arrs]) if arrs else np.zeros(0)
        inner = pa.ListArray.from_arrays(_offsets(inner_counts), pa.array(flat.astype(inner_t.to_pandas_dtype()), inner_t))
        return pa.ListArray.from_arrays(_offsets([a.shape[0] for a in arrs]), inner)
    if pa.types.is_list(typ):
        arrs = [np.asarray(v).reshape(-1) for v in values]
        flat = np.concatenate(arrs) if arrs else np.zeros(0)
        vals = pa.array(flat.astype(typ.value_type.to_pandas_dtype()), typ.value_type)
        return pa.ListArray.from_arrays(_offsets([len(a) for a in arrs]), vals)
    return pa.array([v.item() if isinstance(v, np.generic) else v for v in values], type=typ)


def rows_to_arrow(rows: Sequence[dict], schema: pa.Schema) -> pa.Table:
    """Stored rows (``MultiModalInputs.to_dict()``) -> an Arrow table with ``schema`` (the
    layout ``datasets.map(mmpipe.encode)`` writes), built from flat buffers."""
    return pa.Table.from_arrays([_column([r[f.name] for r in rows], f.type) for f in schema], schema=schema)


class RayBatchEncoder:
    """``map_batches`` callable class: raw-row batch -> encoded Arrow table (one row per kept row).

    Args:
        processor: a path every worker can read (`mmpipe.processors.load_processor`), a
            zero-argument factory, or a processor object (shipped pickled to each worker).
            Loaded once, in ``__init__``, i.e. once per Ray actor.
        keep_columns: input columns copied to the output (e.g. an id).
        index_column: a column whose value names the row in error messages (Ray batches
            carry no global row index).
        **options: `mmpipe.Encoder` options (``max_length``, ``truncation``, ``pixels``,
            ``on_error`` ...). ``truncation="drop"`` leaves rows out (count them with
            ``ds.count()``); ``on_error="skip"`` keeps a failing row as an empty row with its
            error in ``mmpipe_error``, as ``datasets.map`` does.

    ``__call__(batch)`` -> ``pyarrow.Table`` with `MultiModalInputs.arrow_schema(pixels, labels)`
    plus ``keep_columns``.
    """

    def __init__(self, processor: Any, *, keep_columns: Sequence[str] = (), index_column: Optional[str] = None,
                 **options):
        self.processor = load_processor(processor)
        self.encoder = Encoder(self.processor, **options)
        self.keep_columns = list(keep_columns)
        self.index_column = index_column
        self.schema = MultiModalInputs.arrow_schema(self.encoder.pixels, self.encoder.labels)
        if getattr(self.encoder, "on_error", "raise") == "skip":
            self.schema = self.schema.append(pa.field(ERROR_COLUMN, pa.string()))

    def __call__(self, batch: Any) -> pa.Table:
        rows = batch_rows(batch)
        out, kept = [], []
        for i, raw in enumerate(rows):
            idx = raw.get(self.index_column) if self.index_column else None
            row = self.encoder.encode_one(raw, idx)  # None: dropped by truncation="drop"
            if row is not None:
                out.append(row)
                kept.append(i)
        table = rows_to_arrow(out, self.schema)
        if self.keep_columns:
            src = batch if isinstance(batch, (pa.Table, pa.RecordBatch)) else None
            for name in self.keep_columns:
                if name in table.column_names:
                    raise ArgumentError(f"keep_columns: {name!r} is an encoded column; keep_columns accepts input "
                                        "columns only: rename the input column")
                if src is not None and name in src.column_names:
                    col = src.column(name).take(pa.array(kept, pa.int64()))
                elif isinstance(batch, dict) and isinstance(batch.get(name), np.ndarray) and batch[name].dtype != object:
                    col = pa.array(batch[name][np.asarray(kept, np.int64)])  # keeps the dtype when no row is left
                else:
                    col = pa.array([rows[i][name] for i in kept])
                table = table.append_column(name, col)
        return table
