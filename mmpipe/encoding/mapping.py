"""Encode, the ``datasets.map`` protocol of an `mmpipe.encoding.encoder.Encoder` (any family):
one raw row or a batch (dict of lists) -> output columns.

- A row dropped under ``truncation="drop"`` (`RowDropped`) is left out of a batched map, or
  kept as an empty row (0 tokens) whose `DROP_REASON_COLUMN` names the reason when the
  encoder marks drops (`mmpipe.encoding.dataset.encode_dataset` filters those afterwards).
- Under ``on_error="skip"`` a failing row becomes an empty row whose `ERROR_COLUMN` holds the
  JSON ``{"row", "stage", "column", "reason"}`` of its `mmpipe.errors.InputError` (``""`` on
  encoded rows).
- A batch's images are decoded ahead on the image threads (`prefetch_images`), a bounded
  window of rows at a time; results, errors and their order equal encoding row by row.
- A ``pixels="none"`` batch of a patch-grid family takes the batched layout path
  (`mmpipe.encoding.layout_batch`); the rows it leaves (bad, long, with videos) are encoded
  row by row and merged back in order: the same columns, values and errors either way.

The functions take the encoder as their first argument (any object with the `Encoder`
attributes: ``stats``, ``mark_dropped``, ``on_error``, ``encode_row`` ...).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from mmpipe._fork import ForkSafeLock
from mmpipe.encoding.layout_batch import encode_layout, takes_layout_batch
from mmpipe.encoding.options import RowDropped  # the map protocol's drop signal (re-exported)
from mmpipe.encoding.parse import UnreadableImages, parse_row, row_where
from mmpipe.errors import InputError, TruncationError
from mmpipe.images.threads import thread_pool
from mmpipe.records.columns import ERROR_COLUMN, SOURCE_LIST_COLUMNS, SOURCE_LIST_TYPE

logger = logging.getLogger("mmpipe")

__all__ = [
    "ERROR_COLUMN", "DROP_REASON_COLUMN", "RowDropped", "EncodeStats", "as_input_error", "empty_row_dict",
    "is_batch", "encode_or_drop", "map_call", "prefetch_images",
]

# Under on_error="skip" every output row carries this column: "" when encoded, else the
# JSON of {"row", "stage", "column", "reason"} (the row itself is then empty: 0 tokens).
# Set by encode_dataset (Encoder.mark_dropped): "" when encoded, else why the row was dropped.
DROP_REASON_COLUMN = "mmpipe_drop_reason"


def check_max_length(n_tokens: int, max_length, truncation: str, where: str, fix: str) -> None:
    """A row of ``n_tokens`` over ``max_length`` (None: no limit): `RowDropped` ("too_long") under
    ``truncation="drop"``, else `TruncationError` (column ``input_ids``) with ``fix``. For the
    families whose rows cannot be cut (tiles, the generic path)."""
    if max_length is None or n_tokens <= max_length:
        return
    detail = f"{where}: {n_tokens} tokens exceed max_length={max_length}"
    if truncation == "drop":
        raise RowDropped("too_long", detail)
    raise TruncationError(detail, where="", column="input_ids", expected=f"at most {max_length} tokens",
                          found=f"{n_tokens} tokens", fix=fix)


@dataclass
class EncodeStats:
    """Counts of this process's encoder: rows seen, encoded, dropped by reason."""

    rows: int = 0
    encoded: int = 0
    dropped: Counter = None  # type: ignore[assignment]
    failed: Counter = None  # type: ignore[assignment]  # on_error="skip": failures by stage

    def __post_init__(self):
        self.dropped = Counter() if self.dropped is None else self.dropped
        self.failed = Counter() if self.failed is None else self.failed

    def count(self, *, rows: int = 0, encoded: int = 0, dropped: Optional[str] = None,
              failed: Optional[str] = None) -> None:
        """Add to the counts (``dropped``: a reason, ``failed``: a stage, each counted once) under a
        lock: one Encoder may encode on many threads (async servers, Ray actors), and two threads
        counting a reason first at once both read the Counter's missing 0 (one count lost)."""
        with _COUNT_LOCK:
            self.rows += rows
            self.encoded += encoded
            if dropped is not None:
                self.dropped[dropped] += 1
            if failed is not None:
                self.failed[failed] += 1


_COUNT_LOCK = ForkSafeLock()


def as_input_error(e: Exception, row=None) -> InputError:
    """Any exception raised while encoding row ``row`` -> a located `InputError` (stage
    ``"encode"`` for failures that were not anticipated as bad input)."""
    if isinstance(e, InputError):
        return e.locate(row=row)
    return InputError(
        f"unexpected {type(e).__name__} while encoding: {e}", row=row, stage="encode",
        expected="a row mmpipe can encode", found=type(e).__name__,
        fix="this input is not handled by mmpipe; please report it with the row",
    )


def empty_row_dict(enc) -> dict:
    """The stored dict of an empty row (0 tokens) in ``enc``'s family, pixel format and labels."""
    return enc.empty_row_dict()


def _datasets_batched(example) -> Optional[bool]:
    """True for datasets' batch object (``LazyBatch``), False for its row object (``LazyRow``),
    None for anything else (a plain dict: a formatted dataset, an IterableDataset, a direct call)."""
    cls = type(example)
    if not cls.__module__.startswith("datasets."):
        return None
    return {"LazyBatch": True, "LazyRow": False}.get(cls.__name__)


def is_batch(example: dict) -> bool:
    """datasets passes dict-of-lists under batched=True. Its own batch/row objects say which
    (a per-row prompt that is a list of strings is a row: its parse then refuses it); a plain
    dict is a batch when its prompt column looks like one and every column is a sequence of
    the same length."""
    known = _datasets_batched(example)
    if known is not None:
        return known
    for key in ("messages", "prompt", "conversations"):
        v = example.get(key)
        if v is None:
            continue
        if isinstance(v, str):
            return False
        if isinstance(v, (list, tuple)):
            if not v:
                return False
            first = v[0]
            if isinstance(first, dict):
                return False
            if not (isinstance(first, (list, tuple, str)) or first is None):
                return False
            return len({len(c) if isinstance(c, (list, tuple, np.ndarray)) else -1 for c in example.values()}) == 1
    return False


def encode_or_drop(enc, example: dict, idx=None, images=None) -> tuple[Optional[dict], Optional[RowDropped]]:
    """One row -> (its output dict, None): the encoded row, or (on_error="skip" / marked drops)
    an empty row carrying why; ``(None, the RowDropped)`` when a drop cannot be recorded
    (unmarked). ``images``: the row's image futures from `prefetch_images`."""
    enc.stats.count(rows=1)
    extra = {}
    try:
        out = enc.encode_row(example, idx, _images=images).to_dict()
        enc.stats.count(encoded=1)
    except RowDropped as e:
        enc.stats.count(dropped=e.reason)
        if not enc.mark_dropped:
            logger.warning("mmpipe.encode dropped %s", e)
            return None, e
        out, extra = empty_row_dict(enc), {DROP_REASON_COLUMN: e.reason}
    except Exception as e:
        if enc.on_error != "skip" or isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        err = as_input_error(e, idx)
        enc.stats.count(failed=err.stage)
        out, extra = empty_row_dict(enc), {ERROR_COLUMN: json.dumps(err.record())}
    if enc.mark_dropped:
        out[DROP_REASON_COLUMN] = ""
    if enc.on_error == "skip":
        out[ERROR_COLUMN] = ""
    out.update(extra)
    return out, None


def _map_batch(enc, batch: dict, idx) -> dict:
    examples = _batch_examples(batch)
    n = len(examples)
    rows_idx = [idx[i] if isinstance(idx, (list, tuple, range)) else None for i in range(n)]
    if takes_layout_batch(enc):
        out, kept = _layout_batch(enc, examples, rows_idx)
    else:
        out_rows, kept = [], []
        for i, images in enumerate(prefetch_images(enc, examples, rows_idx)):
            row, _ = encode_or_drop(enc, examples[i], rows_idx[i], images)
            if row is not None:
                out_rows.append(row)
                kept.append(i)
        out = _columns_of(enc, out_rows)
    if len(kept) != n:
        _shorten_inputs(batch, out, kept)
    return out


def _columns_of(enc, out_rows: list) -> dict:
    """Output rows (dicts) -> the batch's output columns (those of an empty row when none is left)."""
    if out_rows:
        keys = list(out_rows[0])
    else:
        keys = list(empty_row_dict(enc)) + ([DROP_REASON_COLUMN] if enc.mark_dropped else []) \
            + ([ERROR_COLUMN] if enc.on_error == "skip" else [])
    return {k: [r[k] for r in out_rows] for k in keys}


def _layout_batch(enc, examples: list[dict], rows_idx: list) -> tuple[dict, list]:
    """`mmpipe.encoding.layout_batch` over the batch; the rows it leaves go through `encode_or_drop`,
    merged in batch order (same columns, values and errors as encoding row by row)."""
    columns, fast = encode_layout(enc, examples, rows_idx)
    marks = ([DROP_REASON_COLUMN] if enc.mark_dropped else []) + ([ERROR_COLUMN] if enc.on_error == "skip" else [])
    cols = dict(columns, **{k: [""] * len(fast) for k in marks})
    if fast and len(fast) == len(examples):
        return cols, list(range(len(examples)))
    good = dict(zip(fast, range(len(fast))))
    picks, kept = [], []  # per kept row: its index in cols, or its own dict
    for i in range(len(examples)):
        row = good.get(i)
        if row is None:
            row, _ = encode_or_drop(enc, examples[i], rows_idx[i])
        if row is not None:
            picks.append(row)
            kept.append(i)
    if not fast:
        return _columns_of(enc, picks), kept
    keys = list(cols) if isinstance(picks[0], int) else list(picks[0])
    return {k: [cols[k][p] if isinstance(p, int) else p[k] for p in picks] for k in keys}, kept


def _batch_examples(batch) -> list[dict]:
    """A batch (dict of lists) -> one dict per row. A column that ``datasets`` fails to decode
    for the whole batch (a corrupt image in a ``datasets.Image()`` column) is decoded row by
    row; a row that fails holds `UnreadableImages` there, which its parse reports."""
    columns = {}
    for k in list(batch.keys()):
        try:
            columns[k] = batch[k]
        except Exception:  # noqa: BLE001 - only datasets' lazy decode fails here
            if _datasets_batched(batch) is not True:
                raise
            columns[k] = [_row_value(batch, i, k) for i in range(batch.pa_table.num_rows)]
    n = len(next(iter(columns.values()))) if columns else 0
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def _row_value(batch, i: int, column: str) -> Any:
    """Row ``i``'s decoded ``column`` value of a datasets batch, or `UnreadableImages`."""
    row = batch.formatter.format_row(batch.pa_table.slice(i, 1))
    try:
        return row[column]
    except Exception as e:  # noqa: BLE001 - datasets' lazy decode of this row's value
        return UnreadableImages(row, column, e)


def _shorten_inputs(batch, out: dict, kept: list) -> None:
    """A batch lost rows: datasets merges the input columns it keeps back into the output,
    so they must have the output's length. A datasets batch (``LazyBatch``) is shortened in
    place: datasets merges it and drops ``remove_columns`` itself, so every batch writes the
    same columns with or without ``remove_columns`` (returning input columns from a batch
    that lost rows broke the writer's schema under ``remove_columns``). Any other dict (an
    IterableDataset's batch, a formatted dataset's) gets them shortened in ``out``: an
    ``IterableDataset.map`` merges a copy of the batch made before the call, so they must come
    back in ``out`` to keep the lengths equal; datasets then keeps them even if
    ``remove_columns`` names them (extra columns, rows correct): `mmpipe.encode_stream` selects
    the encoded columns (plus ``keep_columns``) for streams."""
    if _datasets_batched(batch) is True:  # the stored Arrow values: nothing decoded again
        import pyarrow as pa

        rows = pa.array(kept, type=pa.int64())
        for k in list(batch.keys()):
            if k not in out:
                batch[k] = batch.pa_table.column(k).take(rows)
        return
    for k in list(batch.keys()):
        if k not in out:
            v = batch[k]
            out[k] = [v[i] for i in kept]


def map_call(enc, example: dict, idx=None) -> dict:
    """``Encoder.__call__``: one row or a batch (dict of lists) -> output column(s)."""
    if is_batch(example):
        return _with_typed_sources(_map_batch(enc, example, idx), batched=True)
    out, dropped = encode_or_drop(enc, example, idx)
    if out is None:
        raise TruncationError(  # a documented error, like every other refusal (found by fuzzing)
            f"{dropped} (dropped: {dropped.reason}); a dropped row can only be left out of a batched map", where="",
            expected="batched=True for rows that may be dropped", found=f"a row dropped ({dropped.reason})",
            fix="pass batched=True (and remove_columns=ds.column_names) to dataset.map, or use mmpipe.encode_dataset"
        )
    return _with_typed_sources(out, batched=False)


def _with_typed_sources(out: dict, *, batched: bool) -> dict:
    """``out`` (one row, or a batch's columns) with its source columns typed (`_typed_sources`)."""
    for name in set(SOURCE_LIST_COLUMNS) & set(out):
        out[name] = [_typed_sources(v) for v in out[name]] if batched else _typed_sources(out[name])
    return out


def _typed_sources(value):
    """A row's list of source files (``image_sources``, ``audio_sources``) as an Arrow ``list<binary>``
    scalar: ``datasets`` fixes a map's column types from the first rows it writes, and from rows
    without any image (or clip) an empty Python list types the column ``list<null>``, to which
    every later row's files then fail to cast. Every row's value is typed (a batch must not mix
    scalars and lists); None (no sources stored) stays None."""
    import pyarrow as pa

    return None if value is None else pa.scalar([bytes(b) for b in value], SOURCE_LIST_TYPE)


# ---- image prefetch across a batch ---------------------------------------------------------
def _row_image_futures(enc, example: dict, idx, pool, started: set) -> Optional[list]:
    """Futures of ``Encoder.load_image`` for one row's images, or None: no images, the row
    does not parse (its encode then raises, in order), or an image object already started
    for an earlier row (the row then encodes its images itself, after that row is done: a
    lazily decoded PIL image must never be loaded by two threads at once). ``started``: the
    ids of the image objects submitted so far."""
    try:
        _, images = parse_row(example, idx=idx, images_column=enc.images_column)
    except Exception:  # noqa: BLE001 - reported by the row's own encode
        return None
    if not images or any(id(img) in started for img in images):
        return None
    started.update(id(img) for img in images)
    return enc.submit_images(images, row_where(idx), pool)


def prefetch_images(enc, examples: list[dict], rows_idx: list) -> Iterator[Any]:
    """Per row of a batch, its image futures (or None), with the images of the next rows
    already decoding on the image threads: a batch of one-image rows uses every thread, not
    one. At most ``2 * threads`` rows are in flight (bounded memory); results, errors and
    their order are those of encoding the rows one by one."""
    n_threads = enc.image_threads()  # 1 where nothing is decoded here (layout-only, sources, ...)
    if n_threads <= 1 or len(examples) <= 1:
        yield from (None for _ in examples)
        return
    pool, started, ahead = thread_pool(n_threads), set(), {}  # at most n_threads decodes at once
    window = 2 * n_threads
    for i in range(len(examples)):
        for j in range(i, min(len(examples), i + window)):
            if j not in ahead:
                ahead[j] = _row_image_futures(enc, examples[j], rows_idx[j], pool, started)
        futures = ahead.pop(i)
        yield futures
        if futures:  # the row may have failed before reading them: let them finish before a
            wait(futures)  # later row that shares an image object loads it on this thread
