"""Streaming: IterableDataset.map(mmpipe.encode) and rank splits that read every row once."""

from __future__ import annotations

import datasets
import pytest
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader

import mmpipe
from mmpipe.data import streaming
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_equal

from conftest import processor_for
from helpers import raw_dataset

FAMILY = "qwen2_5_vl"
SHARDS = (1, 2, 3, 4, 6)
WORLD_SIZES = (2, 3)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    ds = raw_dataset(tmp_path_factory.mktemp("stream"))  # 14 rows, 0..3 images each
    return ds.add_column("id", list(range(len(ds))))


@pytest.fixture(scope="module")
def reference(raw):
    """id -> the row ``Dataset.map`` stores."""
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY)})
    return {r["id"]: mmpipe.MultiModalInputs.from_dict(r) for r in enc}


class CountingEncode:
    """``mmpipe.encode`` that counts the rows it encodes (in this process)."""

    def __init__(self):
        self.rows = 0

    def __call__(self, example, idx=None, **kw):
        self.rows += len(idx) if isinstance(idx, list) else 1
        return mmpipe.encode(example, idx, **kw)


def _check_rows(rows, reference):
    assert_rows_equal(rows, [reference[r["id"]] for r in rows], what="streaming encode")


@pytest.mark.parametrize("batched", [False, True])
def test_iterable_map_equals_dataset_map(raw, reference, batched):
    it = raw.to_iterable_dataset(num_shards=3)
    enc = it.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY)}, batched=batched,
                 batch_size=4, with_indices=True, remove_columns=["messages", "images"])
    rows = list(enc)
    assert [r["id"] for r in rows] == list(range(len(raw)))
    _check_rows(rows, reference)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("num_shards", SHARDS)
def test_split_dataset_by_node_reads_every_row_once(raw, reference, world_size, num_shards):
    it = raw.to_iterable_dataset(num_shards=num_shards)
    kw = {"processor": processor_for(FAMILY)}
    per_rank = []
    for rank in range(world_size):
        part = split_dataset_by_node(it, rank=rank, world_size=world_size)
        rows = list(part.map(mmpipe.encode, fn_kwargs=kw, batched=True, batch_size=4))
        _check_rows(rows, reference)
        per_rank.append([r["id"] for r in rows])
    cov = streaming.exactly_once(per_rank, range(len(raw)))
    assert cov.ok, str(cov)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("num_shards", SHARDS)
def test_shard_for_rank_encodes_every_row_once_in_total(raw, reference, world_size, num_shards):
    it = raw.to_iterable_dataset(num_shards=num_shards)
    counter = CountingEncode()
    per_rank = []
    for rank in range(world_size):
        part = streaming.shard_for_rank(it, rank, world_size)
        rows = list(part.map(counter, fn_kwargs={"processor": processor_for(FAMILY)}, batched=True,
                             batch_size=4, with_indices=True))
        _check_rows(rows, reference)
        per_rank.append([r["id"] for r in rows])
    cov = streaming.exactly_once(per_rank, range(len(raw)))
    assert cov.ok, str(cov)
    # datasets' own split with a non-dividing shard count encodes all 14 rows on each rank
    assert counter.rows == len(raw)
    sizes = sorted(len(p) for p in per_rank)
    if num_shards % world_size:  # example-level split: balanced to within one row
        assert sizes[-1] - sizes[0] <= 1


@pytest.mark.parametrize("num_shards", [3, 4])
def test_ranks_times_dataloader_workers_read_every_row_once(raw, reference, num_shards):
    """2 ranks x 2 DataLoader worker processes each; encoded in the workers, then collated."""
    proc = processor_for(FAMILY)
    it = raw.to_iterable_dataset(num_shards=num_shards)
    per_rank = []
    for rank in range(2):
        enc = streaming.encode_stream(streaming.shard_for_rank(it, rank, 2), proc, batch_size=2, keep_columns=["id"])
        loader = DataLoader(enc, batch_size=3, num_workers=2, collate_fn=list)
        rows = [r for batch in loader for r in batch]
        _check_rows(rows, reference)
        per_rank.append([r["id"] for r in rows])
        assert_roundtrip([reference[r["id"]] for r in rows[:3]], batch=mmpipe.collate(rows[:3], processor=proc))
    cov = streaming.exactly_once(per_rank, range(len(raw)))
    assert cov.ok, str(cov)


def test_map_style_dataset_is_split_in_blocks(raw, reference):
    per_rank = []
    for rank in range(3):
        part = streaming.shard_for_rank(raw, rank, 3, num_shards=2)
        assert isinstance(part, datasets.IterableDataset) and part.num_shards == 2
        rows = list(streaming.encode_stream(part, processor_for(FAMILY), keep_columns=["id"]))
        _check_rows(rows, reference)
        per_rank.append([r["id"] for r in rows])
    assert per_rank == [list(range(0, 5)), list(range(5, 10)), list(range(10, 14))]


def test_encode_stream_declares_features_and_drops_long_rows(raw, reference):
    proc = processor_for(FAMILY)
    it = raw.to_iterable_dataset(num_shards=2)
    enc = streaming.encode_stream(it, proc, keep_columns=["id"])
    want = mmpipe.MultiModalInputs.features("uint8", True)
    want["id"] = raw.features["id"]
    assert enc.features == want
    rows = list(enc)
    assert set(rows[0]) == set(want)
    _check_rows(rows, reference)
    budget = sorted(r.num_tokens for r in reference.values())[len(reference) // 2]
    kept = list(streaming.encode_stream(it, proc, keep_columns=["id"], max_length=budget, truncation="drop"))
    assert [r["id"] for r in kept] == [i for i, r in sorted(reference.items()) if r.num_tokens <= budget]
    _check_rows(kept, reference)


def test_exactly_once_reports_missing_duplicated_unexpected():
    cov = streaming.exactly_once([[0, 1, 2], [2, 4, 9]], range(5))
    assert not cov.ok
    assert cov.missing == [3] and cov.duplicated == {2: 2} and cov.unexpected == [9]
    assert "missing 1" in str(cov)
    assert streaming.exactly_once([[1], [0]], [0, 1]).ok


def test_shard_for_rank_rejects_bad_arguments(raw):
    it = raw.to_iterable_dataset(num_shards=2)
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        streaming.shard_for_rank(it, 2, 2)
    with pytest.raises(ValueError, match="at least one shard per rank"):
        streaming.shard_for_rank(it, 0, 3, strategy="shards")
    with pytest.raises(ValueError, match="strategy must be one of"):
        streaming.shard_for_rank(it, 0, 2, strategy="rows")


def _generated_rows(shards):
    for ids in shards:
        for i in ids:
            yield {"id": i, "prompt": f"Row {i}: <image> what is it?", "images": [mmpipe.testing.tiny_image(40, 60 + i, seed=i)]}


def test_generator_stream_without_features(raw):
    """A stream whose features are unknown (from_generator) is split and encoded the same way."""
    proc = processor_for(FAMILY)
    it = datasets.IterableDataset.from_generator(_generated_rows, gen_kwargs={"shards": [[0, 1, 2], [3, 4], [5, 6, 7]]})
    assert it.features is None and it.num_shards == 3
    want = {r["id"]: mmpipe.encode_row(r, proc) for r in _generated_rows([range(8)])}
    per_rank = []
    for rank in range(2):
        rows = list(streaming.encode_stream(streaming.shard_for_rank(it, rank, 2), proc, keep_columns=["id"]))
        _check_rows(rows, want)
        per_rank.append([r["id"] for r in rows])
    assert streaming.exactly_once(per_rank, range(8)).ok
