"""Loading for `mmpipe.data.validate`: any accepted input -> one Arrow table, and back to a
``datasets.Dataset`` (after repairs).

Bad arguments (a path that does not exist, a ``.jsonl`` / ``.csv`` file, any other object) raise
`ArgumentError` naming what is accepted. Damaged files (a truncated or byte-flipped ``.arrow``
file, a data file listed in ``state.json`` that is missing, an unreadable ``.parquet``) raise
`DamagedDatasetError` naming the file, the record batch that failed and the rows still readable; a
missing or non-JSON ``state.json`` / ``dataset_info.json`` too. A save_to_disk folder of no rows (an
empty encode: ``datasets.load_from_disk`` cannot read it) loads with its features; ``~`` is expanded.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import pyarrow as pa

from mmpipe.errors import ArgumentError, InputError, note_fields

ACCEPTED = ("a datasets.Dataset, a save_to_disk directory of one Dataset, a .parquet or Arrow IPC file "
            "(.arrow), a folder or glob of .parquet shards (write_shards), an object-store URL of those "
            "(s3://...), or a pyarrow Table / RecordBatch")
# suffixes of raw (not encoded) data: refused up front with the way to encode them
RAW_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".zip", ".tar", ".gz")
# what reading a damaged file raises (pyarrow's ArrowInvalid / IOError are OSError / ValueError)
READ_ERRORS = (OSError, pa.ArrowInvalid, ValueError)
RESAVE = "re-save the dataset (ds.save_to_disk) from a good copy, or re-encode the raw rows"


class DamagedDatasetError(InputError):
    """A stored file of an encoded dataset cannot be read: truncated, corrupted framing, or
    missing. ``file`` is the file, ``rows_readable`` the ``(0, stop)`` dataset rows that read
    before the damage (None when unknown). Pickles with every field (`mmpipe.errors.MMPipeError`); a
    DataLoader worker's re-raise takes ``file`` and ``rows_readable`` back from their note."""

    default_stage = "validate"

    def __init__(self, detail: str = "", *, file: Optional[str] = None,
                 rows_readable: Optional[tuple] = None, **kw):
        self.file = file
        self.rows_readable = rows_readable
        kw.setdefault("fix", RESAVE)
        super().__init__(detail, **kw)  # a DataLoader worker's re-raise takes file, rows_readable from the note
        note_fields(self, file=file, rows_readable=rows_readable)


def load_table(data) -> tuple[pa.Table, Any]:
    """``(Arrow table, the datasets.Dataset or None)`` of any local input `validate_dataset`
    accepts: a ``datasets.Dataset``, a ``save_to_disk`` directory, a ``.parquet`` or Arrow IPC
    (stream or file) path, a ``pyarrow.Table`` / ``RecordBatch`` (object-store URLs:
    `mmpipe.data.object_store.open_table`). Raises `ArgumentError` for anything else (a
    ``DatasetDict`` directory, a missing path and raw ``.jsonl`` files included) and
    `DamagedDatasetError` for a file that cannot be read."""
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]), None
    if isinstance(data, pa.Table):
        return data, None
    if isinstance(data, (str, os.PathLike)):
        return _load_path(os.path.expanduser(os.fspath(data)))  # "~/data/encoded" as a shell reads it
    if hasattr(data, "data") and hasattr(data, "features"):  # a datasets.Dataset
        return dataset_table(data), data
    raise ArgumentError(f"cannot validate a {type(data).__name__}: data must be {ACCEPTED}")


def _load_path(path: str) -> tuple[pa.Table, Any]:
    if not os.path.exists(path):
        raise ArgumentError(f"data path {path!r} does not exist: data must be {ACCEPTED}")
    if os.path.isdir(path):
        return _load_dir(path)
    if path.lower().endswith(RAW_SUFFIXES):
        raise ArgumentError(f"data {path!r} is a raw {os.path.splitext(path)[1]} file, not an encoded dataset: "
                            f"data must be {ACCEPTED}; encode it first (mmpipe.encode_dataset, or the CLI)")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path), None
        except READ_ERRORS as e:
            raise DamagedDatasetError(f"file {path!r} cannot be read as Parquet ({e})", file=path,
                                      where="", expected="a readable Parquet file", found=type(e).__name__) from e
    try:
        return _read_ipc(path), None
    except READ_ERRORS as e:
        if path.endswith((".arrow", ".arrows", ".ipc", ".feather")):
            raise _ipc_damage(path, 0) from e
        raise ArgumentError(f"data {path!r} is neither a directory, a .parquet file nor an Arrow IPC file "
                            f"({e}): data must be {ACCEPTED}") from e


def _read_ipc(path: str) -> pa.Table:
    with pa.memory_map(path) as src:
        try:
            return pa.ipc.open_stream(src).read_all()
        except pa.ArrowInvalid:
            src.seek(0)
            return pa.ipc.open_file(src).read_all()


def _load_dir(path: str) -> tuple[pa.Table, Any]:
    import datasets

    saved = any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))
    if not saved and any(f.endswith(".parquet") for _, _, files in os.walk(path) for f in files):
        # a folder of shards is read by mmpipe.data.object_store.open_table (load_encoded, validate_dataset)
        raise ArgumentError(f"{path!r} is a folder of .parquet shards, no save_to_disk folder: read it with "
                            "mmpipe.load_encoded(path) or mmpipe.data.object_store.open_table(path)")
    try:
        ds = _empty_saved(path)  # (an empty Dataset is falsy)
        if ds is None:
            ds = datasets.load_from_disk(path)
    except READ_ERRORS as e:
        if not saved:
            raise ArgumentError(f"directory {path!r} is not a save_to_disk directory (no state.json): "
                                f"data must be {ACCEPTED}") from e
        damage = _metadata_damage(path) or diagnose_saved(path)
        if damage is None:
            raise
        raise damage from e
    if isinstance(ds, datasets.DatasetDict):
        raise ArgumentError(f"data must be {ACCEPTED}; got {path!r}, which holds a DatasetDict "
                            f"{list(ds)}: validate one split, load_from_disk(path)[split]")
    return dataset_table(ds), ds


def _empty_saved(path: str):
    """The ``datasets.Dataset`` of a ``save_to_disk`` directory of no rows (``state.json`` lists
    no data file: what ``save_to_disk`` writes for an empty encode, which ``load_from_disk``
    cannot read), with the features of its ``dataset_info.json``; None for any other directory."""
    import datasets
    from datasets.table import InMemoryTable

    try:
        with open(os.path.join(path, "state.json")) as f:
            if json.load(f).get("_data_files") != []:
                return None
    except (OSError, ValueError, AttributeError):
        return None  # no Dataset directory, or damaged: load_from_disk / _metadata_damage say so
    info = datasets.DatasetInfo.from_directory(path)
    if info.features is None:
        file = os.path.join(path, "dataset_info.json")
        raise DamagedDatasetError(f"{file!r} lists no features, and the directory holds no data file to read "
                                  "them from", file=file, rows_readable=(0, 0), where="",
                                  expected="features in dataset_info.json", found="features: null",
                                  fix="re-save the dataset (ds.save_to_disk) or re-encode the raw rows")
    return datasets.Dataset(InMemoryTable(info.features.arrow_schema.empty_table()), info=info)


def _metadata_damage(path: str) -> Optional[DamagedDatasetError]:
    """A `DamagedDatasetError` naming the ``state.json`` or ``dataset_info.json`` of a
    ``save_to_disk`` directory of one Dataset that is missing or not JSON, or None (both read,
    or a ``DatasetDict`` directory). ``rows_readable``: the rows its data files hold."""
    if not os.path.isfile(os.path.join(path, "state.json")):
        return None
    for name in ("state.json", "dataset_info.json"):
        file = os.path.join(path, name)
        try:
            with open(file) as f:
                json.load(f)
            continue
        except OSError:
            what = "is missing"
        except ValueError as e:
            what = f"is not JSON ({e})"
        stop = sum(_count_ipc_rows(os.path.join(path, a))[0] for a in sorted(os.listdir(path)) if a.endswith(".arrow"))
        return DamagedDatasetError(
            f"{name} of the save_to_disk directory {path!r} {what}, so datasets cannot load it; its "
            f".arrow data files hold {stop} rows", file=file, rows_readable=(0, stop), where="",
            expected=f"{name} as JSON", found="no file" if what == "is missing" else "not JSON",
            fix=f"copy {name} from a good copy of the dataset, or re-save it (ds.save_to_disk) / re-encode")
    return None


def diagnose_saved(path: str) -> Optional[DamagedDatasetError]:
    """The first damaged data file of a ``save_to_disk`` directory (listed in its ``state.json``)
    as a `DamagedDatasetError`, or None when every file reads."""
    try:
        with open(os.path.join(path, "state.json")) as f:
            files = [d["filename"] for d in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a Dataset directory: datasets' own error stands
    start = 0
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return DamagedDatasetError(
                f"data file {file!r} listed in state.json is missing; rows [0, {start}) are in the "
                f"files before it", file=file, rows_readable=(0, start), where="",
                expected=f"data file {name!r}", found="no such file")
        n, err = _count_ipc_rows(file)
        if err is not None:
            return _ipc_damage(file, start, n, err)
        start += n
    return None


def _count_ipc_rows(file: str) -> tuple[int, Optional[tuple]]:
    """``(rows read, None)`` of an Arrow IPC stream file, or ``(rows read before the damage,
    (index of the record batch that failed, the reader's message))``."""
    n, k = 0, -1  # k: the record batch being read (-1: the schema header)
    try:
        with pa.memory_map(file) as src:
            reader = pa.ipc.open_stream(src)
            k = 0
            for batch in reader:
                n += batch.num_rows
                k += 1
    except READ_ERRORS as e:
        return n, (k, str(e))
    return n, None


def _ipc_damage(file: str, start: int, n: Optional[int] = None, err: Optional[tuple] = None) -> DamagedDatasetError:
    if err is None:
        n, err = _count_ipc_rows(file)
        err = err or (-1, "unreadable as an Arrow IPC stream or file")
    k, msg = err
    what = "its schema header" if k < 0 else f"record batch {k}"
    return DamagedDatasetError(
        f"data file {file!r} is damaged (truncated or corrupted): reading {what} failed ({msg}); "
        f"rows [0, {start + n}) read before it (the file starts at row {start})", file=file,
        rows_readable=(0, start + n), where="", expected="a readable Arrow IPC file", found=f"{what} unreadable")


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


def concat_shards(tables: list, shards: list, url: str) -> pa.Table:
    """The shards' tables (``shards``: their names, in order) as one, each as the first shard's
    schema (its column order and types); shards written by different encodes (other columns:
    labels or not, another pixel format or family) are a `SchemaError` naming the first odd shard
    and its columns, not pyarrow's bare ValueError."""
    schema = tables[0].schema
    return pa.concat_tables([t if t.schema == schema else _as_first(t, schema, shard, shards[0], url)
                             for t, shard in zip(tables, shards)])


def _as_first(table: pa.Table, schema: pa.Schema, shard: str, first: str, url: str) -> pa.Table:
    from mmpipe.data.report import SchemaError

    extra = sorted(set(table.column_names) - set(schema.names))
    missing = sorted(set(schema.names) - set(table.column_names))
    why = "; ".join(([f"columns {extra} are not in the first shard"] if extra else [])
                    + ([f"columns {missing} are missing"] if missing else []))
    if not why:
        try:
            return table.select(schema.names).cast(schema)
        except (ValueError, TypeError, NotImplementedError) as e:  # pa.ArrowInvalid is a ValueError
            why = str(e)
    raise SchemaError(f"shard {shard!r} of {url!r} does not match the first shard {first!r}: {why}", where="",
                      column=(extra or missing or [None])[0], expected=f"the first shard's columns {schema.names}",
                      found=f"columns {table.column_names}",
                      fix="the shards come from different encodes (other options, processor or mmpipe version): "
                          "re-encode them together, or read each encode's shards with its own glob")

