"""The dataset helpers the README points at, used the ways it says: `mmpipe.compact` on stored
rows, `mmpipe.map_kwargs` in every map (Dataset and IterableDataset), `mmpipe.drop_failed` on
both kinds of dataset (issue 28)."""

from __future__ import annotations

import json

import datasets
import pytest

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.testing import build_processor, tiny_image
from mmpipe.testing.invariants import assert_rows_equal

FAMILY = "qwen2_vl"


def _row(i: int, n_images: int = 1) -> dict:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in picture {i}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"thing {i}"}]}],
            "images": [tiny_image(40 + 8 * i, 60 + 4 * k, seed=i + k) for k in range(n_images)]}


@pytest.fixture(scope="module")
def processor():
    return build_processor(FAMILY)


@pytest.fixture(scope="module")
def raw():
    return datasets.Dataset.from_list([_row(0), _row(1, 2), _row(2)])


# ---- compact -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["python", "numpy", "torch", "to_dict"])
def test_compact_takes_a_stored_row_and_returns_a_stored_uint8_row(processor, fmt):
    row = mmpipe.encode_row(_row(1, 2), processor, pixels="float32")
    want = mmpipe.encode_row(_row(1, 2), processor)  # what pixels="uint8" stores
    assert row.pixel_format == "float32" and want.pixel_format == "uint8"
    stored = row.to_dict() if fmt == "to_dict" else \
        datasets.Dataset.from_list([row.to_dict()]).with_format(None if fmt == "python" else fmt)[0]
    out = mmpipe.compact(stored)
    assert isinstance(out, dict) and "pixel_values_u8" in out and "pixel_values" not in out
    assert_rows_equal([mmpipe.MultiModalInputs.from_dict(out)], [want])
    assert mmpipe.compact(row).pixel_format == "uint8"  # the record in, a record out


def test_compact_over_a_float32_dataset_gives_the_uint8_dataset(processor, raw):
    enc32 = raw.map(mmpipe.encode, fn_kwargs={"processor": processor, "pixels": "float32"},
                    remove_columns=raw.column_names)
    enc8 = raw.map(mmpipe.encode, fn_kwargs={"processor": processor}, remove_columns=raw.column_names)
    compacted = enc32.map(mmpipe.compact, remove_columns=enc32.column_names)
    assert sorted(compacted.column_names) == sorted(enc8.column_names)
    assert_rows_equal([mmpipe.MultiModalInputs.from_dict(r) for r in compacted],
                      [mmpipe.MultiModalInputs.from_dict(r) for r in enc8])


def test_compact_leaves_a_stored_uint8_row_as_it_is(processor):
    stored = mmpipe.encode_row(_row(0), processor).to_dict()
    assert mmpipe.compact(stored) is stored


# ---- map_kwargs ----------------------------------------------------------------------------
def test_map_kwargs_fit_an_iterable_dataset_map(processor, raw):
    stream = raw.to_iterable_dataset()
    kwargs = mmpipe.map_kwargs(processor, stream)
    assert set(kwargs) == {"batch_size"} and kwargs["batch_size"] >= 1
    got = list(stream.map(mmpipe.encode, fn_kwargs={"processor": processor}, remove_columns=raw.column_names,
                          batched=True, **kwargs))
    want = raw.map(mmpipe.encode, fn_kwargs={"processor": processor}, remove_columns=raw.column_names,
                   batched=True, **mmpipe.map_kwargs(processor, raw))
    assert_rows_equal([mmpipe.MultiModalInputs.from_dict(r) for r in got],
                      [mmpipe.MultiModalInputs.from_dict(r) for r in want])


def test_map_kwargs_of_a_dataset_and_of_a_dataset_dict_keep_the_writer_size(processor, raw):
    for ds in (raw, datasets.DatasetDict(train=raw), None):
        kwargs = mmpipe.map_kwargs(processor, ds)
        assert set(kwargs) == {"writer_batch_size", "batch_size"} and kwargs["writer_batch_size"] == kwargs["batch_size"]
    stream_dict = datasets.IterableDatasetDict(train=raw.to_iterable_dataset())
    assert set(mmpipe.map_kwargs(processor, stream_dict)) == {"batch_size"}


# ---- drop_failed ---------------------------------------------------------------------------
def _skipped(processor, raw):
    rows = raw.to_list()
    rows[1] = {**rows[1], "images": rows[1]["images"][:1]}  # 2 placeholders, 1 image: fails to parse
    return datasets.Dataset.from_list(rows)


def test_drop_failed_on_a_dataset(processor, raw):
    enc = _skipped(processor, raw).map(mmpipe.encode, fn_kwargs={"processor": processor, "on_error": "skip"},
                                       with_indices=True)
    kept, errors = mmpipe.drop_failed(enc)
    assert len(kept) == 2 and ERROR_COLUMN not in kept.column_names
    assert [e["row"] for e in errors] == [1] and errors[0]["reason"]


def test_drop_failed_on_a_stream_says_what_to_do_and_its_filter_works(processor, raw):
    stream = _skipped(processor, raw).to_iterable_dataset().map(
        mmpipe.encode, fn_kwargs={"processor": processor, "on_error": "skip"}, with_indices=True)
    with pytest.raises(ArgumentError, match="map-style datasets.Dataset") as e:
        mmpipe.drop_failed(stream)
    assert "IterableDataset" in str(e.value) and f"ds.filter(lambda r: not r['{ERROR_COLUMN}'])" in str(e.value)
    # the filter the message gives, as given
    seen = []
    kept = stream.filter(lambda r: seen.append(r[ERROR_COLUMN]) or not r[ERROR_COLUMN]).remove_columns([ERROR_COLUMN])
    rows = list(kept)
    assert len(rows) == 2 and all(ERROR_COLUMN not in r for r in rows)
    assert [json.loads(x)["row"] for x in seen if x] == [1]


def test_drop_failed_on_a_stream_without_the_error_column_is_a_no_op(processor, raw):
    stream = raw.to_iterable_dataset()  # columns known, no error column: nothing can have failed
    same, errors = mmpipe.drop_failed(stream)
    assert same is stream and errors == []


@pytest.mark.parametrize("family, pixels", [("qwen2_vl", "uint8"), ("qwen2_vl", "source"), ("qwen2_vl", "none"),
                                            ("gemma3", "uint8"), ("idefics3", "float32")])
def test_encode_dataset_of_no_rows_has_the_encoded_columns(family, pixels):
    """A dataset filtered down to no rows crashed encode_dataset ("Column 'mmpipe_drop_reason'
    doesn't exist": datasets.map never calls the encoder on no rows). It now gives no rows with
    the columns and types one encoded row has (kept columns first, as map keeps them), so the
    pieces of a sharded job concatenate."""
    proc = build_processor(family)
    raw = datasets.Dataset.from_list([{
        "id": "a", "images": [tiny_image(40, 56)],
        "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "A card."}]}]}])
    one, _ = mmpipe.encode_dataset(raw, proc, keep_columns=["id"], pixels=pixels)
    none, report = mmpipe.encode_dataset(raw.select([]), proc, keep_columns=["id"], pixels=pixels)
    assert (report.rows_in, report.rows_out, report.dropped, report.errors) == (0, 0, {}, [])
    assert len(none) == 0 and none.column_names == one.column_names and none.features == one.features
    assert len(datasets.concatenate_datasets([none, one])) == 1
