"""A code stamp in every encode fingerprint, so a changed mmpipe never reuses an old cache.

``datasets`` names a map's cache file after a hash of the dataset's fingerprint, the map
function and its arguments. It pickles a module-level function *by reference* (module and
name), so the hash does not see the code the function runs: after an mmpipe upgrade the same
``ds.map(mmpipe.encode, fn_kwargs=...)`` would be served the rows the old version wrote.

`StampedFunction` wraps a map function; its pickled form - what ``datasets``' ``Hasher``
hashes, and what ``num_proc`` workers and Ray receive - carries `code_stamp()`: mmpipe's
``__version__`` and a sha256 over the source of every module that shapes encode's output
(`CODE_SOURCES`). A release or any edit of those files gives a new fingerprint (a re-encode);
the same code and arguments give the same fingerprint (a cache hit). Unpickling ignores the
stamp: a worker runs the code it imports.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

__all__ = ["CODE_SOURCES", "CodeStamped", "StampedFunction", "code_hash", "code_stamp", "source_hash"]

# The modules whose code decides what an encoded row holds: everything `mmpipe.encode` and
# `mmpipe.encode_dataset` import, directly or inside functions (parsing, chat rendering,
# placeholders, image loading and pixels, records and their columns, M-RoPE positions, the
# family table, error texts stored under on_error="skip"). Folders mean their *.py files.
# tests/encoding/test_fingerprint.py checks this list against the import graph, so a new
# import from the encode path that is not covered here fails a test. The two data/ modules
# come with the media strategies (their validate sections type what they find with them), and
# so do batching/media_fields.py and batching/output_padding.py (their collate sections cut and
# pad their media with them).
CODE_SOURCES = ("encoding", "images", "audio", "media", "records", "families.py", "family_fields.py", "rope.py",
                "rope_checks.py", "errors.py", "model_rope.py", "_fork.py", "compat.py", "data/column_rules.py",
                "data/report.py", "batching/media_fields.py", "batching/output_padding.py")

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the mmpipe/ folder


def source_hash(root: Path, sources=CODE_SOURCES) -> str:
    """sha256 hex digest over the ``*.py`` files named by ``sources`` under ``root`` (paths
    and bytes, in sorted order; missing files are skipped, so a source-less install still
    hashes by version)."""
    files = []
    for name in sources:
        path = Path(root) / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path] if path.is_file() else []
    digest = hashlib.sha256()
    for path in sorted(files):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """`source_hash` of the installed mmpipe, computed once per process (about a millisecond)."""
    return source_hash(_PACKAGE_ROOT)


def code_stamp() -> tuple[str, str]:
    """``(mmpipe.__version__, code_hash())``: what every encode fingerprint includes."""
    # Read from sys.modules: importing the package from here would be an import circle, and
    # mmpipe is always imported before any of its submodules.
    return sys.modules["mmpipe"].__version__, code_hash()


def restore(fn, name: str, version: str, code: str) -> "StampedFunction":
    """Unpickle a `StampedFunction` (the stamp is only there to be hashed)."""
    return StampedFunction(fn, name)


class StampedFunction:
    """A ``dataset.map`` function whose pickled form carries `code_stamp()`.

    Calls go straight to ``fn`` (same arguments, same result). Name, docstring and signature
    (``inspect.signature`` follows ``__wrapped__``) are ``fn``'s, or the given ``name``.
    ``fn`` must pickle: a module-level function (by reference) or a picklable object (by value).
    """

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__name__ = self.__qualname__ = name or getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return restore, (self.fn, self.__name__, *code_stamp())

    def __repr__(self) -> str:
        return f"<mmpipe map function {self.__name__}>"


class CodeStamped:
    """Mixin: the pickled state (what ``datasets`` hashes for a map function that is an
    object, e.g. ``ds.map(Encoder(processor))``) carries `code_stamp()`, so an upgrade or a code
    edit re-encodes as it does for ``mmpipe.encode``; unpickling drops the stamp.

    ``RUNTIME_STATE``: attributes that change while the object works (counters, caches) and so
    are neither hashed nor shipped; unpickling calls ``fresh_runtime_state()`` to rebuild them.
    Without this an object's fingerprint changed after its first map (no cache hit ever)."""

    STAMP_KEY = "_mmpipe_code_stamp"
    RUNTIME_STATE: tuple = ()

    def fresh_runtime_state(self) -> None:
        """Set the ``RUNTIME_STATE`` attributes to their starting values."""

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in self.RUNTIME_STATE}
        state[self.STAMP_KEY] = code_stamp()
        return state

    def __setstate__(self, state):
        state = dict(state)
        state.pop(self.STAMP_KEY, None)
        self.__dict__.update(state)
        self.fresh_runtime_state()
