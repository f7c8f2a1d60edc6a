"""Determinism: the same raw dataset encodes to byte-identical Arrow, however it is run.

Compared ways (each with its own cache files, nothing reused: ``load_from_cache_file=False``
and a distinct ``cache_file_name``, since datasets would otherwise reuse a cache file - and
its shard count - of the same fingerprint):

- per-row ``map`` run twice, and once more in a fresh Python process;
- ``num_proc=1`` vs ``num_proc=2``;
- per-row vs ``batched=True`` (two batch sizes) vs ``mmpipe.encode_dataset``;
- ``threads=1`` vs several image threads.

"Byte-identical" is checked twice: the table (chunks combined) written as an Arrow IPC stream,
schema and its metadata included; and the ``.arrow`` file ``save_to_disk`` writes. Excluded:
the 16 hex digits of the transform fingerprint that datasets writes into the schema metadata
(``{"info": ..., "fingerprint": "..."}``; it hashes the map call - batched, num_proc, options -
not the data; blanked in place, so all other bytes and offsets are compared) and
``state.json`` (fingerprint and file names). ``dataset_info.json`` is compared as JSON.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_rows_from_arrow

from conftest import processor_for

FAMILY = "qwen2_5_vl"


def _raw_rows():
    photos = [im for _, im in testing.sample_photos()][:2]
    pool = photos + [testing.tiny_image(40, 70, seed=1), testing.tiny_image(90, 30, seed=2, mode="RGBA"),
                     testing.tiny_image(33, 33, seed=3, mode="L")]
    rows = []
    for i in range(9):
        k = [0, 1, 2, 3, 1, 0, 2, 1, 3][i]  # multi-image rows included
        content = []
        for j in range(k):
            content += [{"type": "image", "text": None}, {"type": "text", "text": f"image {j}"}]
        content.append({"type": "text", "text": f"Question {i}: what is shown?"})
        msgs = [{"role": "user", "content": content}]
        if i % 2:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}."}]})
        rows.append({"messages": msgs, "images": [pool[(i + j) % len(pool)] for j in range(k)]})
    return rows


def raw_dataset(path: Path) -> datasets.Dataset:
    feats = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image()),
    })
    datasets.Dataset.from_list(_raw_rows(), features=feats).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


_FINGERPRINT = re.compile(rb'"fingerprint": "[0-9a-f]+"')


def blank_fingerprint(data: bytes) -> bytes:
    """Arrow bytes with the transform fingerprint in the schema metadata blanked (same length,
    so every offset is unchanged): the only byte that legitimately differs between ways of
    running the same encode (datasets hashes the map arguments: batched, num_proc, options)."""
    return _FINGERPRINT.sub(lambda m: b"#" * len(m.group(0)), data)


def ipc_bytes(ds: datasets.Dataset) -> bytes:
    """The dataset's rows as one Arrow IPC stream (schema + metadata + one record batch)."""
    table = ds.flatten_indices().data.table.combine_chunks()
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches():
            w.write_batch(batch)
    return blank_fingerprint(sink.getvalue())


def saved_bytes(ds: datasets.Dataset, path: Path) -> tuple[bytes, dict]:
    ds.save_to_disk(str(path), num_shards=1)
    (arrow,) = sorted(path.glob("*.arrow"))
    return blank_fingerprint(arrow.read_bytes()), json.loads((path / "dataset_info.json").read_text())


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return raw_dataset(tmp_path_factory.mktemp("raw") / "raw")


@pytest.fixture(scope="module")
def encodings(raw, tmp_path_factory):
    """name -> encoded dataset, each way with fresh cache files."""
    cache = tmp_path_factory.mktemp("cache")
    proc = processor_for(FAMILY)
    out = {}

    def run(name, **kw):
        fn_kwargs = {"processor": proc, **kw.pop("options", {})}
        out[name] = raw.map(mmpipe.encode, fn_kwargs=fn_kwargs, with_indices=True, remove_columns=raw.column_names,
                            load_from_cache_file=False, cache_file_name=str(cache / f"{name}.arrow"), **kw)

    run("per_row")
    run("per_row_again")
    run("num_proc_2", num_proc=2)
    run("batched_4", batched=True, batch_size=4)
    run("batched_all_num_proc_2", batched=True, batch_size=100, num_proc=2)
    run("threads_1", options={"threads": 1})
    run("threads_4", options={"threads": 4})
    out["encode_dataset"], report = mmpipe.encode_dataset(raw, proc, num_proc=2, batch_size=3)
    assert report.rows_out == len(raw)
    return out


def test_encodings_are_byte_identical_as_arrow_ipc(encodings):
    ref = ipc_bytes(encodings["per_row"])
    assert len(ref) > 10_000  # real pixels are in there
    differ = [name for name, ds in encodings.items() if ipc_bytes(ds) != ref]
    assert not differ, f"Arrow bytes differ from the per-row map for {differ}"


def test_saved_arrow_files_are_byte_identical(encodings, tmp_path):
    ref_bytes, ref_info = saved_bytes(encodings["per_row"], tmp_path / "per_row")
    for name, ds in encodings.items():
        data, info = saved_bytes(ds, tmp_path / name)
        assert data == ref_bytes, f"{name}: saved .arrow file differs"
        assert info == ref_info, f"{name}: dataset_info.json differs"
    # and the saved files read back to the same rows
    back = datasets.load_from_disk(str(tmp_path / "num_proc_2"))
    assert ipc_bytes(back) == ipc_bytes(encodings["per_row"])


def test_rows_are_the_same_records(encodings):
    """Beyond bytes: every way gives the same typed rows, with the images of each raw row."""
    ref = mmpipe.rows_from_arrow(encodings["per_row"].data.table)
    assert [r.num_images for r in ref] == [len(r["images"]) for r in _raw_rows()]
    for name, ds in encodings.items():
        assert_rows_from_arrow(ds.flatten_indices().data.table, ref, label=name)


_FRESH = r"""
import io, sys
sys.path.insert(0, {tests!r})
import datasets, pyarrow as pa, mmpipe
from mmpipe import testing
from test_determinism import ipc_bytes
raw = datasets.load_from_disk({raw!r})
enc = raw.map(mmpipe.encode, fn_kwargs={{"processor": testing.build_processor({family!r})}}, with_indices=True,
              remove_columns=raw.column_names, load_from_cache_file=False, cache_file_name={cache!r})
open({out!r}, "wb").write(ipc_bytes(enc))
"""


def test_fresh_process_gives_the_same_bytes(encodings, raw, tmp_path):
    """A new interpreter (new processor object, new caches, new hash seed) encodes the same bytes."""
    raw_path = raw.cache_files[0]["filename"].rsplit("/", 1)[0]
    out = tmp_path / "fresh.ipc"
    code = _FRESH.format(tests=str(Path(__file__).parent), raw=raw_path, family=FAMILY,
                         cache=str(tmp_path / "fresh_cache.arrow"), out=str(out))
    env = {"PYTHONHASHSEED": "12345", "HF_DATASETS_CACHE": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(tmp_path), timeout=300)
    assert out.read_bytes() == ipc_bytes(encodings["per_row"])


@pytest.mark.parametrize("pixels", ["float32", "none"])
def test_other_pixel_formats_per_row_equals_batched(raw, tmp_path, pixels):
    proc = processor_for(FAMILY)
    kw = dict(fn_kwargs={"processor": proc, "pixels": pixels}, with_indices=True, remove_columns=raw.column_names,
              load_from_cache_file=False)
    a = raw.map(mmpipe.encode, cache_file_name=str(tmp_path / "a.arrow"), **kw)
    b = raw.map(mmpipe.encode, batched=True, batch_size=4, num_proc=2, cache_file_name=str(tmp_path / "b.arrow"), **kw)
    assert ipc_bytes(a) == ipc_bytes(b)
