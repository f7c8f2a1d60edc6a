"""Encoded datasets through S3 (moto's server on loopback; a real endpoint is a URL in the same code):
shards written with Dataset.to_parquet, streamed into the Collator with the local batches,
validate_dataset / load_encoded on s3:// paths, a damaged shard as a typed error naming it
(skip-and-count on request), and s3fs retrying failed and cut-off GETs."""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch

import mmpipe
from mmpipe.data import object_store
from mmpipe.data.loading import DamagedDatasetError
from mmpipe.data.object_store import DamagedShardError, stream_encoded, write_shards
from mmpipe.errors import ArgumentError, InputError
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_equal

from conftest import processor_for
from helpers import raw_dataset

pytest.importorskip("s3fs", reason="the object-store route needs s3fs: pip install s3fs")
pytest.importorskip("moto.server", reason="the tests' S3 server: pip install 'moto[server]'")

FAMILY = "qwen2_vl"
BUCKET = "mmpipe-test"


@pytest.fixture(scope="module")
def s3():
    from s3_server import S3Server

    with S3Server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    raw = raw_dataset(tmp_path_factory.mktemp("s3_raw"))  # 14 rows, 0..3 images each
    return raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY)}, remove_columns=raw.column_names)


@pytest.fixture(scope="module")
def shards(s3, encoded):
    """The encoded rows as 3 shards on S3 (Dataset.to_parquet with storage_options)."""
    return write_shards(encoded, f"s3://{BUCKET}/enc", num_shards=3, storage_options=s3.storage_options(),
                        rows_per_row_group=2)


def _batches(rows, collator, size=4):
    return [collator(rows[i:i + size]) for i in range(0, len(rows), size)]


def _assert_batches_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        gi, wi = g.model_inputs(), w.model_inputs()
        assert sorted(gi) == sorted(wi)
        for k in wi:
            assert torch.equal(gi[k], wi[k]), k


def test_shards_on_s3_stream_into_the_collator_with_the_local_batches(s3, encoded, shards):
    assert [u.rsplit("/", 1)[1] for u in shards] == [f"shard-0000{i}-of-00003.parquet" for i in range(3)]
    local = [encoded[i] for i in range(len(encoded))]
    collator = mmpipe.Collator(processor_for(FAMILY))
    want = _batches(local, collator)
    # datasets' own stream, and mmpipe's (same rows, shards by name, typed errors)
    theirs = datasets.load_dataset("parquet", data_files=f"s3://{BUCKET}/enc/*.parquet", split="train",
                                   streaming=True, storage_options=s3.storage_options())
    ours = stream_encoded(f"s3://{BUCKET}/enc/", storage_options=s3.storage_options())
    assert ours.num_shards == theirs.num_shards == 3
    assert ours.features == theirs.features == encoded.features
    for stream in (theirs, ours):
        rows = list(stream)
        assert len(rows) == len(local) == 14
        _assert_batches_equal(_batches(rows, collator), want)
    batch = want[1]
    assert_roundtrip(local[4:8], batch=batch, label="s3 stream")
    # through a DataLoader with workers: each worker reads its own shards
    loader = torch.utils.data.DataLoader(ours, batch_size=None, num_workers=2)
    got = sorted((r["input_ids"] for r in loader), key=lambda ids: (len(ids), list(ids)))
    assert got == sorted((r["input_ids"] for r in local), key=lambda ids: (len(ids), list(ids)))


def test_validate_and_load_encoded_read_s3_paths(s3, encoded, shards, monkeypatch):
    for k, v in s3.env().items():  # the endpoint and credentials from the environment, as deployed
        monkeypatch.setenv(k, v)
    ds_save = f"s3://{BUCKET}/saved"
    encoded.save_to_disk(ds_save, storage_options=s3.storage_options())
    local = [encoded[i] for i in range(len(encoded))]
    for url, n in [(f"s3://{BUCKET}/enc/", 14), (f"s3://{BUCKET}/enc/*.parquet", 14), (shards[0], 5),
                   (ds_save, 14)]:
        report = mmpipe.validate_dataset(url)
        assert report.ok and report.num_rows == n, (url, str(report))
        loaded = mmpipe.load_encoded(url)
        assert isinstance(loaded, datasets.Dataset) and len(loaded) == n
        assert_rows_equal([loaded[i] for i in range(n)], local[:n], what=url)
    # explicit storage_options (no environment needed)
    table, _ = object_store.open_table(f"s3://{BUCKET}/enc/", s3.storage_options())
    assert table.equals(encoded.data.table.cast(table.schema))
    with pytest.raises(ArgumentError, match="does not exist"):
        mmpipe.validate_dataset(f"s3://{BUCKET}/nothing-here/")
    with pytest.raises(ArgumentError, match="matches no file"):
        stream_encoded(f"s3://{BUCKET}/nothing-here/*.parquet")


@pytest.fixture(scope="module")
def damaged(s3, encoded):
    """3 shards under s3://.../damaged/: 0 good; 1 cut in half (no footer); 2 with its second
    row group overwritten (the footer reads, row group 1 does not)."""
    so = s3.storage_options()
    urls = write_shards(encoded, f"s3://{BUCKET}/damaged", num_shards=3, storage_options=so, rows_per_row_group=3)
    fs, _ = object_store.filesystem(urls[0], so)
    whole = fs.cat(urls[1])
    fs.pipe(urls[1], whole[: len(whole) // 2])
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(pa.BufferReader(fs.cat(urls[2]))).metadata
    assert meta.num_row_groups == 2
    col = meta.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    data = bytearray(fs.cat(urls[2]))
    data[start:start + 64] = b"\x17" * 64  # the first page header of row group 1: not thrift any more
    fs.pipe(urls[2], bytes(data))
    return urls


def test_a_damaged_shard_is_a_typed_error_naming_it_or_skipped_and_counted(s3, encoded, damaged, caplog):
    so = s3.storage_options()
    # datasets' own stream dies with pyarrow's error, which names no shard
    theirs = datasets.load_dataset("parquet", data_files=f"s3://{BUCKET}/damaged/*.parquet", split="train",
                                   streaming=True, storage_options=so)
    with pytest.raises(pa.ArrowInvalid):
        list(theirs)
    seen = []
    with pytest.raises(DamagedShardError) as info:
        for row in stream_encoded(f"s3://{BUCKET}/damaged/", storage_options=so):
            seen.append(row)
    err = info.value
    assert isinstance(err, (DamagedDatasetError, InputError, ValueError))
    assert err.shard == damaged[1] and damaged[1] in str(err) and err.row_group is None and err.rows_read == 0
    assert len(seen) == 5  # shard 0, whole
    errors: list = []
    rows = list(stream_encoded(f"s3://{BUCKET}/damaged/", storage_options=so, on_bad_shard="skip", errors=errors))
    # shard 0 (5 rows) and shard 2's first row group (3 rows); shard 1 and shard 2's rest left out, counted
    assert [(e["shard"], e["row_group"], e["rows_read"]) for e in errors] == [(damaged[1], None, 0),
                                                                              (damaged[2], 1, 3)]
    assert len(rows) == 8 and sum("skipped the rest of a shard" in r.message for r in caplog.records) == 2
    want = [encoded[i] for i in list(range(5)) + list(range(10, 13))]
    assert [r["input_ids"] for r in rows] == [r["input_ids"] for r in want]
    # validate / load name the shard too, with the rows readable before it
    with pytest.raises(DamagedDatasetError) as info:
        object_store.open_table(f"s3://{BUCKET}/damaged/", so)
    assert info.value.file == damaged[1] and info.value.rows_readable == (0, 5)
    with pytest.raises(ArgumentError, match="on_bad_shard"):
        stream_encoded(damaged[0], storage_options=so, on_bad_shard="ignore")


def test_failed_and_cut_off_gets_are_retried_by_s3fs(s3, encoded, shards):
    """Through the fault proxy: a shard's first GET answers 503 SlowDown, its next one sends half
    the body and drops the connection; s3fs (botocore's retries for the 503, its own for the
    cut-off body) reads the same rows."""
    so = s3.storage_options(proxy=True)
    path = f"/{BUCKET}/enc/" + shards[1].rsplit("/", 1)[1]
    clean = list(stream_encoded(shards[1], storage_options=so))
    gets_clean = s3.gets[path]
    s3.faults[path] += ["503", "cut"]
    faulty = list(stream_encoded(shards[1], storage_options=so))
    assert not s3.faults[path]  # both faults were served
    assert s3.gets[path] - gets_clean == gets_clean + 2  # the same reads, plus one retry per fault
    assert [r["input_ids"] for r in faulty] == [r["input_ids"] for r in clean]
    assert all(np.array_equal(a["position_ids"], b["position_ids"]) for a, b in zip(faulty, clean))


def test_resume_mid_stream_from_state_dict(s3, shards):
    so = s3.storage_options()
    stream = stream_encoded(f"s3://{BUCKET}/enc/", storage_options=so)
    it = iter(stream)
    head = [next(it)["input_ids"] for _ in range(6)]
    state = stream.state_dict()
    rest = [r["input_ids"] for r in it]
    again = stream_encoded(f"s3://{BUCKET}/enc/", storage_options=so)
    again.load_state_dict(state)
    assert [r["input_ids"] for r in again] == rest and len(head) + len(rest) == 14


def test_an_object_replaced_since_the_last_listing_is_read_as_it_is_now(s3, encoded):
    """fsspec reuses one S3FileSystem per set of arguments, with its listings: a shard rewritten
    since is read anew (a stale size / ETag fails with s3fs' "no longer exists")."""
    so = {k: v for k, v in s3.storage_options().items() if k != "skip_instance_cache"}
    url = f"s3://{BUCKET}/replaced/shard.parquet"
    encoded.select(range(3)).to_parquet(url, storage_options=so)
    folder = f"s3://{BUCKET}/replaced/"
    assert len(list(stream_encoded(folder, storage_options=so))) == 3  # the folder listed: sizes, ETags
    import io

    import boto3

    buf = io.BytesIO()
    encoded.select(range(3, 10)).to_parquet(buf)
    boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").put_object(Bucket=BUCKET, Key="replaced/shard.parquet",
                                                     Body=buf.getvalue())  # not through s3fs
    rows = list(stream_encoded(folder, storage_options=so))
    assert [r["input_ids"] for r in rows] == encoded.select(range(3, 10))["input_ids"]
    assert object_store.open_table(folder, so)[0].num_rows == 7


def test_ranks_split_the_shards_every_row_once(s3, encoded, shards):
    from mmpipe.data.streaming import exactly_once, shard_for_rank

    stream = stream_encoded(f"s3://{BUCKET}/enc/", storage_options=s3.storage_options())
    keys = [[tuple(r["input_ids"]) for r in shard_for_rank(stream, rank, 3)] for rank in range(3)]
    assert all(keys)  # 3 shards, 3 ranks: a whole shard each
    assert exactly_once(keys, [tuple(ids) for ids in encoded["input_ids"]]).ok
