"""Streaming: encode a ``datasets.IterableDataset`` and split it over ranks, every row once.

``IterableDataset.map(mmpipe.encode, fn_kwargs={"processor": p})`` works as-is (per row and
``batched=True``), except over a decoding ``datasets.Image()`` column: a stream decodes each row
before the map function sees it, so a corrupt image ends the iteration inside ``datasets``
(PIL's ``UnidentifiedImageError``; no ``on_error`` can catch it). Map `undecoded_stream(ds)`
instead (mmpipe decodes the bytes itself: the row's `ImageError`, or its ``mmpipe_error``
record under ``on_error="skip"``), or use `encode_stream`, which does so. This module adds what
a multi-node job needs around it:

- `shard_for_rank(ds, rank, world_size)`: the rank's part of a raw stream, each row on
  exactly one rank, and encoded by that rank only. ``datasets.distributed.split_dataset_by_node``
  gives every row once too, but when ``ds.num_shards`` is not a multiple of ``world_size``
  it falls back to keeping every ``world_size``-th example *after* the whole pipeline, so a
  ``map(mmpipe.encode)`` runs on every row on every rank (measured: 2 ranks, 14 rows -> 14
  encode calls per rank). Here that case keeps the rank's rows before any map, on the
  undecoded images (``mmpipe.encode`` decodes them itself).
- `encode_stream(ds, processor, **options)`: the batched map with the stored columns and
  their `datasets.Features` declared (`mmpipe.MultiModalInputs.features`); under
  ``on_error="skip"`` failed rows are left out, logged and counted (``errors=``).
- `exactly_once(per_rank_keys, expected_keys)`: which keys were missed or seen twice.
- `epoch_shuffle(ds, seed=..., num_workers=...)`: a per-epoch stream shuffle that resumes
  exactly (see Resuming below).
- `load_loader_state(loader, state)`: a ``StatefulDataLoader`` checkpoint loaded, checked against
  the loader's ``num_workers`` (see Resuming below).

Already-encoded shards (local or on S3) stream with `mmpipe.data.object_store.stream_encoded`
(one shard per rank / worker unit, a damaged shard named); `shard_for_rank` splits that stream too.

Example (one process per rank, e.g. under torchrun)::

    raw = datasets.load_dataset("parquet", data_files=files, streaming=True)["train"]
    mine = mmpipe.data.streaming.shard_for_rank(raw, rank, world_size)
    enc = mmpipe.data.streaming.encode_stream(mine, processor, max_length=4096, truncation="drop")
    loader = DataLoader(enc, batch_size=8, collate_fn=mmpipe.Collator(processor), num_workers=2)

With DataLoader workers every rank must use the same ``num_workers`` (the shards, or the
rows of a stream with too few shards, are then split identically on every rank).

Resuming. What these functions return is a ``datasets.IterableDataset``, whose own
``state_dict()`` / ``load_state_dict()`` (shard and row position, through ``map``, ``filter``
and ``select_columns``) torchdata's ``StatefulDataLoader`` saves per DataLoader worker. Exact
(tested: SIGKILL between checkpoints, a fresh process resumes from the last one, every batch
byte-equal to an uninterrupted run's, ``num_workers=2`` with prefetching, across an epoch
boundary with ``set_epoch``): ``shard_for_rank`` (both strategies) then ``encode_stream``.
Per-epoch shuffles: use `epoch_shuffle` (a plain ``ds.shuffle(...)`` fails to resume with
DataLoader workers when a worker reads fewer shards than ``max_buffer_input_shards``, 10 by
default: ``IndexError`` inside ``datasets``' ``load_state_dict``, datasets 5.2). Not elastic: the
saved position is per rank and per worker, so resume a stream with the same ``world_size`` and
``num_workers`` (`mmpipe.batching.sampler.TokenBudgetBatchSampler` over a map-style dataset
resumes on any number of ranks, and through `load_loader_state` on any number of workers;
torchdata's own ``load_state_dict`` fails on another ``num_workers`` with a bare ``AssertionError``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Optional, Sequence

from mmpipe.data.stream_rows import StreamRows, position_caveat
from mmpipe.data.stream_skips import check_errors_sink, leave_out
from mmpipe.errors import ArgumentError, is_integer

logger = logging.getLogger("mmpipe")
STRATEGIES = ("auto", "shards", "examples")


class _KeepEvery:
    """Batched ``filter`` function: keep stream positions ``i`` with ``i % step == offset``."""

    def __init__(self, step: int, offset: int):
        self.step, self.offset = step, offset

    def __call__(self, batch: dict, indices: list[int]) -> list[bool]:
        return [i % self.step == self.offset for i in indices]


def shard_for_rank(ds, rank: int, world_size: int, *, strategy: str = "auto", num_shards: Optional[int] = None):
    """The part of ``ds`` that rank ``rank`` of ``world_size`` reads; over all ranks, every row once.

    Args:
        ds: a raw (not yet encoded) ``datasets.IterableDataset``, or a ``datasets.Dataset``
            (its contiguous ``1/world_size`` block, then streamed with ``num_shards`` shards,
            default 1, at most one per row of the block; raise it for DataLoader workers).
        strategy: ``"shards"`` gives each rank whole shards (no row is read twice; ranks get
            unequal counts when ``ds.num_shards % world_size != 0``); ``"examples"`` keeps
            stream positions ``rank, rank + world_size, ...`` before anything else runs;
            ``"auto"`` takes shards when they divide evenly, else examples.

    Returns an ``IterableDataset``. Call it *before* ``map(mmpipe.encode)``: a map applied
    earlier still runs on every row of the stream (with ``"examples"``).
    """
    import datasets
    from datasets.distributed import split_dataset_by_node

    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    _check_rank(rank, world_size)
    rank, world_size = int(rank), int(world_size)  # numpy ints (a rank computed from an array) as Python's
    if isinstance(ds, datasets.Dataset):
        return _rank_block(ds, rank, world_size, num_shards)
    if not isinstance(ds, datasets.IterableDataset):
        raise ArgumentError(f"ds must be a datasets.Dataset or IterableDataset, found {type(ds).__name__}: "
                            "load it with datasets.load_dataset(..., streaming=True)")
    if num_shards is not None:
        raise ArgumentError("num_shards applies to a map-style Dataset; an IterableDataset keeps its own shards")
    n = ds.num_shards
    if strategy == "shards" or (strategy == "auto" and n % world_size == 0):
        if n < world_size:
            raise ArgumentError(
                f"strategy='shards' needs at least one shard per rank: the stream has {n} shard(s) for "
                f"world_size={world_size}; use strategy='examples' or write the data in more files"
            )
        return split_dataset_by_node(ds, rank=rank, world_size=world_size, strategy="shards")
    # Keep this rank's positions on undecoded rows: a filter on decoded rows would decode
    # every image on every rank. (A stream with unknown features decodes nothing itself.)
    undecoded = ds.decode(False) if ds.features is not None else ds
    # batches of world_size rows: the rank's first row comes after world_size rows are read, not
    # after datasets' default 1,000 (raw rows, images included, held at once on every rank)
    return undecoded.filter(_KeepEvery(world_size, rank), with_indices=True, batched=True, batch_size=world_size)


def _check_rank(rank, world_size) -> None:
    if not is_integer(world_size) or world_size < 1:
        raise ArgumentError(f"world_size must be an int >= 1 (the number of ranks), got {world_size!r}")
    if not is_integer(rank) or not 0 <= rank < world_size:
        raise ArgumentError(f"rank must be in 0..{world_size - 1} for world_size={world_size} (an int), got {rank!r}")


def _rank_block(ds, rank: int, world_size: int, num_shards: Optional[int]):
    """Rank ``rank``'s contiguous block of the map-style ``ds``, streamed with ``num_shards``
    shards (at most one per row of the block)."""
    from datasets.distributed import split_dataset_by_node

    if num_shards is not None and (not is_integer(num_shards) or num_shards < 1):
        raise ArgumentError(f"num_shards must be an int >= 1 (the stream's shards, for DataLoader workers), "
                            f"got {num_shards!r}")
    num_shards = None if num_shards is None else int(num_shards)
    if len(ds) < world_size:
        raise ArgumentError(f"the dataset has {len(ds)} rows for world_size={world_size}: ranks {len(ds)}.."
                            f"{world_size - 1} would read none (and wait at the first collective); use at most "
                            f"{len(ds)} ranks or more data")
    part = split_dataset_by_node(ds, rank=rank, world_size=world_size)
    return part.to_iterable_dataset(num_shards=min(num_shards or 1, len(part)))


def epoch_shuffle(ds, *, seed: int, buffer_size: int = 1000, num_workers: int = 0):
    """``ds.shuffle(seed, buffer_size)`` (shard order and a row buffer, reseeded by
    ``ds.set_epoch(epoch)``) that resumes exactly under ``StatefulDataLoader(num_workers=...)``:
    each DataLoader worker's buffer draws from at most as many shards as that worker reads
    (``max_buffer_input_shards``, else ``datasets`` cannot load the saved state). Call it on the
    rank's raw stream (after `shard_for_rank`, before `encode_stream`), with the loader's
    ``num_workers``."""
    if num_workers < 0 or buffer_size < 1:
        raise ArgumentError(f"need num_workers >= 0 and buffer_size >= 1, got {num_workers}, {buffer_size}")
    per_worker = max(1, ds.num_shards // max(1, num_workers))
    return ds.shuffle(seed=seed, buffer_size=buffer_size, max_buffer_input_shards=min(10, per_worker))


def _check_stream(ds, batch_size, keep_columns) -> None:
    import datasets

    if not isinstance(ds, datasets.IterableDataset):
        fix = ("stream it with ds.to_iterable_dataset(num_shards=...) or shard_for_rank(ds, rank, world_size), "
               "or encode it whole with mmpipe.encode_dataset") if isinstance(ds, datasets.Dataset) else \
              "load it with datasets.load_dataset(..., streaming=True) or IterableDataset.from_generator"
        raise ArgumentError(f"encode_stream needs a datasets.IterableDataset, got {type(ds).__name__}: {fix}")
    if not is_integer(batch_size) or batch_size < 1:  # datasets reads the WHOLE stream as one batch for <= 0 / None
        raise ArgumentError(f"batch_size must be an int >= 1 (rows encoded per call), got {batch_size!r}")
    if isinstance(keep_columns, str) or not all(isinstance(c, str) for c in keep_columns):
        raise ArgumentError(f"keep_columns must be a list of column names, got {keep_columns!r}")
    known = ds.features
    missing = [c for c in keep_columns if known is not None and c not in known]
    if missing:
        raise ArgumentError(f"keep_columns {missing} are not columns of the stream (its columns: {list(known)})")


def undecoded_stream(ds):
    """``ds`` (an ``IterableDataset``) with every ``datasets.Image()`` / ``Video()`` feature read
    undecoded (``{"bytes", "path"}``): mmpipe decodes them itself, so a corrupt image is its row's
    `mmpipe.errors.ImageError` (recorded under ``on_error="skip"``) instead of PIL's error inside
    ``datasets``' iteration, which decodes a row before any map function sees it. A stream of
    unknown features is returned as is."""
    from mmpipe.encoding.dataset import undecoded_features

    if getattr(ds, "features", None) is None:
        return ds
    new = undecoded_features(ds.features)
    return ds if new is None else ds.cast(new)


def encode_stream(ds, processor, *, batch_size: int = 64, keep_columns: Sequence[str] = (),
                  errors: Optional[list] = None, dropped: Optional[list] = None, **options):
    """``ds.map(mmpipe.encode, batched=True)`` keeping only the encoded columns (plus
    ``keep_columns``), with their features declared. ``options``: `mmpipe.Encoder` options.

    ``datasets.Image()`` columns are read undecoded (`undecoded_stream`): a corrupt image fails
    its own row (``on_error="skip"`` holds) instead of ``datasets``' iteration.

    ``truncation="drop"`` leaves over-long rows out of the stream, each logged as a warning and
    its ``{"row", "reason"}`` appended to ``dropped`` when a list is given. ``on_error="skip"``
    leaves failed rows out of the stream too, each logged and its ``{"row", "stage", "column",
    "reason"}`` appended to ``errors``. ``row`` is the dataset row where the stream position is one
    (an unshuffled, unsplit stream read by one process); elsewhere (a shuffle, a rank split, several
    DataLoader workers: ``"worker"`` in the record) it is None, the record's ``stream_row`` and its
    message name the position in this process's stream (`mmpipe.data.stream_rows`), so keep an id
    column (``keep_columns=["id"]``: the record's ``"keep"``) to find the row. With DataLoader workers a
    plain list is each worker's own copy: pass ``errors=multiprocessing.Manager().list()`` (and
    ``dropped=``) to collect every worker's records.

    Raises `ArgumentError` for a ``ds`` that is no ``IterableDataset``, ``batch_size < 1`` (which
    ``datasets`` would read as "the whole stream in one batch") and unknown ``keep_columns``.
    """
    from mmpipe.encoding.dataset import encode, make_encoder
    from mmpipe.encoding.mapping import DROP_REASON_COLUMN
    from mmpipe.records.columns import ERROR_COLUMN

    check_errors_sink(errors, "failed rows")
    check_errors_sink(dropped, "dropped rows", name="dropped")
    _check_stream(ds, batch_size, keep_columns)
    batch_size = int(batch_size)  # a numpy int as Python's (datasets checks its type)
    enc = make_encoder(processor, **options)  # the options checked now; the family's kind and pixel format
    drop = enc.truncation == "drop"
    ds = undecoded_stream(ds)
    out_columns = list(enc.empty_row_dict())
    out_columns += [c for c in keep_columns if c not in out_columns]
    marks = dict(([("drop", DROP_REASON_COLUMN)] if drop else [])
                 + ([("error", ERROR_COLUMN)] if enc.on_error == "skip" else []))
    features = _stream_features(enc, ds, keep_columns, marks.values())
    caveat = position_caveat(ds)  # why a stream position is not the dataset row, if it is not
    if drop:  # dropped rows stay in the map, marked, so the filter below can record them with the failed ones
        enc.mark_dropped = True
        mapped = ds.map(StreamRows(enc, caveat), batched=True, batch_size=batch_size, with_indices=True,
                        features=features)
    else:
        mapped = ds.map(StreamRows(encode, caveat), fn_kwargs={"processor": processor, **options}, batched=True,
                        batch_size=batch_size, with_indices=True, features=features)
    if marks:  # failed / dropped rows: out of the stream, logged and counted (never an empty row the Collator takes)
        names = [c for c in keep_columns if c not in enc.empty_row_dict() and c not in marks.values()]
        mapped = leave_out(mapped, marks, names, errors=errors, dropped=dropped, batch_size=batch_size,
                           caveat=caveat)
    return mapped.select_columns(out_columns)


def _stream_features(enc, ds, keep_columns: Sequence[str], marks: Iterable[str]):
    """The ``datasets.Features`` of what ``enc`` writes for stream ``ds`` (plus ``keep_columns`` and
    the string ``marks`` columns), or None: declared where the kind's schema types every column a
    family writes (a tiled family writes some of its kind's; the generic path its processor's)."""
    import datasets

    from mmpipe.records.row import MultiModalInputs

    out_columns = list(enc.empty_row_dict())
    kind_features = MultiModalInputs.features(enc.pixels, enc.labels, enc.family.kind)
    if not all(c in kind_features for c in out_columns):
        return None
    known = ds.features or {}
    if any(c not in known for c in keep_columns):
        return None
    features = datasets.Features({c: kind_features[c] for c in out_columns})
    for c in keep_columns:
        features[c] = known[c]
    for column in marks:
        features[column] = datasets.Value("string")
    return features


def load_loader_state(loader, state: dict) -> None:
    """``loader.load_state_dict(state)`` for a torchdata ``StatefulDataLoader``, checked against its
    ``num_workers`` now (torchdata fails at the next ``iter()`` with a bare ``AssertionError``).

    A state saved with another ``num_workers`` resumes exactly when the loader's ``batch_sampler``
    holds the whole position (a map-style dataset under `TokenBudgetBatchSampler`: the workers
    keep no state; their random seeds, for random augmentations, differ with their number). A
    stream's position is saved per worker, so a stream (or a dataset with a ``state_dict``), a
    sampler without one, or a state taken between ``snapshot_every_n_steps`` snapshots raises
    `ArgumentError` naming both counts and the fix."""
    if not isinstance(state, dict) or not state:
        return loader.load_state_dict(state)
    snap = state.get("_snapshot")
    main = snap.get("_main_snapshot", {}) if isinstance(snap, dict) else state
    saved = main.get("_num_workers", 0) if snap is not None else 0
    if saved == loader.num_workers:
        return loader.load_state_dict(state)
    import torch.utils.data

    sampler, sampler_state = loader.batch_sampler, main.get("_index_sampler_state")
    lag = state.get("_steps_since_snapshot", 0)
    per_worker = isinstance(loader.dataset, torch.utils.data.IterableDataset) or callable(
        getattr(loader.dataset, "state_dict", None))  # a dataset with a state: each worker's copy saves its own
    if per_worker or lag or sampler_state is None or not callable(getattr(sampler, "load_state_dict", None)):
        why = (f"a snapshot {lag} step(s) old (snapshot_every_n_steps > 1)" if lag else
               "the dataset's position per DataLoader worker" if per_worker else
               f"a {type(sampler).__name__} with no state of its own")
        raise ArgumentError(
            f"the loader state was saved with num_workers={saved}, this loader has num_workers="
            f"{loader.num_workers}; it holds {why}, which does not carry over to another number of "
            f"workers: resume with StatefulDataLoader(..., num_workers={saved})")
    loader.load_state_dict({})  # drop a live iterator; the sampler's own state is the position
    sampler.load_state_dict(sampler_state)


@dataclass
class Coverage:
    """`exactly_once` result: keys never seen, keys seen more than once (with counts), keys
    not expected at all."""

    missing: list = field(default_factory=list)
    duplicated: dict = field(default_factory=dict)
    unexpected: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def __str__(self) -> str:
        if self.ok:
            return "every row exactly once"
        return (f"missing {len(self.missing)} (e.g. {self.missing[:5]}), duplicated {len(self.duplicated)} "
                f"(e.g. {dict(list(self.duplicated.items())[:5])}), unexpected {len(self.unexpected)} "
                f"(e.g. {self.unexpected[:5]})")


def exactly_once(per_rank_keys: Iterable[Iterable[Hashable]], expected_keys: Iterable[Hashable]) -> Coverage:
    """Check that the rows read by all ranks (any row key, e.g. an id column) cover
    ``expected_keys`` once each. ``per_rank_keys``: one iterable of keys per rank (a list, or a
    tensor / array of ids as batches give them: its elements are compared as Python values). Tuple
    keys: a rank's keys as a list (``[[(0, "a")], [(1, "b")]]``); a rank given as a tuple of
    non-tuples (a flat ``[(0, "a"), (1, "b")]``: a key or a rank's keys?) is an `ArgumentError`."""
    expected = _hashable(expected_keys.tolist() if hasattr(expected_keys, "tolist") else expected_keys,
                         "expected_keys")
    want, tuple_keys = set(expected), any(isinstance(k, tuple) for k in expected)
    seen: Counter[Any] = Counter()
    for rank, keys in enumerate(per_rank_keys):
        keys = keys.tolist() if hasattr(keys, "tolist") else keys  # a tensor's elements hash by identity
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            # a flat list of keys (["a1", "b2"]) would count each string's characters as one rank's keys
            raise ArgumentError(f"exactly_once: per_rank_keys must hold one iterable of keys per rank, e.g. "
                                f"[[ids read by rank 0], [ids read by rank 1]]; entry {rank} is {keys!r}: wrap a "
                                f"single rank's keys in a list ([keys])")
        if tuple_keys and isinstance(keys, tuple) and keys and not any(isinstance(k, tuple) for k in keys):
            raise ArgumentError(f"exactly_once: per_rank_keys[{rank}] is the tuple {keys!r} and the expected keys are "
                                "tuples: one key, or one rank's keys? Pass each rank's keys as a list, e.g. "
                                "[[keys of rank 0], [keys of rank 1]] (a single rank's: [list(keys)])")
        seen.update(_hashable(keys, f"per_rank_keys[{rank}]"))
    return Coverage(missing=[k for k in expected if k not in seen], unexpected=[k for k in seen if k not in want],
                    duplicated={k: c for k, c in seen.items() if c > 1})


def _hashable(keys: Iterable, where: str) -> list:
    """``keys`` as a list of hashable Python values (0-d tensors / numpy scalars by value), or
    `ArgumentError` naming the first key that is no key (a list: per-rank lists passed as keys)."""
    out = [k.item() if getattr(k, "ndim", None) == 0 and hasattr(k, "item") else k for k in keys]
    for i, k in enumerate(out):
        try:
            hash(k)
        except TypeError:
            raise ArgumentError(f"exactly_once: {where}[{i}] is {k!r} ({type(k).__name__}), not a row key: keys "
                                f"must be hashable (ids, strings, tuples); pass expected_keys flat (every key "
                                f"once) and per_rank_keys as one list of keys per rank, or tuple(key)") from None
    return out
