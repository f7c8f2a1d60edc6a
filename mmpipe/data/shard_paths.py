"""Shard paths on any fsspec filesystem (``s3://``, ``gs://``, local): the filesystem of a URL,
its listing refreshed, and the parquet shards a path, folder, glob or list names. Used by
`mmpipe.data.object_store`, which re-exports these names."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from mmpipe.errors import ArgumentError

GLOB_CHARS = "*?["


def is_url(path: Any) -> bool:
    """True for a string with a remote protocol (``s3://``, ``gs://``, ``hf://`` ...), False for
    local paths and ``file://``."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() not in ("file", "local")


def filesystem(url: str, storage_options: Optional[dict] = None):
    """``(fsspec filesystem, path without protocol)`` of ``url``; a missing protocol package
    (``s3fs`` for ``s3://``) raises an ImportError naming what to install."""
    import fsspec
    from fsspec.registry import known_implementations

    proto = url.split("://", 1)[0]
    # datasets adds {"hf": {...}} to a storage_options dict it is given: another protocol's options
    opts = {k: v for k, v in (storage_options or {}).items()
            if not (k != proto and k in known_implementations and isinstance(v, dict))}
    try:  # a fresh instance: fsspec's cache keys on the arguments, not on the environment (AWS_ENDPOINT_URL...)
        return fsspec.core.url_to_fs(url, **{"skip_instance_cache": True, **opts})
    except ImportError as e:
        raise ImportError(f"reading {url!r} needs fsspec's {proto}:// filesystem: "
                          f"pip install {'s3fs' if proto in ('s3', 's3a') else proto + 'fs'} ({e})") from e


def fresh(fs, path: str) -> None:
    """Forget what ``fs`` (fsspec reuses one instance per set of arguments) listed before under
    ``path``: objects written or replaced since then are seen as they are now (a stale size or
    ETag otherwise fails the read: s3fs' "no longer exists")."""
    top = path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    fs.invalidate_cache(top.rstrip("/") or None)


def _full(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def list_shards(data_files: Union[str, os.PathLike, Sequence], storage_options: Optional[dict] = None) -> list[str]:
    """The parquet shard URLs of ``data_files`` (a URL or local path, a folder / prefix, a glob, or a
    list of those), sorted within each entry. A path that exists is read as it is, glob characters
    (``[``, ``*``, ``?``) in its name included. Raises `ArgumentError` when an entry matches nothing."""
    entries = [data_files] if isinstance(data_files, (str, os.PathLike)) else data_files
    if not isinstance(entries, (list, tuple)) or not entries or not all(isinstance(e, (str, os.PathLike))
                                                                           for e in entries):
        raise ArgumentError(f"data_files must be a shard URL or path, a folder, a glob or a non-empty list of those, "
                            f"got {data_files!r}")
    out: list[str] = []
    for entry in map(os.fspath, entries):
        fs, path = filesystem(entry, storage_options)
        fresh(fs, path)
        if fs.exists(path):
            found = sorted(p for p in fs.find(path) if p.endswith(".parquet")) if fs.isdir(path) else [path]
        elif any(c in path for c in GLOB_CHARS):  # a pattern: the files it matches (not the folders)
            found = sorted(p for p, info in fs.glob(path, detail=True).items() if info.get("type") != "directory")
        else:
            found = []
        if not found:
            raise ArgumentError(f"data_files {entry!r} matches no file (no such object or prefix, or no .parquet "
                                "under it): give a shard URL, a folder of .parquet shards or a glob")
        out += [_full(fs, p) for p in found]
    return out
