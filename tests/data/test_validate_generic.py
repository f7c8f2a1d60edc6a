"""mmpipe.validate_dataset on saved generic-path datasets (processors without a family table:
Idefics3, LLaVA 1.5): clean rows validate clean (they were reported as broken patch-grid rows:
'mm_token_type_ids missing', 're-encode'); damaged rows are reported by row and column: flat
pixel values that do not fill their stored shape, a sequence key of the wrong length, rows of
another processor mixed in. Rows written back from ``unbatch(collate(rows))`` validate clean."""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.testing.invariants import as_rows, assert_roundtrip, assert_unbatched_rows_valid

IMAGES = [testing.tiny_image(40, 60, seed=1), testing.tiny_image(52, 36, seed=2)]


def _raw(n: int, k: int) -> dict:
    content = [{"type": "image"}] * n + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": IMAGES[:n]}


@pytest.fixture(scope="module", params=["idefics3", "llava"])
def saved(request, tmp_path_factory):
    proc = build_foreign_processor(request.param)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate((0, 1, 2, 1))]),
                                   proc)
    path = tmp_path_factory.mktemp(request.param)
    enc.save_to_disk(str(path))
    return request.param, proc, path


def _damaged(src, tmp_path, row: int, change) -> str:
    ds = datasets.load_from_disk(str(src))
    rows = ds.to_list()
    change(rows)
    out = tmp_path / "damaged"
    datasets.Dataset.from_list(rows, features=ds.features).save_to_disk(str(out))
    return str(out)


def test_clean_generic_rows_validate_clean(saved):
    name, proc, path = saved
    report = mmpipe.validate_dataset(str(path))
    assert report.ok and not report.warnings and report.pixel_format == "float32", str(report)
    assert report.num_rows == 4 and report.labels


def test_pixel_values_cut_short_are_reported_by_row(saved, tmp_path):
    name, proc, path = saved
    report = mmpipe.validate_dataset(_damaged(path, tmp_path, 2, lambda rows: rows[2]["pixel_values"].pop()))
    assert not report.ok
    (issue,) = report.errors
    assert issue.column == "pixel_values" and issue.rows == [2], str(report)


def test_a_sequence_of_the_wrong_length_is_reported_by_row(saved, tmp_path):
    name, proc, path = saved
    report = mmpipe.validate_dataset(_damaged(path, tmp_path, 1, lambda rows: rows[1]["labels"].append(-100)))
    (issue,) = report.errors
    assert issue.column == "labels" and issue.rows == [1], str(report)


def test_rows_of_another_processor_are_reported(saved, tmp_path):
    name, proc, path = saved
    other = "llava" if name == "idefics3" else "idefics3"
    layout = mmpipe.encode_row(_raw(1, 0), build_foreign_processor(other)).layout.to_json()

    def swap(rows):
        rows[3]["generic_layout"] = layout

    report = mmpipe.validate_dataset(_damaged(path, tmp_path, 3, swap))
    assert any(i.column == "generic_layout" and i.rows == [3] for i in report.errors), str(report)


def test_missing_columns_are_errors(saved):
    name, proc, path = saved
    ds = datasets.load_from_disk(str(path)).remove_columns(["generic_shapes"])
    report = mmpipe.validate_dataset(ds)
    assert [(i.kind, i.column) for i in report.errors] == [("missing_column", "generic_shapes")], str(report)


def test_unbatched_rows_written_back_validate_clean_and_collate(saved, tmp_path):
    """The held-out loss of issue 26: rows of ``unbatch(collate(rows))`` on the generic path
    were built without their layout, so the image-less row stored no pixel columns; written
    back, ``validate_dataset`` reported "2 different processor layouts" and
    ``Dataset.from_list`` dropped every row's pixel columns (collate then failed on a missing
    column). Unbatched rows keep the batch's layout: written back (the image-less row 0
    included) they validate clean, store what the encoder stored, and collate again."""
    name, proc, path = saved
    stored = datasets.load_from_disk(str(path))
    rows = as_rows(list(stored))
    assert rows[0].num_images == 0 and rows[0].vision == {}
    back = assert_unbatched_rows_valid(assert_roundtrip(rows, processor=proc))
    written = datasets.Dataset.from_list([r.to_dict() for r in back])
    assert sorted(written.column_names) == sorted(stored.column_names)
    out = tmp_path / "written_back"
    written.save_to_disk(str(out))
    report = mmpipe.validate_dataset(str(out))
    assert report.ok and not report.warnings and report.pixel_format == "float32", str(report)
    assert_roundtrip(rows, batch=mmpipe.collate(list(datasets.load_from_disk(str(out))), processor=proc))
