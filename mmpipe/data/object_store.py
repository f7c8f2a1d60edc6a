"""Encoded datasets in object storage (``s3://``, ``gs://``, any fsspec URL): write shards, stream
them, validate and load them.

``datasets`` already moves mmpipe's encoded rows through S3 exactly (Arrow types kept, compact
pixels one ``binary`` per row): ``Dataset.to_parquet(url, storage_options=...)`` writes a shard,
``load_dataset("parquet", data_files=url, streaming=True, storage_options=...)`` streams shards
one row group at a time (memory flat in the number of shards), and s3fs retries a failed or
cut-off GET. What this module adds:

- `write_shards(ds, url, num_shards=...)`: contiguous shards ``shard-00000-of-00004.parquet``.
- `stream_encoded(data_files, ...)`: the stream ``load_dataset("parquet", streaming=True)`` gives
  (same rows, same shards for ranks and DataLoader workers, resumable), except that a truncated
  or corrupt shard raises `DamagedShardError` naming the shard and the rows read from it (there
  pyarrow's ``ArrowInvalid: Could not open Parquet input source '<Buffer>'`` ends the stream),
  or, with ``on_bad_shard="skip"``, is left out, logged and counted in ``errors=``.
- `open_table(data)` / `read_table(url)`: what `mmpipe.validate_dataset` / `mmpipe.load_encoded`
  read for a URL: one
  ``.parquet`` / Arrow file, a folder (prefix) or glob of parquet shards, or a ``save_to_disk``
  folder.

Credentials and the endpoint come from ``storage_options`` (s3fs' arguments: ``{"key", "secret",
"client_kwargs": {"endpoint_url": ...}}``) or, where a call takes none, from the environment
s3fs reads (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, a profile).
``s3fs`` is optional: ``pip install s3fs``.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional, Sequence, Union

import pyarrow as pa

from mmpipe.data.loading import READ_ERRORS, DamagedDatasetError, concat_shards
from mmpipe.error_text import fields_from_message
from mmpipe.data.shard_paths import GLOB_CHARS, filesystem, fresh, is_url, list_shards  # noqa: F401 - re-exported
from mmpipe.errors import ArgumentError, MMPipeError, worker_original

logger = logging.getLogger("mmpipe")

BAD_SHARD_POLICIES = ("raise", "skip")
# reading errors that are not a damaged file (a missing object, no access, the network): raised as they are
NOT_DAMAGE = (FileNotFoundError, PermissionError, ConnectionError, TimeoutError)
# packages whose errors mean the network or the endpoint failed (after the filesystem's own retries)
TRANSPORT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "http", "google", "gcsfs",
                     "s3fs", "adlfs", "azure", "huggingface_hub")


class ShardReadError(MMPipeError, ConnectionError):
    """Reading a shard failed in the network or at the endpoint, after the filesystem's retries
    (e.g. aiohttp's ``ClientPayloadError`` for a body cut off every time): ``shard`` its URL. Not
    a damaged shard, so ``on_bad_shard="skip"`` does not skip it. A ``ConnectionError``. Pickles
    with every field (`MMPipeError`); ``ShardReadError(text)`` of a DataLoader worker's re-raise
    takes the shard back from the text."""

    def __init__(self, shard: str, cause: Any = None, *, message: Optional[str] = None):
        original = worker_original(shard, type(self)) if cause is None and message is None else None
        if original is None and cause is None and message is None and _READ_TEXT.match(str(shard)):
            original = shard  # its own message: type(e)(*e.args), as a datasets pool rebuilds it
        if original is not None:  # torch's re-raise of a worker's error: type(e)(text)
            found = _READ_TEXT.match(original)
            shard, message = (found and found.group(1)), shard
        self.shard = shard
        super().__init__(message or (
            f"reading shard {shard!r} failed in the network or at the endpoint, after the filesystem's retries "
            f"({type(cause).__name__}: {cause}); the shard is not known to be damaged: check the endpoint and "
            "credentials, then resume from the last checkpoint, or raise the filesystem's retries "
            "(s3fs.S3FileSystem.retries, default 5)"))


_READ_TEXT = re.compile(r"reading shard '([^']*)' failed")  # what ShardReadError's own message starts with


def _check_damage(shard: str, e: BaseException) -> None:
    """Raise ``e`` unless it says the bytes of ``shard`` are damaged: a network / endpoint failure
    as `ShardReadError` naming the shard, a missing object or no access (or a bug) as it is."""
    if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__module__.split(".")[0] in TRANSPORT_MODULES:
        raise ShardReadError(shard, e) from e
    if isinstance(e, NOT_DAMAGE) or not isinstance(e, READ_ERRORS):
        raise e


def write_shards(ds, url: str, *, num_shards: int = 1, storage_options: Optional[dict] = None,
                 rows_per_row_group: Optional[int] = None) -> list[str]:
    """Write ``ds`` (an encoded ``datasets.Dataset``) as ``num_shards`` contiguous parquet shards
    ``{url}/shard-00000-of-0000N.parquet``; returns their URLs. ``rows_per_row_group``: the rows
    a reader holds at once (``datasets``' default aims at 100 MB row groups)."""
    if num_shards < 1 or num_shards > max(1, len(ds)):
        raise ArgumentError(f"num_shards must be in 1..{max(1, len(ds))} (one row per shard at least), "
                            f"got {num_shards}")
    urls = []
    for i in range(num_shards):
        target = f"{url.rstrip('/')}/shard-{i:05d}-of-{num_shards:05d}.parquet"
        fs, path = filesystem(target, storage_options)  # a fresh filesystem: the endpoint as it is now
        if not is_url(target):  # a local folder is made as an object-store prefix would be (never a bucket)
            fs.makedirs(fs._parent(path), exist_ok=True)
        with fs.open(path, "wb") as f:
            ds.shard(num_shards, i, contiguous=True).to_parquet(f, batch_size=rows_per_row_group)
        urls.append(target)
    return urls


# ---- validate / load: one table from a URL ---------------------------------------------------
def open_table(data, storage_options: Optional[dict] = None) -> tuple[pa.Table, Any]:
    """What `mmpipe.validate_dataset` / `mmpipe.load_encoded` read: `read_table` for an object-store
    URL, `mmpipe.data.loading.load_table` for anything else (a ``file://`` URL as its path)."""
    from mmpipe.data.loading import load_table

    if is_url(data):
        return read_table(data, storage_options)
    if isinstance(data, str) and data.lower().startswith("file://"):
        data = data[len("file://"):]
    if isinstance(data, (str, os.PathLike)):
        data = os.path.expanduser(os.fspath(data))  # "~/runs/enc" as a shell reads it
    if isinstance(data, (str, os.PathLike)) and _local_shards(os.fspath(data)):
        return read_table(os.path.abspath(os.fspath(data)), storage_options)  # what write_shards wrote locally
    return load_table(data)


def _local_shards(path: str) -> bool:
    """A local glob, or a local folder of ``.parquet`` shards that is no ``save_to_disk`` folder
    (what `write_shards` writes to a local path and `stream_encoded` reads): read as the same
    shards under an object-store URL are (`read_table`)."""
    if any(c in path for c in GLOB_CHARS) and not os.path.exists(path):
        return True
    if not os.path.isdir(path) or any(os.path.exists(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")):
        return False
    return any(f.endswith(".parquet") for _, _, files in os.walk(path) for f in files)


def read_table(url: str, storage_options: Optional[dict] = None) -> tuple[pa.Table, Any]:
    """``(Arrow table, datasets.Dataset or None)`` of an encoded dataset at ``url``: a
    ``save_to_disk`` folder (``state.json``; loaded by ``datasets.load_from_disk``), a folder or
    glob of ``.parquet`` shards (concatenated in name order), one ``.parquet`` or Arrow IPC file.
    Raises `ArgumentError` (nothing there; raw ``.jsonl``) or `DamagedDatasetError` naming the
    shard that cannot be read and the rows read before it."""
    from mmpipe.data.loading import ACCEPTED, RAW_SUFFIXES

    fs, path = filesystem(url, storage_options)
    fresh(fs, path)
    is_glob = any(c in path for c in GLOB_CHARS) and not fs.exists(path)
    if not is_glob and not fs.exists(path):
        raise ArgumentError(f"data {url!r} does not exist (no object or prefix there; endpoint and credentials "
                            f"from storage_options or the environment): data must be {ACCEPTED}")
    if not is_glob and fs.isdir(path):
        if fs.exists(f"{path.rstrip('/')}/state.json"):
            import datasets

            from mmpipe.data.loading import dataset_table

            ds = datasets.load_from_disk(url, storage_options={"skip_instance_cache": True, **(storage_options or {})})
            if isinstance(ds, datasets.DatasetDict):
                raise ArgumentError(f"{url!r} holds a DatasetDict {list(ds)}: validate one split")
            return dataset_table(ds), ds
    elif path.lower().endswith(RAW_SUFFIXES):
        raise ArgumentError(f"data {url!r} is a raw file, not an encoded dataset: data must be {ACCEPTED}; "
                            "encode it first (mmpipe.encode_dataset, or the CLI)")
    elif not is_glob and not path.endswith(".parquet"):
        return _read_ipc(fs, path, url), None
    tables, start = [], 0
    shards = list_shards(url, storage_options)
    for shard in shards:
        table = _read_parquet(fs, fs._strip_protocol(shard), shard, start)  # the shards share url's filesystem
        tables.append(table)
        start += table.num_rows
    return concat_shards(tables, shards, url), None


def _read_parquet(fs, path: str, url: str, start: int) -> pa.Table:
    """One shard, row group by row group: a failure names the row group and the rows before it."""
    import pyarrow.parquet as pq

    parts, group = [], None
    try:
        with fs.open(path, "rb") as f:
            reader = pq.ParquetFile(f)
            for group in range(reader.num_row_groups):
                parts.append(reader.read_row_group(group))
            return pa.concat_tables(parts) if parts else reader.schema_arrow.empty_table()
    except Exception as e:  # noqa: BLE001 - anything but damage is raised by _check_damage
        _check_damage(url, e)
        n = sum(t.num_rows for t in parts)
        raise DamagedShardError(url, rows_read=n, row_group=group, cause=e, start=start) from e


def _read_ipc(fs, path: str, url: str) -> pa.Table:
    with fs.open(path, "rb") as f:
        data = f.read()
    try:
        try:
            return pa.ipc.open_stream(pa.BufferReader(data)).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except READ_ERRORS as e:
        raise DamagedDatasetError(f"file {url!r} cannot be read as Parquet or Arrow IPC ({e})", file=url,
                                  where="", expected="Parquet or Arrow IPC", found=type(e).__name__) from e


class DamagedShardError(DamagedDatasetError):
    """A parquet shard that cannot be read (truncated, corrupt): ``file`` / ``shard`` its URL,
    ``rows_read`` the rows of that shard read before the damage, ``row_group`` the row group
    that failed (None: the footer, i.e. the file cannot be opened at all). Pickles with every field
    (`MMPipeError`); ``DamagedShardError(text)`` of a DataLoader worker's re-raise takes ``shard``,
    ``row_group`` and ``rows_read`` back from the text."""

    def __init__(self, shard: str, *, rows_read: int = 0, row_group: Optional[int] = None, cause=None,
                 start: Optional[int] = None, detail: Optional[str] = None, **kw):
        original = worker_original(shard, type(self)) if detail is None and cause is None else None
        said = _own_message(type(self), shard) if original is None and detail is None and cause is None and not kw \
            and start is None else None
        if said is not None:  # its own message: type(e)(*e.args), as a datasets pool rebuilds it
            shard, rows_read, row_group, start, detail, kw = said
        elif original is not None:  # torch's re-raise of a worker's error: type(e)(text)
            found = _DAMAGE_TEXT.match(original)
            detail, shard = shard, found and found.group(1)
            if found:
                rows_read, row_group = int(found.group(3)), found.group(2) and int(found.group(2))
        what = "its footer (the file is cut short or not parquet)" if row_group is None else f"row group {row_group}"
        if detail is None:
            readable = "" if start is None else f" (dataset rows [0, {start + rows_read}) readable)"
            detail = (f"shard {shard!r} is damaged: reading {what} failed ({cause}); {rows_read} of its rows read "
                      f"before it{readable}")
        kw.setdefault("fix", "re-write the shard from a good copy (or re-encode its rows); stream_encoded("
                             "..., on_bad_shard='skip') leaves it out and counts it")
        kw.setdefault("where", "")
        kw.setdefault("expected", "a readable parquet shard")
        kw.setdefault("found", f"{what} unreadable" if cause is not None else None)
        rows = None if start is None else (0, start + rows_read)
        kw.setdefault("rows_readable", rows)
        super().__init__(detail, file=shard, **kw)
        self.shard, self.rows_read, self.row_group = shard, rows_read, row_group

    def record(self) -> dict:
        """``{"shard", "row_group", "rows_read", "reason"}``: what ``on_bad_shard="skip"`` counts."""
        return {"shard": self.shard, "row_group": self.row_group, "rows_read": self.rows_read, "reason": str(self)}


# what DamagedShardError's own message starts with: shard, row group (None: the footer), rows read
_DAMAGE_TEXT = re.compile(r"shard '([^']*)' is damaged: reading (?:row group (\d+)|its footer).*?; (\d+) of its rows "
                          r"read before it", re.S)
_READABLE_TEXT = re.compile(r"read before it \(dataset rows \[0, (\d+)\) readable\)")
_LAST_SHARD_TEXT = re.compile(r"none of the \d+ shards can be read \(the last: '([^']*)'\)")


def _own_message(cls: type, text: Any) -> Optional[tuple]:
    """``(shard, rows_read, row_group, start, detail, fields)`` of a `DamagedShardError` whose
    message is ``text`` (``type(e)(*e.args)``), or None for any other text."""
    fields = fields_from_message(cls, text) if isinstance(text, str) else None
    detail = (fields or {}).get("detail") or ""
    damage, last = _DAMAGE_TEXT.match(detail), _LAST_SHARD_TEXT.match(detail)
    if not (damage or last):
        return None
    kw = {k: fields[k] for k in ("expected", "found", "fix", "stage")}
    if last:
        return last.group(1), 0, None, None, detail, kw
    rows_read = int(damage.group(3))
    readable = _READABLE_TEXT.search(detail)
    start = None if readable is None else int(readable.group(1)) - rows_read
    return damage.group(1), rows_read, damage.group(2) and int(damage.group(2)), start, detail, kw


# ---- streaming -------------------------------------------------------------------------------
class _Errors:
    """Holds the caller's ``errors`` list inside the stream's kwargs (a bare list there would be
    taken for a per-shard argument)."""

    def __init__(self, errors: Optional[list]):
        self.errors = errors


def _shard_tables(shards: list, *, storage_options, on_bad_shard: str, errors: _Errors, schema: pa.Schema):
    """``(key, table)`` per row group of each shard, cast to ``schema``; a damaged shard raises
    `DamagedShardError` or (``"skip"``) is logged, recorded and left."""
    import pyarrow.parquet as pq
    from datasets.table import table_cast

    systems: dict = {}  # protocol -> one filesystem for every shard of this stream
    for shard in shards:
        try:
            proto = shard.split("://", 1)[0] if "://" in shard else "file"
            if proto not in systems:
                systems[proto] = filesystem(shard, storage_options)[0]
            fs = systems[proto]
            f = fs.open(fs._strip_protocol(shard), "rb")
            reader = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001 - anything but damage is raised by _check_damage
            _check_damage(shard, e)
            _bad_shard(DamagedShardError(shard, cause=e), e, on_bad_shard, errors)
            continue
        rows = 0
        with f:
            for group in range(reader.num_row_groups):
                try:
                    table = reader.read_row_group(group)
                except Exception as e:  # noqa: BLE001 - anything but damage is raised by _check_damage
                    _check_damage(shard, e)
                    _bad_shard(DamagedShardError(shard, rows_read=rows, row_group=group, cause=e), e,
                               on_bad_shard, errors)
                    break
                yield (shard, group), table_cast(table, schema)
                rows += table.num_rows


def _bad_shard(err: "DamagedShardError", cause: Exception, on_bad_shard: str, errors: _Errors) -> None:
    if on_bad_shard == "raise":
        raise err from cause
    logger.warning("mmpipe.stream_encoded skipped the rest of a shard: %s", err.detail)
    if errors.errors is not None:
        errors.errors.append(err.record())


def stream_encoded(data_files: Union[str, os.PathLike, Sequence], *, storage_options: Optional[dict] = None,
                   on_bad_shard: str = "raise", errors: Optional[list] = None, features=None):
    """Stream encoded parquet shards (local or any fsspec URL) as a ``datasets.IterableDataset``:
    one shard per ``num_shards`` unit (rank sharding, DataLoader workers), one row group in
    memory at a time, ``state_dict()`` / ``load_state_dict()`` as ``datasets``' own streams.

    Rows equal ``load_dataset("parquet", data_files=..., streaming=True, storage_options=...)``'s
    (features from the first readable shard's schema, as ``datasets`` infers them, or
    ``features``). A shard that cannot be read raises `DamagedShardError` (``on_bad_shard=
    "raise"``) when the stream reaches it; ``"skip"`` leaves the rest of that shard out, logs a
    warning and appends ``{"shard", "row_group", "rows_read", "reason"}`` to ``errors`` (a list
    in this process: each DataLoader worker fills its own copy, so pass a
    ``multiprocessing.Manager().list()`` there). A read that fails in the network after the
    filesystem's retries raises `ShardReadError` naming the shard (never skipped).
    """
    import datasets
    from datasets.iterable_dataset import ArrowExamplesIterable

    from mmpipe.data.streaming import check_errors_sink

    if on_bad_shard not in BAD_SHARD_POLICIES:
        raise ArgumentError(f"on_bad_shard must be one of {BAD_SHARD_POLICIES}, got {on_bad_shard!r}")
    check_errors_sink(errors, "bad shards")
    shards = list_shards(data_files, storage_options)
    if features is None:
        features = _first_features(shards, storage_options, on_bad_shard)
    kwargs = {"shards": shards, "storage_options": storage_options, "on_bad_shard": on_bad_shard,
              "errors": _Errors(errors), "schema": features.arrow_schema}
    return datasets.IterableDataset(ArrowExamplesIterable(_shard_tables, kwargs),
                                    info=datasets.DatasetInfo(features=features), split=datasets.Split.TRAIN)


def _first_features(shards: list, storage_options, on_bad_shard: str):
    """``datasets.Features`` of the first shard whose footer reads (as ``datasets``' parquet
    builder infers them); a damaged shard before it raises or is recorded (read again, and
    recorded once, when the stream reaches it under ``"skip"``)."""
    import datasets
    import pyarrow.parquet as pq

    for shard in shards:
        fs, path = filesystem(shard, storage_options)
        try:
            with fs.open(path, "rb") as f:
                return datasets.Features.from_arrow_schema(pq.read_schema(f))
        except Exception as e:  # noqa: BLE001 - anything but damage is raised by _check_damage
            _check_damage(shard, e)
            if on_bad_shard == "raise":
                raise DamagedShardError(shard, cause=e) from e
    raise DamagedShardError(shards[-1], detail=f"none of the {len(shards)} shards can be read (the last: "
                                               f"{shards[-1]!r})", found=f"{len(shards)} unreadable shards")
