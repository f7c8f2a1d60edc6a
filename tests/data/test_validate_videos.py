"""validate_dataset and load_encoded on rows with videos (issue 19): a saved dataset of mixed
image + video rows (0..2 videos per row, three families) validates clean, positions
recomputed from the video grids included; a byte flipped inside a row's stored video pixels
is reported for exactly that row (the pixel digest covers the video bytes); a video grid that
no longer matches the row's video tokens is an error naming the row."""

from __future__ import annotations

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe.data.validate import load_encoded, validate_dataset

from conftest import processor_for
from helpers import encode_mixed

LAYOUT = ["v", "", "Iv", "vIv", "I"]


def _table(family: str):
    rows = [r.to_dict() for r in encode_mixed(LAYOUT, processor_for(family))]
    return datasets.Dataset.from_list(rows).data.table.combine_chunks()


def _set_row(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.column_names.index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_video_rows_validate_clean_and_load(family, tmp_path):
    table = _table(family)
    report = validate_dataset(table)
    assert report.ok and not report.warnings and report.pixel_format == "uint8", str(report)
    datasets.Dataset(table).save_to_disk(str(tmp_path / "enc"))
    back = load_encoded(tmp_path / "enc")
    assert [mmpipe.MultiModalInputs.from_dict(r).num_videos for r in back] == [1, 0, 1, 2, 0]


def test_damaged_video_bytes_and_grids_are_named_by_row():
    table = _table("qwen2_5_vl")
    blob = table.column("pixel_values_videos_u8").to_pylist()[3]
    flipped = _set_row(table, "pixel_values_videos_u8", 3, blob[:100] + bytes([blob[100] ^ 0x01]) + blob[101:])
    bad = validate_dataset(flipped, positions=False)
    assert [(i.column, i.rows) for i in bad.errors] == [("pixel_values_u8 / pixel_values_videos_u8", [3])], str(bad)
    blob = table.column("pixel_values_videos_u8").to_pylist()[0]  # a row with a video and no image
    flipped = _set_row(table, "pixel_values_videos_u8", 0, blob[:50] + bytes([blob[50] ^ 0x01]) + blob[51:])
    bad = validate_dataset(flipped, positions=False)
    assert [(i.column, i.rows) for i in bad.errors] == [("pixel_values_videos_u8", [0])], str(bad)
    grids = table.column("video_grid_thw").to_pylist()[0]
    wrong = _set_row(table, "video_grid_thw", 0, [[grids[0][0] + 1, grids[0][1], grids[0][2]]])
    bad = validate_dataset(wrong)
    assert bad.errors and all(i.rows == [0] for i in bad.errors), str(bad)
