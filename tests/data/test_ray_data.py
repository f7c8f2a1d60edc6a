"""Ray Data: map_batches(RayBatchEncoder) on a local Ray gives the rows of datasets.map, for every
family (patch grids, tiles, the generic path).

The conversion tests run without Ray; the Ray tests share one local Ray (2 CPUs), with the actor
pool sized from the cluster (compute=ActorPoolStrategy, not the deprecated concurrency=)."""

from __future__ import annotations

import functools
import os
import sys
import uuid

import datasets
import numpy as np
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_from_arrow
from mmpipe.data.ray_data import RayBatchEncoder, batch_rows, cluster_workers, encode_with_ray, load_processor

from conftest import processor_for
from helpers import raw_dataset

FAMILY = "qwen2_vl"


def marked_processor(marker_dir: str, family: str):
    """Processor factory that leaves one file per call (pid in the name): counts the builds."""
    with open(os.path.join(marker_dir, f"{os.getpid()}-{uuid.uuid4().hex}"), "w"):
        pass
    return testing.build_processor(family)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    ds = raw_dataset(tmp_path_factory.mktemp("ray_raw"))  # 14 rows, 0..3 images each
    return ds.add_column("id", list(range(len(ds))))


@pytest.fixture(scope="module")
def reference(raw):
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY)}, remove_columns=raw.column_names)
    return enc.data.table


def _check_table(table: pa.Table, reference: pa.Table, n: int):
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(n))
    enc = table.drop_columns(["id"])
    for f in reference.schema:  # the Arrow types datasets.map stores
        assert enc.schema.field(f.name).type == f.type, f.name
    assert set(enc.column_names) == set(reference.column_names)
    want = mmpipe.rows_from_arrow(reference)
    assert_rows_from_arrow(enc, [want[i] for i in ids], label="rows in 'id' order")


# ---- without Ray: batch formats in, datasets' layout out -------------------------------------
@pytest.mark.parametrize("fmt", ["pyarrow", "pandas", "numpy"])
def test_batch_formats_encode_to_the_datasets_rows(raw, reference, fmt):
    table = raw.with_format("arrow")[:]
    if fmt == "pandas":
        batch = table.to_pandas()
    elif fmt == "numpy":  # what Ray's numpy format hands over: object arrays of arrays and dicts
        df = table.to_pandas()
        batch = {c: df[c].to_numpy() for c in df.columns}
        assert isinstance(batch["messages"][0], np.ndarray)
    else:
        batch = table
    assert len(batch_rows(batch)) == len(raw)
    enc = RayBatchEncoder(functools.partial(testing.build_processor, FAMILY), keep_columns=["id"])
    _check_table(enc(batch), reference, len(raw))


def test_processor_given_as_a_saved_directory(raw, reference, tmp_path):
    """What a cluster does: every worker loads the processor from a shared path."""
    testing.build_processor(FAMILY).save_pretrained(tmp_path / "proc")
    enc = RayBatchEncoder(str(tmp_path / "proc"), keep_columns=["id"])
    assert hasattr(enc.processor, "image_processor")  # a Qwen-VL processor, not a bare tokenizer
    _check_table(enc(raw.with_format("arrow")[:]), reference, len(raw))


def test_dropped_rows_leave_the_batch_and_errors_name_the_row(raw, reference):
    lengths = [len(x) for x in reference.column("input_ids").to_pylist()]
    budget = sorted(lengths)[len(lengths) // 2]
    enc = RayBatchEncoder(processor_for(FAMILY), keep_columns=["id"], max_length=budget, truncation="drop")
    out = enc(raw.with_format("arrow")[:])
    assert out.column("id").to_pylist() == [i for i, n in enumerate(lengths) if n <= budget]
    assert sum(enc.encoder.stats.dropped.values()) == sum(n > budget for n in lengths)
    strict = RayBatchEncoder(processor_for(FAMILY), index_column="id", max_length=budget)
    with pytest.raises(ValueError, match=r"row \d+: \d+ tokens"):
        strict(raw.with_format("arrow")[:])
    with pytest.raises(TypeError, match="processor path"):
        load_processor(42)


# every family through the one pipeline: (family, encoder options), with the generic path twice
FAMILY_CASES = [("qwen2_5_vl", {}), ("glm4v", {}), ("gemma3", {}), ("internvl", {}), ("llava_onevision", {}),
                ("gemma3", {"family": "generic"}), ("idefics3", {}), ("qwen3_vl", {"pixels": "source"})]


@pytest.mark.parametrize("family,options", FAMILY_CASES, ids=lambda x: x if isinstance(x, str) else
                         ",".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_every_family_encodes_to_the_table_datasets_map_writes(raw, family, options):
    """Batches of 4 (the last one 2) and of 1: one schema, and the table datasets.map writes, value
    for value (column order, Arrow types, features in the metadata)."""
    proc = processor_for(family)
    want = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, **options}, remove_columns=raw.column_names)
    table = raw.with_format("arrow")[:]
    for size in (4, 1):
        enc = RayBatchEncoder(proc, **options)
        parts = [enc(table.slice(i, size)) for i in range(0, len(raw), size)]
        assert len({p.schema for p in parts}) == 1, size
        got = pa.concat_tables(parts)
        assert got.equals(want.data.table), (family, size)
        assert datasets.Features.from_arrow_schema(got.schema) == want.features
    if options.get("pixels") != "source":  # source rows come back from a batch decoded (tested in encoding/)
        rows = mmpipe.rows_from_arrow(got)
        assert_roundtrip(rows[:4], batch=mmpipe.Collator(proc)(rows[:4]))


# ---- on a local Ray ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    # the marker factory lives in this test module, which Ray workers cannot import
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _encode(ray, ds, factory, workers, **kw):
    return ds.map_batches(RayBatchEncoder, fn_constructor_args=(factory,),
                          fn_constructor_kwargs={"keep_columns": ["id"]}, batch_size=4, num_cpus=1,
                          compute=ray.data.ActorPoolStrategy(size=workers), **kw)


def test_from_huggingface_equals_datasets_map_one_processor_per_worker(ray_local, raw, reference, tmp_path):
    ray = ray_local
    markers = tmp_path / "built"
    markers.mkdir()
    workers = cluster_workers(reserve_cpus=0)  # from_huggingface: no read task needs a CPU
    assert workers == 2
    out = _encode(ray, ray.data.from_huggingface(raw, override_num_blocks=2),
                  functools.partial(marked_processor, str(markers), FAMILY), workers, batch_format="pyarrow")
    table = pa.concat_tables(ray.get(out.to_arrow_refs()))
    _check_table(table, reference, len(raw))
    assert table.column("id").to_pylist() == list(range(len(raw)))  # preserve_order
    builds = os.listdir(markers)
    pids = {b.split("-")[0] for b in builds}
    assert 1 <= len(builds) == len(pids) <= 2  # one build per actor, at most `workers` actors
    assert len(builds) < -(-len(raw) // 4)     # fewer builds than the 4 batches


def test_sized_from_the_cluster_a_tiled_family_read_and_written_as_parquet_loads_in_datasets(ray_local, raw,
                                                                                              tmp_path):
    """The documented call (encode_with_ray: one actor per CPU less one for the read task) on 2
    CPUs, Gemma 3 rows from read_parquet (pyarrow batches), written by Ray, loaded by datasets."""
    ray = ray_local
    family = "gemma3"
    want = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(family)}, remove_columns=raw.column_names)
    raw.to_parquet(str(tmp_path / "raw.parquet"))
    assert cluster_workers() == 1
    out = encode_with_ray(ray.data.read_parquet(str(tmp_path / "raw.parquet")),
                          functools.partial(testing.build_processor, family), keep_columns=["id"])
    out.write_parquet(str(tmp_path / "encoded"))
    back = datasets.load_dataset("parquet", data_files=str(tmp_path / "encoded" / "*.parquet"), split="train")
    assert {k: v for k, v in back.features.items() if k != "id"} == want.features
    back = back.sort("id").flatten_indices()  # .data.table is the stored order: sort it for real
    assert back["id"] == list(range(len(raw)))
    assert back.remove_columns(["id"]).data.table.equals(want.data.table)
    rows = [back[i] for i in range(3)]
    assert_roundtrip(rows, batch=mmpipe.Collator(processor_for(family))(rows))


def test_on_error_skip_keeps_the_failing_row_like_datasets_map(raw):
    proc = processor_for(FAMILY)
    broken = raw.select(range(4)).map(
        lambda r: {"images": r["images"][:-1] if r["id"] == 2 else r["images"]})  # row 2: a placeholder too many
    want = broken.map(mmpipe.encode, fn_kwargs={"processor": proc, "on_error": "skip"}, with_indices=True)
    got = RayBatchEncoder(proc, index_column="id", keep_columns=["id"], on_error="skip")(broken.with_format("arrow")[:])
    assert got.column("mmpipe_error").to_pylist() == want["mmpipe_error"]
    assert got.column("mmpipe_error")[2].as_py() and '"row": 2' in got.column("mmpipe_error")[2].as_py()
    assert got.column("input_ids").to_pylist() == want["input_ids"]
