"""A streamed row that fails is named by its dataset row, or by its stream position said to be one,
never by a wrong row number. 48 rows, the one with id 37 damaged, batches of 8. Before, a shuffled
stream's error said "row 6" (``e.row == 6``) and 2 DataLoader workers' said "row 13" (worker 1's
position): both read as dataset rows. Now ``row`` is None there and the message says "stream row N
... (not a dataset row: ...)"; an unshuffled stream read by one process still names row 37."""

from __future__ import annotations

import io
import json

import datasets
import pytest
from torch.utils.data import DataLoader

import mmpipe
from mmpipe import testing
from mmpipe.data.streaming import encode_stream
from mmpipe.errors import ImageError

BAD = 37


@pytest.fixture(scope="module")
def proc():
    return testing.build_processor("qwen2_vl")


@pytest.fixture(scope="module")
def table():
    buf = io.BytesIO()
    testing.sample_photos()[0][1].resize((56, 56)).save(buf, "PNG")
    rows = [{"prompt": f"<image>q{i}", "images": [{"bytes": b"junk" if i == BAD else buf.getvalue(), "path": None}],
             "id": i} for i in range(48)]
    return datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image(decode=False)))


def _raised(stream, proc, workers=0) -> ImageError:
    enc = encode_stream(stream, proc, batch_size=8, keep_columns=["id"])
    with pytest.raises(ImageError) as got:
        list(DataLoader(enc, batch_size=None, num_workers=workers) if workers else enc)
    return got.value


def test_an_unshuffled_stream_names_the_dataset_row(table, proc):
    e = _raised(table.to_iterable_dataset(num_shards=4), proc)
    assert e.row == BAD and str(e).startswith(f"row {BAD}, image 0: ")


def test_a_shuffled_stream_says_the_row_is_a_stream_position(table, proc):
    e = _raised(table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=16), proc)
    assert e.row in (None, BAD), f"a wrong dataset row: {e.row}"
    assert str(e).startswith("stream row ") and "not a dataset row: the stream is shuffled" in str(e)
    assert "image 0: cannot read the image" in str(e)


def test_skip_records_of_a_shuffled_stream_name_the_position_and_the_id(table, proc):
    errors: list = []
    stream = table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=16)
    rows = list(encode_stream(stream, proc, batch_size=8, keep_columns=["id"], on_error="skip", errors=errors))
    assert len(rows) == 47 and len(errors) == 1
    rec = errors[0]
    assert rec["row"] in (None, BAD) and rec["keep"] == {"id": BAD} and isinstance(rec["stream_row"], int)
    assert rec["reason"].startswith(f"stream row {rec['stream_row']} (not a dataset row")


def test_dataloader_workers_say_whose_stream_the_position_counts_in(table, proc):
    e = _raised(table.to_iterable_dataset(num_shards=4), proc, workers=2)
    assert e.row in (None, BAD), f"a wrong dataset row: {e.row}"
    assert "stream row 13 of DataLoader worker 1 (not a dataset row" in str(e)


def test_a_users_own_map_in_dataloader_workers_says_so_too(table, proc):
    mapped = table.to_iterable_dataset(num_shards=4).map(mmpipe.encode, batched=True, batch_size=8, with_indices=True,
                                                         fn_kwargs={"processor": proc})
    with pytest.raises(ImageError) as got:
        list(DataLoader(mapped, batch_size=None, num_workers=2))
    assert got.value.row in (None, BAD) and "of DataLoader worker 1 (not a dataset row" in str(got.value)


def test_a_users_own_map_in_one_process_names_the_dataset_row(table, proc):
    mapped = table.to_iterable_dataset(num_shards=4).map(
        mmpipe.encode, batched=True, batch_size=8, with_indices=True, fn_kwargs={"processor": proc, "on_error": "skip"})
    recs = [json.loads(r["mmpipe_error"]) for r in mapped if r["mmpipe_error"]]
    assert [(r["row"], "stream_row" in r) for r in recs] == [(BAD, False)]


def test_rows_dropped_from_a_shuffled_stream_name_the_position(proc):
    ds = datasets.Dataset.from_list([{"prompt": "long " * 200 if i == BAD else "short", "id": i} for i in range(48)])
    for stream, shuffled in ((ds.to_iterable_dataset(num_shards=4), False),
                             (ds.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=16), True)):
        dropped: list = []
        rows = list(encode_stream(stream, proc, batch_size=8, keep_columns=["id"], max_length=64, truncation="drop",
                                  dropped=dropped))
        assert len(rows) == 47 and len(dropped) == 1 and dropped[0]["keep"] == {"id": BAD}
        rec = dropped[0]
        assert (rec["row"], "stream_row" in rec) == ((None, True) if shuffled else (BAD, False)), rec
