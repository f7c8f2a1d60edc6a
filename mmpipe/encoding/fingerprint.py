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
stamp: a worker runs the code it imports. The stamp also carries what else decides the rows
(`runtime_stamp`): the versions of the libraries that render, tokenize and decode (an upgraded
transformers converts transparent images by another rule) and the ``MMPIPE_*`` variables that
change them (``$MMPIPE_TRANSPARENCY``; ``$MMPIPE_MAX_IMAGE_BYTES``, which rows fail).

`processor_settings` / `quick_state`: what an encoder took from its processor. The processor is
hashed with the map's arguments, so changing it in place (its image processor's ``size``, its
chat template) moves the fingerprint; the encoder must then not be one built before the change
(``mmpipe.encode`` keys its per-process encoders on `quick_state`; an `Encoder` object refuses).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path

import numpy as np

__all__ = ["CODE_SOURCES", "CodeStamped", "StampedFunction", "code_hash", "code_stamp", "processor_settings",
           "quick_state", "runtime_stamp", "source_hash"]

# The modules whose code decides what an encoded row holds: everything `mmpipe.encode` and
# `mmpipe.encode_dataset` import, directly or inside functions (parsing, chat rendering,
# placeholders, image loading and pixels, records and their columns, M-RoPE positions, the
# family table, error texts stored under on_error="skip"). Folders mean their *.py files.
# tests/encoding/test_fingerprint.py checks this list against the import graph, so a new
# import from the encode path that is not covered here fails a test (data/stream_rows.py: the
# error texts of a stream's rows in DataLoader workers). The two other data/ modules
# come with the media strategies (their validate sections type what they find with them), and
# so do batching/media_fields.py and batching/output_padding.py (their collate sections cut and
# pad their media with them).
CODE_SOURCES = ("encoding", "images", "audio", "media", "records", "families.py", "family_fields.py", "rope.py",
                "rope_checks.py", "errors.py", "error_text.py", "model_rope.py", "_fork.py", "compat.py",
                "data/column_rules.py", "data/report.py", "data/stream_rows.py", "batching/media_fields.py",
                "batching/output_padding.py")

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


# Distributions whose version can change an encoded row: chat templates (jinja2, transformers),
# tokens (tokenizers), pixels (Pillow resizes, transformers' transparency rule, numpy / torch
# float ops), videos and audio (av, soundfile). Missing ones count as None.
RUNTIME_LIBRARIES = ("transformers", "tokenizers", "jinja2", "pillow", "numpy", "torch", "av", "soundfile")
# Environment variables read while encoding that change what a row holds (mmpipe.images.transparency
# and mmpipe.images.load name them).
RUNTIME_ENV = ("MMPIPE_TRANSPARENCY", "MMPIPE_MAX_IMAGE_BYTES")


@functools.lru_cache(maxsize=1)
def library_versions() -> tuple:
    """``((distribution, version or None), ...)`` of `RUNTIME_LIBRARIES`, read once per process."""
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return tuple((name, version(name)) for name in RUNTIME_LIBRARIES)


def runtime_stamp() -> tuple:
    """What besides mmpipe's code decides an encoded row: `library_versions()` and the values of
    the `RUNTIME_ENV` variables (read on each call: they may be set after import)."""
    return library_versions() + tuple((name, os.environ.get(name, "").strip()) for name in RUNTIME_ENV)


def code_stamp() -> tuple:
    """``(mmpipe.__version__, code_hash(), runtime_stamp())``: what every encode fingerprint includes."""
    # Read from sys.modules: importing the package from here would be an import circle, and
    # mmpipe is always imported before any of its submodules.
    return sys.modules["mmpipe"].__version__, code_hash(), runtime_stamp()


def processor_settings(processor) -> dict:
    """``{part: sha1 hex}`` of what an `Encoder` takes from ``processor`` when it is built: each
    public attribute of the processor (its image / video processor and feature extractor by their
    public settings: ``size``, ``image_mean``, ``do_resize`` ...; its chat template, token strings
    and ids) and its tokenizer (vocabulary size, chat template). Two calls differ after any of
    them is changed in place. The same settings give the same digests in any process (sorted,
    no ``id()`` or object address; an attribute of another kind counts by its type name), so
    the digests may ride in a map function's hashed state. About 0.1 ms."""
    tok = getattr(processor, "tokenizer", processor)
    out = {"tokenizer": _digest([type(tok).__name__, _len(tok), getattr(tok, "chat_template", None)])}
    if tok is not processor:
        for name, value in sorted(getattr(processor, "__dict__", {}).items()):
            if not name.startswith("_") and value is not tok:
                out[name] = _digest(_canonical(value, 0))
    return out


def quick_state(processor) -> bytes:
    """The same settings as `processor_settings`, pickled (15-90 us; comparable only within a
    process): what an encoder compares on each call to see that its processor changed in place."""
    tok = getattr(processor, "tokenizer", processor)
    parts = {k: {a: _plain(x) for a, x in vars(v).items() if not a.startswith("_")} if hasattr(v, "to_dict")
             else _plain(v)
             for k, v in getattr(processor, "__dict__", {}).items() if not k.startswith("_") and v is not tok} \
        if tok is not processor else {}
    try:
        return pickle.dumps((_len(tok), getattr(tok, "chat_template", None), parts), 5)
    except Exception:  # an attribute that does not pickle: the slower digests
        return repr(processor_settings(processor)).encode()


def _plain(v):
    """A callable attribute by its type name, as `_canonical` counts it: a host's patched method
    (verl binds ``get_rope_index`` and a ``validate_inputs`` lambda on the processor) would pickle
    the whole processor, or fail to (1.5 ms a call, measured), and is not a setting."""
    return type(v).__name__ if callable(v) and not isinstance(v, type) else v


def _len(tok):
    try:
        return len(tok)
    except TypeError:
        return None


def _digest(value) -> str:
    return hashlib.sha1(repr(value).encode()).hexdigest()[:16]


def _canonical(v, depth: int):
    """``v`` as plain, ordered Python values whose ``repr`` is the same in every process: an
    object's public attributes one level down (a sub-processor's settings), deeper ones by type."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return [str(v.dtype), v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()]
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, dict):
        return [(repr(k), _canonical(x, depth)) for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(v, (set, frozenset)):
        return sorted(repr(_canonical(x, depth)) for x in v)
    if isinstance(v, (list, tuple)):
        return [_canonical(x, depth) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [type(v).__name__, _canonical({f.name: getattr(v, f.name) for f in dataclasses.fields(v)}, depth)]
    if depth == 0 and (hasattr(v, "to_dict") or hasattr(v, "__dict__") and not callable(v)):
        return [type(v).__name__, _canonical({k: x for k, x in vars(v).items() if not k.startswith("_")}, 1)]
    return type(v).__name__


def restore(fn, name: str, *stamp) -> "StampedFunction":
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
