"""validate_dataset on stored datasets as users put them together: found by the data-layer hunt.

- ``concatenate_datasets`` of a ``pixels="uint8"`` and a ``pixels="source"`` encode collates exactly,
  but validate reported the float32 ``pixel_values`` column (no row stores it) as missing, an error;
  and in such a mixed table a row with images whose every pixel value is null went unreported;
- a pixel-storing encode that lost its image pixel column (``remove_columns``, a column subset
  written to parquet) validated OK as layout-only, with warnings calling its
  ``pixel_values_videos_u8`` / ``pixel_digest`` columns foreign; collate then refuses its image rows.
"""

from __future__ import annotations

import datasets
import pyarrow as pa
import pytest
import torch

import mmpipe
from mmpipe import testing

from conftest import processor_for


def _encode(counts, **kw):
    proc = processor_for("qwen2_vl")
    raws = []
    for i, n in enumerate(counts):
        content = [{"type": "image"}] * n + [{"type": "text", "text": f"Row {i}."}]
        raws.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
                     "images": [testing.tiny_image(40, 56 + 8 * j, seed=i + j) for j in range(n)]})
    ds = datasets.Dataset.from_list(raws)
    return ds.map(mmpipe.encode, fn_kwargs={"processor": proc, **kw}, remove_columns=ds.column_names)


@pytest.fixture(scope="module")
def u8():
    datasets.disable_progress_bars()
    return _encode((1, 0, 2))


@pytest.fixture(scope="module")
def mixed(u8):
    return datasets.concatenate_datasets([u8, _encode((1, 0, 2), pixels="source")])


def test_concatenated_pixel_formats_validate(mixed):
    proc = processor_for("qwen2_vl")
    b = mmpipe.Collator(proc)([mixed[i] for i in range(len(mixed))])
    assert torch.equal(b.pixel_values[: len(b.pixel_values) // 2], b.pixel_values[len(b.pixel_values) // 2:])
    report = mmpipe.validate_dataset(mixed)
    assert report.ok, str(report)
    assert report.pixel_format == "mixed" and [i.severity for i in report.issues] == ["warning"]  # "several formats"


def test_mixed_row_without_any_pixels_is_named(mixed):
    t = mixed.data.table
    px = t.column("pixel_values_u8").to_pylist()
    px[2] = None  # row 2 (two images) loses its pixels; its image_sources value is null (a uint8 row)
    t = t.set_column(t.column_names.index("pixel_values_u8"), t.schema.field("pixel_values_u8"), pa.array(px, pa.binary()))
    report = mmpipe.validate_dataset(t)
    assert not report.ok
    assert [(i.column, i.rows) for i in report.errors] == [("pixel_values_u8 / image_sources", [2])]


@pytest.mark.parametrize("pixels,column", [("uint8", "pixel_values_u8"), ("float32", "pixel_values"),
                                           ("source", "image_sources")])
def test_lost_pixel_column_is_an_error(u8, pixels, column):
    ds = u8 if pixels == "uint8" else _encode((1, 0), pixels=pixels)
    report = mmpipe.validate_dataset(ds.remove_columns([column]))
    assert not report.ok
    assert column in report.errors[0].column
    assert not [i for i in report.issues if i.kind == "extra_column" and i.column == "pixel_values_videos_u8"]
    assert mmpipe.validate_dataset(ds).ok
    assert mmpipe.validate_dataset(_encode((1, 0), pixels="none")).ok  # layout-only as encoded: fine


def test_local_parquet_shards_write_validate_load(u8, tmp_path):
    """write_shards to a local folder that does not exist yet (was: a bare FileNotFoundError),
    then the folder / a glob validated and loaded as its s3:// URL would be (was: "not a
    save_to_disk directory"), a damaged shard named."""
    from mmpipe.data.object_store import DamagedShardError, stream_encoded, write_shards

    urls = write_shards(u8, str(tmp_path / "enc" / "v1"), num_shards=2)
    assert len(urls) == 2 and sum(1 for _ in stream_encoded(str(tmp_path / "enc" / "v1"))) == len(u8)
    for where in (tmp_path / "enc" / "v1", str(tmp_path / "enc" / "v1" / "*.parquet"), f"file://{tmp_path}/enc/v1"):
        report = mmpipe.validate_dataset(where)
        assert report.ok and report.num_rows == len(u8), str(report)
    back = mmpipe.load_encoded(str(tmp_path / "enc" / "v1"))
    assert back["input_ids"] == u8["input_ids"] and back["pixel_values_u8"] == u8["pixel_values_u8"]
    data = open(urls[1], "rb").read()
    open(urls[1], "wb").write(data[: len(data) // 2])
    with pytest.raises(DamagedShardError):
        mmpipe.validate_dataset(tmp_path / "enc" / "v1")


@pytest.mark.parametrize("shift,typ", [(0, pa.int64()), (300, pa.int64()), (-1, pa.int16())])
def test_u8_list_repair_only_when_every_value_is_a_byte(u8, shift, typ):
    """Compact pixels written as a list of integers (older layout / another tool): fix=True converts
    them when every value is a byte; a value outside 0..255 is reported, not a bare OverflowError."""
    t = u8.data.table
    lists = [[v + shift for v in b[:-1]] for b in t.column("pixel_values_u8").to_pylist()]  # without the end marker
    typ = pa.list_(typ)
    t = t.set_column(t.column_names.index("pixel_values_u8"), pa.field("pixel_values_u8", typ), pa.array(lists, typ))
    report = mmpipe.validate_dataset(t, fix=True)
    if shift == 0:
        assert report.ok and report.data.column("pixel_values_u8").equals(u8.data.table.column("pixel_values_u8"))
    else:
        assert not report.ok and report.errors[0].column == "pixel_values_u8"
        assert "outside 0..255" in report.errors[0].message and "re-encode" in report.errors[0].fix
