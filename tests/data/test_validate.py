"""mmpipe.data.validate: encoded datasets written by hand / by another version, checked against
the stored-row schema; each deliberate fault gives the expected report entry."""

from __future__ import annotations

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_from_arrow
from mmpipe.data.validate import SchemaError, check_dataset, load_encoded, validate_dataset

from conftest import processor_for

FAMILY = "qwen2_vl"


def _raw():
    imgs = [testing.tiny_image(40, 60, seed=1), testing.tiny_image(30, 30, seed=2, mode="RGBA"),
            testing.tiny_image(70, 28, seed=3)]
    rows = []
    for i in range(5):
        k = [1, 0, 2, 1, 3][i]
        content = []
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f"img {j}"}]
        content.append({"type": "text", "text": f"question {i}"})
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": f"answer {i}"}]
        rows.append({"messages": msgs, "images": imgs[:k]})
    return rows


@pytest.fixture(scope="module")
def encoded():
    """name -> (datasets.Dataset, the rows) for uint8 and float32 pixel storage."""
    proc = processor_for(FAMILY)
    out = {}
    for pixels in ("uint8", "float32"):
        rows = [mmpipe.encode_row(r, proc, idx=i, pixels=pixels) for i, r in enumerate(_raw())]
        ds = datasets.Dataset.from_list([r.to_dict() for r in rows],
                                        features=mmpipe.MultiModalInputs.features(pixels, labels=True))
        out[pixels] = (ds, rows)
    return out


def table_of(ds) -> pa.Table:
    return ds.data.table.replace_schema_metadata(None)


def set_col(t: pa.Table, name: str, values, typ=None) -> pa.Table:
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, type=typ)
    return t.set_column(t.column_names.index(name), pa.field(name, arr.type), arr)


def edit_row(t: pa.Table, name: str, row: int, fn, typ=None) -> pa.Table:
    vals = t.column(name).to_pylist()
    vals[row] = fn(vals[row])
    return set_col(t, name, vals, typ or t.column(name).type)


def test_valid_dataset_in_every_container(encoded, tmp_path):
    ds, rows = encoded["uint8"]
    ds.save_to_disk(str(tmp_path / "enc"))
    pq.write_table(table_of(ds), str(tmp_path / "enc.parquet"))
    for data in (ds, str(tmp_path / "enc"), str(tmp_path / "enc.parquet"), table_of(ds), ds.select([4, 0, 2])):
        report = validate_dataset(data)
        assert report.ok and not report.issues, str(report)
        assert report.pixel_format == "uint8" and report.labels
    assert "OK" in str(validate_dataset(ds))
    loaded = load_encoded(str(tmp_path / "enc"))
    assert_rows_from_arrow(loaded.data.table, rows)
    assert validate_dataset(encoded["float32"][0]).ok


# (fault name, pixel storage, mutate(table) -> table, expected (severity, kind, column, rows or None, text))
FAULTS = [
    ("missing_input_ids", "uint8", lambda t: t.drop_columns(["input_ids"]),
     ("error", "missing_column", "input_ids", None, "missing")),
    ("missing_image_grid", "uint8", lambda t: t.drop_columns(["image_grid_thw"]),
     ("error", "missing_column", "image_grid_thw", None, "missing")),
    ("missing_rope_delta", "uint8", lambda t: t.drop_columns(["rope_delta"]),
     ("warning", "missing_column", "rope_delta", None, "read as max(position_ids) + 1 - L")),
    ("missing_video_columns", "uint8", lambda t: t.drop_columns(["video_grid_thw", "second_per_grid_ts"]),
     ("warning", "missing_column", "video_grid_thw", None, "read as empty")),
    ("extra_column", "uint8", lambda t: t.append_column("source", pa.array(["web"] * t.num_rows)),
     ("warning", "extra_column", "source", None, "not a stored-row column")),
    ("ids_int64", "uint8", lambda t: set_col(t, "input_ids", t.column("input_ids").cast(pa.list_(pa.int64()))),
     ("error", "type", "input_ids", None, "expected list<item: int32>, found list<item: int64>")),
    ("ids_large_list", "uint8",
     lambda t: set_col(t, "input_ids", t.column("input_ids").cast(pa.large_list(pa.int32()))),
     ("error", "type", "input_ids", None, "found large_list")),
    ("ids_overflow_int32", "uint8",
     lambda t: set_col(t, "input_ids", [[v + 2**31 for v in r] for r in t.column("input_ids").to_pylist()],
                       pa.list_(pa.int64())),
     ("error", "type", "input_ids", None, "a cast would change values")),
    ("pixels_float64", "float32",
     lambda t: set_col(t, "pixel_values", t.column("pixel_values").cast(pa.list_(pa.list_(pa.float64())))),
     ("error", "type", "pixel_values", None, "found list<item: list<item: double>>")),
    ("pixels_u8_as_list", "uint8",
     lambda t: set_col(t, "pixel_values_u8", [list(b[:-1]) for b in t.column("pixel_values_u8").to_pylist()],
                       pa.list_(pa.uint8())),
     ("error", "type", "pixel_values_u8", None, "list of uint8 (older layout)")),
    ("family_large_string", "uint8", lambda t: set_col(t, "family", t.column("family").cast(pa.large_string())),
     ("error", "type", "family", None, "found large_string")),
    ("two_position_rows", "uint8", lambda t: edit_row(t, "position_ids", 2, lambda p: p[:2]),
     ("error", "content", "position_ids", [2], "expected shape (3,")),
    ("pixel_bytes_short", "uint8", lambda t: edit_row(t, "pixel_values_u8", 3, lambda b: b[:-5] + b[-1:]),
     ("error", "content", "pixel_values_u8", [3], "the pixel data and the grids disagree")),
    ("pixel_marker_lost", "uint8", lambda t: edit_row(t, "pixel_values_u8", 0, lambda b: b[:-1]),
     ("error", "content", "pixel_values_u8", [0], "re-encode")),  # marker check, or size if a pixel byte is 0xFF
    ("grid_vs_tokens", "uint8", lambda t: edit_row(t, "image_grid_thw", 4, lambda g: [g[0], g[1], [1, g[2][1] + 2, g[2][2]]]),
     ("error", "content", "pixel_values_u8", [4], "the pixel data and the grids disagree")),
    ("float_pixels_rows", "float32", lambda t: edit_row(t, "pixel_values", 2, lambda p: p[:-1]),
     ("error", "content", None, [2], "pixel_values")),
    ("unknown_family", "uint8", lambda t: edit_row(t, "family", 1, lambda f: "llava"),
     ("error", "family", "family", [1], "unknown model family ['llava']")),
    ("wrong_positions", "uint8", lambda t: edit_row(t, "position_ids", 0, lambda p: [[v + 1 for v in r] for r in p]),
     ("error", "content", "position_ids", [0], "differ from the M-RoPE rule")),
    ("wrong_rope_delta", "uint8", lambda t: set_col(t, "rope_delta", [0] * t.num_rows, pa.int32()),
     ("error", "content", "rope_delta", [0, 2, 3, 4], "differs from max(position_ids) + 1 - L")),
    ("token_type_7", "uint8", lambda t: edit_row(t, "mm_token_type_ids", 1, lambda m: [7] + m[1:]),
     ("error", "content", None, [1], "mm_token_type_ids")),
    ("labels_short", "uint8", lambda t: edit_row(t, "labels", 3, lambda lab: lab[1:]),
     ("error", "content", "labels", [3], "expected shape")),
    ("failed_rows_marked", "uint8",
     lambda t: t.append_column("mmpipe_error", pa.array(["", '{"row": 1}', "", "", ""])),
     ("warning", "failed_rows", "mmpipe_error", [1], "failed to encode")),
]


@pytest.mark.parametrize("name, pixels, mutate, expect", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_reported(encoded, name, pixels, mutate, expect):
    ds, _ = encoded[pixels]
    report = validate_dataset(mutate(table_of(ds)))
    severity, kind, column, rows, text = expect
    hits = [i for i in report.issues if i.kind == kind and i.severity == severity
            and (column is None or i.column == column) and text in str(i)]
    assert hits, f"expected a {severity} {kind} on {column} mentioning {text!r}; got:\n{report}"
    if rows is not None:
        assert sorted(r for h in hits for r in h.rows) == rows, str(report)
    assert report.ok == (severity != "error")
    if severity == "error":
        assert hits[0].fix, "every error says how to fix it"
        with pytest.raises(SchemaError) as info:
            check_dataset(mutate(table_of(ds)))
        assert isinstance(info.value, (InputError, ValueError)) and text in str(info.value)


SAFE = ["missing_rope_delta", "missing_video_columns", "ids_int64", "ids_large_list", "pixels_float64",
        "pixels_u8_as_list", "family_large_string"]


@pytest.mark.parametrize("name", SAFE)
def test_safe_repairs_give_back_the_original_rows(encoded, name):
    _, pixels, mutate, _ = next(f for f in FAULTS if f[0] == name)
    ds, rows = encoded[pixels]
    report = validate_dataset(mutate(table_of(ds)), fix=True)
    assert report.ok and report.fixed, str(report)
    assert sorted((f.name, str(f.type)) for f in report.data.schema) == \
        sorted((f.name, str(f.type)) for f in table_of(ds).schema)
    assert_rows_from_arrow(report.data, rows)
    assert validate_dataset(report.data).ok and not validate_dataset(report.data).issues


def test_unsafe_faults_are_not_fixed(encoded):
    ds, _ = encoded["uint8"]
    for name in ("ids_overflow_int32", "pixel_bytes_short", "missing_input_ids", "wrong_positions"):
        mutate = next(f[2] for f in FAULTS if f[0] == name)
        report = validate_dataset(mutate(table_of(ds)), fix=True)
        assert not report.ok, name


def _older_layout(t: pa.Table) -> pa.Table:
    """An "older mmpipe" layout: compact pixels as list<uint8> without the end marker, int64
    token ids, no rope_delta, no video columns, a bookkeeping column of its own."""
    t = t.drop_columns(["rope_delta", "video_grid_thw", "second_per_grid_ts", "pixel_values_videos_u8"])
    t = set_col(t, "pixel_values_u8", [list(b[:-1]) for b in t.column("pixel_values_u8").to_pylist()],
                pa.list_(pa.uint8()))
    t = set_col(t, "input_ids", t.column("input_ids").cast(pa.list_(pa.int64())))
    return t.append_column("num_images", pa.array([1, 0, 2, 1, 3]))


def test_older_version_layout_reported_then_repaired(encoded, tmp_path):
    ds, rows = encoded["uint8"]
    old = _older_layout(table_of(ds))
    report = validate_dataset(old)
    kinds = {(i.severity, i.kind, i.column) for i in report.issues}
    assert {("warning", "missing_column", "rope_delta"), ("error", "type", "pixel_values_u8"),
            ("error", "type", "input_ids"), ("warning", "extra_column", "num_images"),
            ("warning", "missing_column", "video_grid_thw")} <= kinds, str(report)
    pq.write_table(old, str(tmp_path / "old.parquet"))
    with pytest.raises(SchemaError, match="pixel_values_u8"):
        load_encoded(str(tmp_path / "old.parquet"))
    fixed = load_encoded(str(tmp_path / "old.parquet"), fix=True)
    assert isinstance(fixed, datasets.Dataset)
    assert_rows_from_arrow(fixed.data.table, rows)
    assert_roundtrip(rows, batch=mmpipe.collate(list(fixed), processor=processor_for(FAMILY)))
    # a repaired directory dataset comes back as a Dataset too
    datasets.Dataset(datasets.table.InMemoryTable(old)).save_to_disk(str(tmp_path / "old_dir"))
    again = validate_dataset(str(tmp_path / "old_dir"), fix=True)
    assert again.ok and isinstance(again.data, datasets.Dataset)


def test_report_lists_rows_and_counts(encoded):
    ds, _ = encoded["uint8"]
    t = set_col(table_of(ds), "family", ["llava"] * 5, pa.string())
    report = validate_dataset(t, max_rows_listed=2)
    (issue,) = report.errors
    assert issue.rows == [0, 1] and issue.num_rows == 5 and "(+3 more)" in str(issue)


def test_mmpipe_exports_validation():
    assert mmpipe.validate_dataset is validate_dataset and mmpipe.load_encoded is load_encoded
    assert mmpipe.check_dataset is check_dataset


def test_reader_derives_a_missing_rope_delta(encoded):
    """Rows of a layout without rope_delta read with the right delta (it was read as 0: every
    image row's generation positions would shift)."""
    ds, rows = encoded["uint8"]
    t = table_of(ds).drop_columns(["rope_delta"])
    assert [r.rope_delta for r in rows] != [0] * len(rows)
    assert_rows_from_arrow(t, rows)
    assert [mmpipe.MultiModalInputs.from_dict({k: v for k, v in d.items()}) for d in
            datasets.Dataset(datasets.table.InMemoryTable(t))] == rows
