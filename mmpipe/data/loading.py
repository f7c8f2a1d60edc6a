"""Loading for `mmpipe.data.validate`: any accepted input -> one Arrow table, and back to a
``datasets.Dataset`` (after repairs)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from mmpipe.errors import ArgumentError

ACCEPTED = ("a datasets.Dataset, a save_to_disk directory of one Dataset, a .parquet or Arrow IPC file, "
            "or a pyarrow Table / RecordBatch")


def load_table(data) -> tuple[pa.Table, Any]:
    """``(Arrow table, the datasets.Dataset or None)`` of any input `validate_dataset` accepts: a
    ``datasets.Dataset``, a ``save_to_disk`` directory, a ``.parquet`` or Arrow IPC (stream or file)
    path, a ``pyarrow.Table`` / ``RecordBatch``. Raises `ArgumentError` for anything else (a
    ``DatasetDict`` directory included: validate one split)."""
    import os

    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]), None
    if isinstance(data, pa.Table):
        return data, None
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if os.path.isdir(path):
            import datasets

            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                raise ArgumentError(f"data must be {ACCEPTED}; got {path!r}, which holds a DatasetDict "
                                    f"{list(ds)}: validate one split, load_from_disk(path)[split]")
            return dataset_table(ds), ds
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path), None
        with pa.memory_map(path) as src:
            try:
                return pa.ipc.open_stream(src).read_all(), None
            except pa.ArrowInvalid:
                src.seek(0)
                return pa.ipc.open_file(src).read_all(), None
    if hasattr(data, "data") and hasattr(data, "features"):  # a datasets.Dataset
        return dataset_table(data), data
    raise ArgumentError(f"cannot validate a {type(data).__name__}: data must be {ACCEPTED}")


def dataset_table(ds) -> pa.Table:
    """The Arrow table of a ``datasets.Dataset``: its rows, in its order (a select/shuffle view included)."""
    if getattr(ds, "_indices", None) is not None:  # a select/shuffle view: its rows, in its order
        return ds.with_format("arrow")[:]
    return ds.data.table


def table_to_dataset(table: pa.Table):
    """An in-memory ``datasets.Dataset`` over ``table`` (schema metadata dropped)."""
    import datasets
    from datasets.table import InMemoryTable

    return datasets.Dataset(InMemoryTable(table.replace_schema_metadata(None)))
