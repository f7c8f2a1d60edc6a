"""Streams as users drive them (hunt): generator-backed ``IterableDataset`` streams split over ranks
and DataLoader workers, damaged rows skipped and counted from every worker, arguments that would
read a whole stream at once or crash deep inside ``datasets``, and encoded shards in folders whose
names hold glob characters or whose reads fail in the network."""

from __future__ import annotations

import multiprocessing
import shutil

import datasets
import numpy as np
import pyarrow as pa
import pytest
from bad_inputs import jpeg_bytes, photo
from torch.utils.data import DataLoader

from mmpipe.data import object_store
from mmpipe.data.streaming import encode_stream, exactly_once, shard_for_rank
from mmpipe.errors import ArgumentError
from mmpipe.testing import build_processor

FEATURES = datasets.Features({"id": datasets.Value("int64"), "prompt": datasets.Value("string"),
                              "images": datasets.Sequence(datasets.Image())})
SHARDS = [list(range(0, 5)), list(range(5, 9)), list(range(9, 16))]  # uneven, 3 shards for 2 ranks
BAD = (3, 10)  # rows whose JPEG is cut short


@pytest.fixture(scope="module")
def proc():
    return build_processor("qwen2_vl")


class Pulled:
    """Counts the source rows a stream has read (an object: a list in gen_kwargs would be sharded)."""

    n = 0


def _rows(shards, bad=(), pulled=None, images=True):
    for ids in shards:
        for i in ids:
            if pulled is not None:
                pulled.n += 1
            img = jpeg_bytes(photo(32, 32 + 4 * (i % 5), seed=i))
            img = img[: len(img) // 3] if i in bad else img
            yield {"id": i, "prompt": f"Row {i}: <image> what?" if images else f"Row {i}",
                   "images": [{"bytes": img, "path": None}] if images else []}


def _stream(shards=SHARDS, bad=(), pulled=None, images=True):
    return datasets.IterableDataset.from_generator(
        _rows, gen_kwargs={"shards": shards, "bad": bad, "pulled": pulled, "images": images}, features=FEATURES)


def test_batch_sizes_that_read_the_whole_stream_and_non_streams_are_refused(proc):
    """datasets reads the WHOLE stream as one batch for batch_size <= 0 / None (measured: 3000 of 3000
    rows pulled before the first encoded row); a list, a generator or a map-style Dataset crashed deep
    inside (AttributeError / KeyError), keep_columns="id" with KeyError 'i' at iteration."""
    for bad in (0, -1, None, "4"):
        with pytest.raises(ArgumentError, match="batch_size must be an int >= 1"):
            encode_stream(_stream(), proc, batch_size=bad)
    for ds in ([{"prompt": "hi"}], (r for r in _rows([[0]])), datasets.Dataset.from_list([{"prompt": "hi"}])):
        with pytest.raises(ArgumentError, match="needs a datasets.IterableDataset"):
            encode_stream(ds, proc)
    with pytest.raises(ArgumentError, match="list of column names"):
        encode_stream(_stream(), proc, keep_columns="id")
    with pytest.raises(ArgumentError, match=r"keep_columns \['nope'\] are not columns"):
        encode_stream(_stream(), proc, keep_columns=["nope"])


def test_a_rank_starts_after_a_few_rows_not_a_thousand():
    """The example-level split kept the rank's rows in filter batches of datasets' default 1,000 raw
    rows (images included) before the first row came out; now world_size rows a batch."""
    pulled = Pulled()
    part = shard_for_rank(_stream([list(range(1500))], pulled=pulled, images=False), 1, 3)
    assert next(iter(part))["id"] == 1
    assert pulled.n <= 3 * 2, pulled.n


def test_rows_skipped_in_dataloader_workers_are_collected_and_named_by_their_id(proc):
    """2 ranks x 2 workers over 3 uneven shards, 2 truncated JPEGs: every good row once and both bad rows
    recorded, each with its id (the row index counts in a worker's stream: worker 0 called id 10 'row 6').
    Before, errors= accepted only a plain list, which each worker copies: the caller's stayed empty."""
    with multiprocessing.Manager() as manager:
        errors = manager.list()
        per_rank = []
        for rank in range(2):
            enc = encode_stream(shard_for_rank(_stream(bad=BAD), rank, 2), proc, batch_size=2, keep_columns=["id"],
                                on_error="skip", errors=errors)
            per_rank.append([r["id"] for r in DataLoader(enc, batch_size=None, num_workers=2)])
        records = list(errors)
    good = [i for i in range(16) if i not in BAD]
    assert exactly_once(per_rank, good).ok, str(exactly_once(per_rank, good))
    assert sorted(r["keep"]["id"] for r in records) == list(BAD)
    assert all(r["worker"] in (0, 1) and r["stage"] == "image" and r["column"] == "images" for r in records)
    plain: list = []  # in this process: the row index is the stream position, no worker
    rows = list(encode_stream(_stream(bad=BAD), proc, batch_size=4, keep_columns=["id"], on_error="skip",
                              errors=plain))
    assert len(rows) == 14 and [(r["row"], r["keep"]["id"], "worker" in r) for r in plain] == [(3, 3, False),
                                                                                                 (10, 10, False)]


def test_shard_for_rank_arguments_are_typed_errors():
    stream = _stream(images=False)
    ds = datasets.Dataset.from_list([{"id": i} for i in range(6)])
    for rank, world in ((0, 0), (0, -1), (0, 2.0)):
        with pytest.raises(ArgumentError, match="world_size must be an int >= 1"):
            shard_for_rank(stream, rank, world)
    for rank in ("0", 0.5, True):  # a TypeError from a comparison, or rank True read as 1
        with pytest.raises(ArgumentError, match="rank must be in 0..1"):
            shard_for_rank(stream, rank, 2)
    with pytest.raises(ArgumentError, match="must be a datasets.Dataset or IterableDataset"):
        shard_for_rank([{"id": 0}], 0, 2)
    for n in (0, -1):  # 0 was taken as 1, -1 passed on to datasets
        with pytest.raises(ArgumentError, match="num_shards must be an int >= 1"):
            shard_for_rank(ds, 0, 2, num_shards=n)
    with pytest.raises(ArgumentError, match="ranks 6..9 would read none"):  # was an IndexError at iteration
        shard_for_rank(ds, 9, 10)
    # more shards than a rank's rows (6 rows, 4 ranks: blocks of 2, 2, 1, 1): datasets' ValueError on
    # ranks 2 and 3 only; now at most one shard per row
    parts = [shard_for_rank(ds, rank, 4, num_shards=2) for rank in range(4)]
    assert [p.num_shards for p in parts] == [2, 2, 1, 1]
    assert exactly_once([[r["id"] for r in p] for p in parts], range(6)).ok


def test_numpy_integer_ranks_shards_and_batch_sizes_are_taken(proc):
    """A rank, world size, shard count or batch size computed with numpy (np.int64) is an integer:
    it was refused ("world_size must be an int >= 1, got 2") as if it were a float."""
    ds = datasets.Dataset.from_list([{"id": i} for i in range(6)])
    parts = [shard_for_rank(ds, np.int64(rank), np.int64(3), num_shards=np.int32(2)) for rank in range(3)]
    assert exactly_once([[r["id"] for r in p] for p in parts], range(6)).ok
    stream_parts = [shard_for_rank(_stream(images=False), np.int64(rank), np.int64(2), strategy="examples")
                    for rank in range(2)]
    assert exactly_once([[r["id"] for r in p] for p in stream_parts], range(16)).ok
    rows = list(encode_stream(_stream([[0, 1, 2]]), proc, batch_size=np.int64(2), keep_columns=["id"]))
    assert [r["id"] for r in rows] == [0, 1, 2]


@pytest.fixture(scope="module")
def encoded():
    return datasets.Dataset.from_list([{"id": i, "x": [i] * 3} for i in range(7)])


@pytest.mark.parametrize("name", ["run[1]", "a*b", "q?x", "ünï cødé"])
def test_a_folder_named_with_glob_characters_reads_back(tmp_path, encoded, name):
    """write_shards wrote 'run[1]/', then stream_encoded said it matched no file; 'a*b/' was read as a
    damaged shard (the glob matched the folder itself)."""
    folder = tmp_path / name
    urls = object_store.write_shards(encoded, str(folder), num_shards=2)
    for data in (str(folder), "file://" + str(folder), folder, urls):
        assert [r["id"] for r in object_store.stream_encoded(data)] == list(range(7)), data
    assert object_store.open_table(str(folder))[0].num_rows == 7
    shutil.rmtree(folder)


def test_a_glob_reads_files_only_and_bad_data_files_are_typed(tmp_path, encoded):
    object_store.write_shards(encoded, str(tmp_path / "a"), num_shards=2)
    (tmp_path / "sub.parquet").mkdir()  # a folder the glob matches
    assert len(object_store.list_shards(str(tmp_path / "a" / "*.parquet"))) == 2
    with pytest.raises(ArgumentError, match="matches no file"):  # was listed as a shard, then 'damaged'
        object_store.list_shards(str(tmp_path / "*.parquet"))
    for bad in ([], None, [3]):  # an IndexError / TypeError before
        with pytest.raises(ArgumentError, match="data_files must be"):
            object_store.stream_encoded(bad)


def test_a_read_that_fails_in_the_network_names_the_shard(encoded, monkeypatch):
    """Every GET of one shard cut off half-way: s3fs retries, then aiohttp's ClientPayloadError ended
    the stream naming no shard (and open_table the same); now a ShardReadError (a ConnectionError)
    naming it, under on_bad_shard='skip' too (the shard is not damaged)."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3_server import S3Server

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)  # s3fs' own retries of a cut-off body (default 5)

    with S3Server() as s3:
        s3.create_bucket("hunt-streams")
        urls = object_store.write_shards(encoded, "s3://hunt-streams/enc", num_shards=3,
                                         storage_options=s3.storage_options())
        so = s3.storage_options(proxy=True)
        path = "/hunt-streams/enc/" + urls[1].rsplit("/", 1)[1]
        for read in (lambda: list(object_store.stream_encoded("s3://hunt-streams/enc/", storage_options=so,
                                                              on_bad_shard="skip", errors=[])),
                     lambda: object_store.open_table("s3://hunt-streams/enc/", so)):
            s3.faults[path] += ["cut"] * 10
            with pytest.raises(object_store.ShardReadError) as info:
                read()
            s3.faults[path].clear()
            assert isinstance(info.value, ConnectionError) and info.value.shard == urls[1]
            assert urls[1] in str(info.value) and "not known to be damaged" in str(info.value)


def test_exactly_once_refuses_flat_keys():
    """exactly_once(["a1", "b2"], ...) counted each string's characters as one rank's keys and reported
    2 missing and 4 unexpected keys; flat ints were a TypeError."""
    for flat in (["a1", "b2"], [1, 2]):
        with pytest.raises(ArgumentError, match="one iterable of keys per rank"):
            exactly_once(flat, flat)
    assert exactly_once([["a1"], ("b2",), iter(["c3"])], ["a1", "b2", "c3"]).ok


def test_shards_of_different_encodes_are_a_schema_error_naming_the_shard(tmp_path):
    """Shards with other columns (one encode with labels, one without) were pyarrow's bare ValueError
    from the cast; shards with the same columns in another order or type are read as the first."""
    import pyarrow.parquet as pq

    from mmpipe.data.report import SchemaError

    pq.write_table(pa.table({"input_ids": [[1, 2]], "labels": [[1, 2]]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"labels": [[5]], "input_ids": pa.array([[5, 6]], pa.list_(pa.int32()))}),
                   tmp_path / "part-1.parquet")
    table, _ = object_store.read_table(str(tmp_path))
    assert table.column_names == ["input_ids", "labels"] and table.column("input_ids").to_pylist() == [[1, 2], [5, 6]]
    pq.write_table(pa.table({"input_ids": [[7]]}), tmp_path / "part-2.parquet")
    with pytest.raises(SchemaError, match=r"part-2.parquet.*columns \['labels'\] are missing") as info:
        object_store.read_table(str(tmp_path))
    assert info.value.column == "labels" and "re-encode them together" in str(info.value)
