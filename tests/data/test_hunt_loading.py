"""Hunt: loading encoded datasets as users hand them over, and the Ray Data helpers' arguments.

Measured on the old code: ``load_encoded("~/data/x.parquet")`` said the path does not exist (no
``~`` expansion); a ``save_to_disk`` of an empty encode (0 rows: a filter that kept none) raised a
bare ``IndexError`` from ``datasets.load_from_disk``; a folder whose ``dataset_info.json`` is
missing or whose ``state.json`` is not JSON raised ``FileNotFoundError`` / ``JSONDecodeError``.
Ray: ``keep_columns="id"`` kept the columns ``'i'`` and ``'d'`` (``KeyError: 'i'``), a keep or
index column that is no input column was a ``KeyError`` or silently ignored, ``workers=0`` / ``-1``
/ ``1.5`` and ``batch_size=0`` went through to Ray, a ``datasets.Dataset`` gave an
``AttributeError``, and a pandas batch that dropped every row typed its kept column ``null``.
"""

from __future__ import annotations

import functools
import json
import os

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data.loading import DamagedDatasetError
from mmpipe.data.ray_data import RayBatchEncoder, encode_with_ray
from mmpipe.errors import ArgumentError

FACTORY = functools.partial(testing.build_processor, "qwen2_vl")


def _raw(n: int, k: int) -> dict:
    content = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"id": k, "messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": [testing.tiny_image(32, 32, seed=k + j) for j in range(n)]}


@pytest.fixture(scope="module")
def raws():
    return datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate((1, 0, 2))])


@pytest.fixture(scope="module")
def encoded(raws):
    return mmpipe.encode_dataset(raws, FACTORY())[0]


# ---- paths ---------------------------------------------------------------------------------
def test_a_path_under_home_is_expanded(encoded, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    encoded.to_parquet(str(tmp_path / "one.parquet"))
    encoded.save_to_disk(str(tmp_path / "saved dir"))
    (tmp_path / "shards").mkdir()
    encoded.select([0]).to_parquet(str(tmp_path / "shards" / "a.parquet"))
    encoded.select([1, 2]).to_parquet(str(tmp_path / "shards" / "b.parquet"))
    for path in ("~/one.parquet", "~/saved dir", "~/shards"):
        ds = mmpipe.load_encoded(path)
        assert ds.num_rows == 3, path
        assert ds["input_ids"] == encoded["input_ids"], path


def test_an_empty_encode_saved_to_disk_loads_with_its_types(raws, encoded, tmp_path):
    empty, _ = mmpipe.encode_dataset(raws.select([]), FACTORY())
    empty.save_to_disk(str(tmp_path / "empty"))  # no data file: load_from_disk cannot read it
    ds = mmpipe.load_encoded(str(tmp_path / "empty"))
    assert ds.num_rows == 0
    assert ds.features == empty.features
    assert datasets.concatenate_datasets([ds, encoded]).num_rows == 3  # a sharded job's pieces join


# ---- damaged save_to_disk metadata -----------------------------------------------------------
@pytest.mark.parametrize("name, damage, said", [
    ("dataset_info.json", "remove", "is missing"),
    ("dataset_info.json", "{not json", "is not JSON"),
    ("state.json", "{not json", "is not JSON"),
])
def test_damaged_metadata_files_are_named(encoded, tmp_path, name, damage, said):
    path = tmp_path / "saved"
    encoded.save_to_disk(str(path))
    if damage == "remove":
        os.remove(path / name)
    else:
        (path / name).write_text(damage)
    with pytest.raises(DamagedDatasetError, match=said) as e:
        mmpipe.load_encoded(str(path))
    assert e.value.file == str(path / name)
    assert e.value.rows_readable == (0, 3)  # the data files are whole
    assert name in e.value.fix


def test_state_json_listing_no_file_but_without_features_is_typed(encoded, tmp_path):
    path = tmp_path / "saved"
    encoded.select([]).save_to_disk(str(path))
    info = json.loads((path / "dataset_info.json").read_text())
    info.pop("features")
    (path / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DamagedDatasetError, match="lists no features") as e:
        mmpipe.load_encoded(str(path))
    assert e.value.file == str(path / "dataset_info.json")


# ---- Ray Data arguments (no Ray needed) ----------------------------------------------------------
def test_keep_columns_one_name_is_one_column(raws):
    table = raws.with_format("arrow")[:]
    out = RayBatchEncoder(FACTORY, keep_columns="id")(table)
    assert out.column("id").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize("kw, fmt", [({"keep_columns": ["nope"]}, "pyarrow"), ({"keep_columns": ["nope"]}, "pandas"),
                                     ({"index_column": "nope"}, "pyarrow")])
def test_a_keep_or_index_column_that_is_no_input_column_is_named(raws, kw, fmt):
    table = raws.with_format("arrow")[:]
    batch = table.to_pandas() if fmt == "pandas" else table
    with pytest.raises(ArgumentError, match="'nope' is not a column of the input rows"):
        RayBatchEncoder(FACTORY, **kw)(batch)


def test_keep_columns_must_be_names():
    with pytest.raises(ArgumentError, match="keep_columns must be column names"):
        RayBatchEncoder(FACTORY, keep_columns=[1])


def test_a_pandas_batch_that_drops_every_row_keeps_the_column_type(raws):
    out = RayBatchEncoder(FACTORY, keep_columns=["id"], max_length=5, truncation="drop")(
        raws.with_format("arrow")[:].to_pandas())
    assert out.num_rows == 0
    assert out.schema.field("id").type == pa.int64()  # not null: the blocks of one dataset share a schema


class _NotRay:
    def map_batches(self, *a, **kw):  # encode_with_ray's arguments, without a cluster
        return kw


@pytest.mark.parametrize("kw, said", [({"workers": 0}, "workers must be an int >= 1"),
                                      ({"workers": -1}, "workers must be an int >= 1"),
                                      ({"workers": 1.5}, "workers must be an int >= 1"),
                                      ({"workers": 1, "batch_size": 0}, "batch_size must be an int >= 1")])
def test_encode_with_ray_refuses_bad_sizes(kw, said):
    pytest.importorskip("ray")
    with pytest.raises(ArgumentError, match=said):
        encode_with_ray(_NotRay(), FACTORY, **kw)


def test_encode_with_ray_names_a_datasets_dataset(raws):
    pytest.importorskip("ray")
    with pytest.raises(ArgumentError, match="from_huggingface"):
        encode_with_ray(raws, FACTORY, workers=1)
    kw = encode_with_ray(_NotRay(), FACTORY, workers=1, keep_columns="id")
    assert kw["fn_constructor_kwargs"]["keep_columns"] == ["id"]
