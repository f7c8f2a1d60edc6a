"""Encode, over a whole dataset: ``dataset.map(mmpipe.encode, ...)``, `encode_dataset` (map +
an exact `EncodeReport` of dropped and failed rows, for any ``num_proc``), `encode_row` (one
row -> the typed record), `drop_failed` and `undecoded_images`.

Example::

    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2,
                 **mmpipe.map_kwargs(processor, ds))
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor, "max_length": 4096,
                 "truncation": "drop"}, batched=True, remove_columns=ds.column_names,
                 **mmpipe.map_kwargs(processor, ds))
    enc, report = mmpipe.encode_dataset(ds, processor, num_proc=4, on_error="skip")

`map_kwargs` bounds memory: ``datasets`` holds ``writer_batch_size`` encoded rows (default
1,000) per process before writing, and ``batch_size`` rows (default 1,000) per batched call;
with real-size photos (~2-40 MB of pixels each) that is gigabytes per process.

Each encoded row is a stored `MultiModalInputs` dict (``input_ids`` int64 [L],
``position_ids`` int64 [3, L], ``image_grid_thw`` int64 [I, 3], ``pixel_values_u8`` uint8
[N, 3*p*p], ...); see `mmpipe.encoding.encoder`.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from mmpipe.data.stream_rows import StreamRows, stream_place
from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.fingerprint import StampedFunction, quick_state
from mmpipe.encoding.mapping import DROP_REASON_COLUMN
from mmpipe.encoding.media import SINGULAR_COLUMNS
from mmpipe.encoding.options import check_choice
from mmpipe.encoding.row_bounds import row_byte_bound, unresized_pixels
from mmpipe.encoding.videos import video_row_bytes
from mmpipe.errors import ArgumentError
from mmpipe.families import resolve_family
from mmpipe.records.arrow import most_per_row
from mmpipe.records.columns import ENCODE_PIXEL_FORMATS, ERROR_COLUMN, ROW_COLUMNS
from mmpipe.records.row import MultiModalInputs

__all__ = ["make_encoder", "EncodeReport", "ROW_BUFFER_BYTES", "map_kwargs", "max_images_per_row", "row_byte_bound",
           "encode", "encode_row", "encode_dataset", "drop_failed", "undecoded_images", "undecoded_features"]


@dataclass
class EncodeReport:
    """What ``encode_dataset`` did: rows in, rows out, dropped rows counted by reason, and
    (``on_error="skip"``) every failed row as ``{"row", "stage", "column", "reason"}``.
    ``rows_in == rows_out + sum(dropped.values()) + len(errors)``."""

    rows_in: int
    rows_out: int
    dropped: dict
    errors: list = field(default_factory=list)

    @property
    def failed(self) -> dict:
        """Failed rows counted by stage (``"parse"``, ``"image"``, ...)."""
        return dict(Counter(e["stage"] for e in self.errors))

    def __str__(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items())) or "none"
        out = f"encoded {self.rows_out} of {self.rows_in} rows; dropped: {why}"
        if self.errors:
            out += "; failed: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items()))
        return out


# Encoded bytes one map process may hold before writing (worst case: every image at max_pixels).
ROW_BUFFER_BYTES = 256 * 2**20


def map_kwargs(processor, ds=None, *, pixels: str = "uint8", max_pixels: Optional[int] = None,
               images_column: str = "images", images_per_row: Optional[int] = None,
               videos_column: str = "videos", video_options=None,
               buffer_bytes: int = ROW_BUFFER_BYTES) -> dict:
    """``{"writer_batch_size": k, "batch_size": k}`` for ``ds.map(mmpipe.encode, ...)``: ``k``
    rows of the largest possible encoded row fit in ``buffer_bytes`` (default 256 MiB) per
    process, so a map holds a bounded number of encoded bytes whatever ``num_proc`` (datasets'
    defaults, 1,000 rows each, held gigabytes with real-size photos).

    A row's byte bound: images per row (the most in ``ds[images_column]``, read from Arrow
    list lengths without touching the bytes; else ``images_per_row``, default 1) x the pixels
    of an image at ``max_pixels`` (the processor's, or the override you pass to the encoder)
    x the bytes per stored value (``pixels``: uint8 1, float32 ``4 * temporal_patch_size``,
    none 0), plus 1 MiB for token arrays, plus the videos: the most any row holds in
    ``ds[videos_column]`` x the largest video ``video_options`` (the encoder's; Qwen defaults)
    allow (`mmpipe.encoding.videos.video_row_bytes`; pass the same ``video_options`` as to the
    encoder). An image processor with ``do_resize=False`` keeps images at their own size: the
    largest image's pixels in ``ds`` (its headers, `unresized_pixels`) replace ``max_pixels``.
    ``batch_size`` is ignored by per-row maps.

    Only the keywords ``ds.map`` takes are returned: an ``IterableDataset`` (streaming; its
    ``map`` has no ``writer_batch_size``) gets ``{"batch_size": k}``, and, its list lengths being
    unknown, counts ``images_per_row`` (default 1) images per row: pass the most a row holds.
    """
    if buffer_bytes < 1:
        raise ArgumentError(f"buffer_bytes must be positive, got {buffer_bytes!r}")
    check_choice("pixels", pixels, ENCODE_PIXEL_FORMATS)
    # the options the family takes (a tiled family has no max_pixels, the generic path no pixels):
    # a format the family does not store sizes as its default one
    media = resolve_family(processor).media
    sizing = {"pixels": pixels if pixels in media.ENCODE_PIXELS else None, "max_pixels": max_pixels,
              "videos_column": videos_column, "video_options": video_options}
    enc = Encoder(processor, images_column=images_column,
                  **{k: v for k, v in sizing.items() if k not in media.ENCODE_REFUSED})
    n_images = images_per_row if images_per_row is not None else max_images_per_row(ds, images_column)
    row = row_byte_bound(enc, n_images, unresized_pixels(enc, ds, images_column))
    k = max(1, min(1000, buffer_bytes // (row + video_row_bytes(enc, ds))))
    import inspect

    kwargs = {"writer_batch_size": k, "batch_size": k}
    try:  # the keywords this dataset's map takes (IterableDataset.map: no writer_batch_size)
        params = inspect.signature(ds.map).parameters if hasattr(ds, "map") else None
    except (TypeError, ValueError):
        params = None
    if params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {key: v for key, v in kwargs.items() if key in params}
    _warn_decoding_stream(ds)
    return kwargs


def _warn_decoding_stream(ds) -> None:
    """Warn when ``ds`` is a stream (``IterableDataset``) that decodes images or videos inside
    ``datasets``: its iterator decodes each row before ``map`` calls mmpipe, so a corrupt file
    raises PIL's error there and ends the stream (datasets #6470), whatever ``on_error`` says."""
    features = getattr(ds, "features", None)
    if features is None or hasattr(ds, "data") or type(ds).__name__ != "IterableDataset":
        return
    decoding = [name for name, f in features.items() if undecoded_features({name: f}) is not None]
    if decoding:
        import warnings

        warnings.warn(
            f"this IterableDataset decodes {', '.join(map(repr, decoding))} inside datasets: a corrupt file "
            f"raises PIL's error in datasets' iterator before mmpipe.encode sees the row, and ends the "
            f"stream whatever on_error says; map mmpipe.data.undecoded_stream(ds) instead (mmpipe then "
            f"decodes each file and types a corrupt one as that row's error), or use "
            f"mmpipe.data.encode_stream", UserWarning, stacklevel=3)


def max_images_per_row(ds, images_column: str = "images") -> int:
    """The most images any row of ``ds`` holds in ``images_column`` (or in a LLaVA row's
    ``image`` list, `mmpipe.encoding.media.SINGULAR_COLUMNS`; 1 when unknown: no dataset, no
    such list column, an IterableDataset). Reads Arrow list lengths only."""
    one = SINGULAR_COLUMNS.get(images_column)
    return max(most_per_row(ds, images_column), most_per_row(ds, one) if one else 0) or 1


# id(processor) -> {(its quick state, the options): its encoder}; an entry goes with its processor
_ENCODERS: dict[int, dict[tuple, Encoder]] = {}


class _HeldEncoder(Encoder):
    """The `Encoder` `encode` keeps: it holds its processor (or a tokenizer passed as one) weakly, so
    a processor the caller dropped goes, with its tokenizer and this encoder."""

    @property
    def processor(self):
        return self._processor_ref()

    @processor.setter
    def processor(self, value) -> None:
        self._processor_ref = weakref.ref(value)

    @property
    def tokenizer(self):
        return self.processor if (held := self.__dict__["_tokenizer"]) is None else held

    @tokenizer.setter
    def tokenizer(self, value) -> None:
        self.__dict__["_tokenizer"] = None if value is self.processor else value


def _encoder_for(processor, options: dict) -> Encoder:
    """``processor``'s cached `_HeldEncoder` for ``options`` (a new one after an in-place change); a
    plain `Encoder` per call for a processor that takes no weak reference."""
    key = (quick_state(processor), tuple(sorted((k, repr(v)) for k, v in options.items())))
    mine = _ENCODERS.get(id(processor))
    enc = None if mine is None else mine.get(key)
    if enc is not None and enc.processor is processor:
        return enc
    if mine is None or any(e.processor is not processor for e in mine.values()):
        try:
            weakref.finalize(processor, _ENCODERS.pop, id(processor), None)
        except TypeError:
            return make_encoder(processor, **options)
        mine = _ENCODERS[id(processor)] = {}
    if len(mine) > 16:  # many option sets or in-place changes of one processor
        mine.clear()
    mine[key] = enc = _HeldEncoder(processor, **options)
    return enc


def make_encoder(processor, **options) -> Encoder:
    """The `Encoder` of ``processor`` (any family; the generic path, logged once, for the rest)."""
    return Encoder(processor, **options)


def _encode(example: dict, idx=None, *, processor, **options) -> dict:
    """``dataset.map`` function: raw row(s) -> encoded row(s) (see `Encoder` for options).

    Works per row and with ``batched=True``, ``with_indices=True`` (errors then name the
    row index) and ``num_proc``. The encoder is built once per process per
    (processor, its settings, options), reused while the processor lives (held weakly); a processor
    changed in place (its image processor's ``size``, its chat template, a token added) gets a new one, as the map's
    fingerprint moves. The map's cache fingerprint includes mmpipe's version
    and a hash of its encoding code (`mmpipe.encoding.fingerprint`): after an upgrade the
    same map re-encodes instead of reusing rows an older mmpipe wrote.
    """
    enc = _encoder_for(processor, options)
    # in one of several DataLoader workers an index counts in the worker's part of a stream, not the dataset
    return (StreamRows(enc, None) if idx is not None and stream_place(0, None) else enc)(example, idx)


# A callable object, not a plain function: datasets hashes a function by its name only, so the
# stamp (version + code hash) has to ride in what it pickles. Same signature, doc and results.
encode = StampedFunction(_encode, "encode")


def encode_row(example: dict, processor, idx=None, **options) -> MultiModalInputs:
    """One raw row -> a `MultiModalInputs` (the typed record, not the stored dict), for a
    processor of any family."""
    return make_encoder(processor, **options).encode_row(example, idx)


def drop_failed(ds, *, num_proc: Optional[int] = None):
    """A dataset mapped with ``on_error="skip"`` -> ``(dataset without the failed rows and
    without ERROR_COLUMN, [{"row", "stage", "column", "reason"}, ...])``.

    An ``IterableDataset`` is returned as is when its columns are known and hold no
    ERROR_COLUMN; otherwise its failed rows are known only while it streams, so this raises an
    `ArgumentError` with the filter to stream instead."""
    columns = getattr(ds, "column_names", None)
    if columns is not None and ERROR_COLUMN not in columns:
        return ds, []
    if columns is None or not hasattr(ds, "__len__"):  # an IterableDataset: its rows exist once streamed
        raise ArgumentError(
            f"drop_failed: ds must be a map-style datasets.Dataset (every row's {ERROR_COLUMN!r} is read "
            f"up front), got a {type(ds).__name__}"
            + (" whose columns are unknown" if columns is None else "")
            + f"; for a stream, drop the failed rows as they come: ds.filter(lambda r: not r[{ERROR_COLUMN!r}])"
            f".remove_columns([{ERROR_COLUMN!r}]) (json.loads(r[{ERROR_COLUMN!r}]) is each failed row's "
            "{'row', 'stage', 'column', 'reason'}), or encode a Dataset with mmpipe.encode_dataset")
    errors = [json.loads(x) for x in ds[ERROR_COLUMN] if x]
    if errors:
        ds = ds.filter(lambda r: [not x for x in r], input_columns=[ERROR_COLUMN], batched=True, num_proc=num_proc)
    return ds.remove_columns([ERROR_COLUMN]), errors


def _undecode(f) -> bool:
    """Set ``decode=False`` on every ``datasets.Image()`` / ``datasets.Video()`` inside feature
    ``f``; whether any (mmpipe decodes videos with PyAV, not datasets' torchcodec)."""
    if type(f).__name__ in ("Image", "Video"):
        if getattr(f, "decode", False) and getattr(f, "mode", None) is None:
            f.decode = False
            return True
        return False
    if isinstance(f, dict):
        return any([_undecode(v) for v in f.values()])
    if isinstance(f, (list, tuple)):
        return any([_undecode(v) for v in f])
    inner = getattr(f, "feature", None)
    return _undecode(inner) if inner is not None else False


def undecoded_features(features):
    """``datasets.Features`` with every ``Image()`` / ``Video()`` inside set to ``decode=False`` (a
    copy), or None when none decodes (`undecoded_images` for a stream's features)."""
    import copy

    import datasets

    new = copy.deepcopy(features)
    return datasets.Features(dict(new)) if _undecode(dict(new)) else None


def undecoded_images(ds):
    """``ds`` with every ``datasets.Image()`` feature (any nesting) set to ``decode=False``,
    so rows carry ``{"bytes", "path"}`` dicts instead of PIL images decoded by ``datasets``.
    Images with a forced ``mode`` are left decoding (datasets converts them)."""
    import copy

    features = getattr(ds, "features", None)
    if not features:
        return ds
    new = copy.deepcopy(features)
    if not _undecode(dict(new)) or not hasattr(ds, "data"):
        return ds
    # Same Arrow data, other features: ``Dataset(table, info=...)`` re-labels without the
    # copy ``ds.cast`` would make of every image (the storage types are identical).
    import hashlib

    import datasets

    info = ds.info.copy()
    info.features = datasets.Features(dict(new))  # rebuilt: Features caches which columns decode
    fingerprint = hashlib.sha256(f"{ds._fingerprint}:mmpipe-undecoded".encode()).hexdigest()[:16]
    out = datasets.Dataset(ds.data, info=info, split=ds.split, indices_table=getattr(ds, "_indices", None),
                           fingerprint=fingerprint)
    fmt = ds.format
    if fmt.get("type") is not None or fmt.get("columns") is not None:
        out = out.with_format(fmt["type"], columns=fmt["columns"], output_all_columns=fmt["output_all_columns"],
                              **fmt["format_kwargs"])
    return out


def encode_dataset(ds, processor, *, num_proc: Optional[int] = None, batch_size: Optional[int] = None,
                   remove_columns: bool = True, keep_columns: Sequence[str] = (), **options):
    """Encode a ``datasets.Dataset`` and report exactly what was dropped, across processes.

    Returns ``(encoded_dataset, EncodeReport)``. Rows dropped under ``truncation="drop"``
    are counted by reason, and rows failing under ``on_error="skip"`` are recorded (row
    index, stage, column, reason), from columns every worker writes, so the counts hold for
    any ``num_proc`` (an in-process counter cannot see other workers).

    ``datasets.Image()`` columns are read undecoded (``decode=False``): mmpipe decodes the
    bytes itself (same pixels, EXIF orientation included), so a corrupt image becomes this
    row's `ImageError` - recorded under ``on_error="skip"`` - instead of a crash inside
    ``datasets`` before the row reaches mmpipe. (With a plain ``ds.map``, cast them yourself.)

    ``keep_columns``: input columns kept next to the encoded ones (``id``, ``data_source``,
    ``reward_model``, ``extra_info`` ...), row for row; ``remove_columns=False`` keeps them all.

    Memory is bounded: ``batch_size`` (default: at most 64) and the writer's buffer come from
    `map_kwargs` (the largest possible encoded row), so each process holds at most about
    ``ROW_BUFFER_BYTES`` of encoded rows.
    """
    check_keep_columns(keep_columns, ds.column_names)
    enc = make_encoder(processor, **options)
    enc.mark_dropped = True
    if len(ds) == 0:  # datasets.map never calls the encoder on no rows: no encoded column would exist
        return _no_rows(ds, enc, keep_columns if remove_columns else ds.column_names), EncodeReport(0, 0, {})
    n_images = max_images_per_row(ds, enc.images_column)
    row_bytes = row_byte_bound(enc, n_images, unresized_pixels(enc, ds, enc.images_column)) + video_row_bytes(enc, ds)
    k = max(1, min(1000, ROW_BUFFER_BYTES // row_bytes))
    batch_size = batch_size or min(64, k)
    ds = undecoded_images(ds)
    out = ds.map(StampedFunction(enc), batched=True, batch_size=batch_size, num_proc=num_proc, with_indices=True,
                 writer_batch_size=k,
                 remove_columns=[c for c in ds.column_names if c not in keep_columns] if remove_columns else None,
                 desc="mmpipe.encode")
    reasons = Counter(r for r in out[DROP_REASON_COLUMN] if r)
    marks = [DROP_REASON_COLUMN] + ([ERROR_COLUMN] if ERROR_COLUMN in out.column_names else [])
    errors = [json.loads(x) for x in out[ERROR_COLUMN] if x] if len(marks) == 2 else []
    if reasons or errors:
        out = out.filter(lambda *cols: [not any(v) for v in zip(*cols)], input_columns=marks, batched=True,
                         num_proc=num_proc)
    out = out.remove_columns(marks)
    return out, EncodeReport(rows_in=len(ds), rows_out=len(out), dropped=dict(reasons), errors=errors)


def _no_rows(ds, enc: Encoder, kept: Sequence[str]):
    """The encoded dataset of a dataset with no rows: no row, the columns (and types) encode
    writes for this encoder, then ``kept`` input columns."""
    import datasets

    import pyarrow as pa

    from mmpipe.records.columns import SOURCE_LIST_COLUMNS, SOURCE_LIST_TYPE
    from mmpipe.records.row import MultiModalInputs

    inferred = datasets.Dataset.from_list([enc.empty_row_dict()]).data.schema
    # an empty list's inferred type is null: the published one instead
    published = {f.name: f for f in MultiModalInputs.arrow_schema(kind=None)}
    published.update({c: pa.field(c, SOURCE_LIST_TYPE) for c in SOURCE_LIST_COLUMNS})
    fields = [published.get(f.name, f) if _null_typed(f.type) else f for f in inferred]
    encoded = datasets.Features.from_arrow_schema(pa.schema(fields))
    features = datasets.Features({**{c: ds.features[c] for c in kept}, **encoded})  # map's order: kept first
    return datasets.Dataset.from_dict({c: [] for c in features}, features=features)


def _null_typed(t) -> bool:
    import pyarrow as pa

    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_null(t)


def check_keep_columns(keep_columns: Sequence[str], columns: Sequence[str]) -> None:
    """``keep_columns`` must name input columns (not a string, not an encoded column)."""
    if isinstance(keep_columns, str):
        raise ArgumentError(f"keep_columns must be a list of column names, got the string {keep_columns!r}")
    encoded = {name for name, _, _ in ROW_COLUMNS} | {ERROR_COLUMN, DROP_REASON_COLUMN}
    missing = [c for c in keep_columns if c not in columns]
    clash = [c for c in keep_columns if c in encoded]
    if missing:
        raise ArgumentError(f"keep_columns {missing} are not columns of the dataset; it has {list(columns)}")
    if clash:
        raise ArgumentError(f"keep_columns {clash} are encoded columns (the encoder writes them); "
                            "rename those input columns to keep them")
