"""mmpipe.validate_dataset on saved tiled-family datasets (Gemma 3, InternVL, LLaVA-OneVision):
clean rows validate clean (with and without the processor, pixels and layout-only); damaged
rows are reported by row and column: stored tile bytes that do not match the tile count, a tile
count that does not match the image size, a feature token replaced or cut out of the ids."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.data.validate import SchemaError

RNG = np.random.default_rng(11)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 56), (70, 30), (33, 97)]]
FAMILIES = ("gemma3", "internvl", "llava_onevision")


def _processor(name: str):
    return build_processor(name)


def _raw(n: int, k: int) -> dict:
    content = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": IMAGES[:n]}


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    """(family, processor, {pixels: saved dir}) with rows of 0, 1, 2 and 3 images."""
    proc = _processor(request.param)
    raw = datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate((0, 1, 2, 3))])
    dirs = {}
    for pixels in ("uint8", "none"):
        enc, _ = mmpipe.encode_dataset(raw, proc, pixels=pixels)
        dirs[pixels] = tmp_path_factory.mktemp(f"{request.param}_{pixels}")
        enc.save_to_disk(str(dirs[pixels]))
    return request.param, proc, dirs


def _damaged(src, tmp_path, row: int, change) -> str:
    """A copy of the saved dataset at ``src`` with ``change(row_dict)`` applied to row ``row``."""
    ds = datasets.load_from_disk(str(src))
    rows = ds.to_list()
    change(rows[row])
    out = tmp_path / "damaged"
    datasets.Dataset.from_list(rows, features=ds.features).save_to_disk(str(out))
    return str(out)


def _only_error(report, column: str, rows: list) -> str:
    assert not report.ok, str(report)
    errs = [i for i in report.errors if i.column == column]
    assert errs and errs[0].rows == rows, str(report)
    return str(errs[0])


@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_clean_rows_validate_clean(saved, pixels):
    name, proc, dirs = saved
    for kw in ({}, {"processor": proc}):
        report = mmpipe.validate_dataset(str(dirs[pixels]), **kw)
        assert report.ok and not report.warnings, str(report)
        assert report.num_rows == 4 and report.pixel_format == pixels and report.labels
    assert len(mmpipe.load_encoded(str(dirs[pixels]))) == 4


def test_tile_bytes_that_do_not_match_the_tile_count(saved, tmp_path):
    name, proc, dirs = saved

    def more_tiles(r):
        r["tiles_per_image"][0] += 1

    path = _damaged(dirs["uint8"], tmp_path, 2, more_tiles)
    line = _only_error(mmpipe.validate_dataset(path), "pixel_values_u8", [2])
    assert "bytes" in line and "re-encode" in line
    with pytest.raises(SchemaError, match="pixel_values_u8"):
        mmpipe.load_encoded(path)

    def cut_bytes(r):
        r["pixel_values_u8"] = r["pixel_values_u8"][:-1]

    _only_error(mmpipe.validate_dataset(_damaged(dirs["uint8"], tmp_path / "b", 3, cut_bytes)), "pixel_values_u8", [3])


def test_tile_count_vs_image_size_layout_only(saved, tmp_path):
    """Layout-only rows store no bytes to count: the processor says how many tiles an image has."""
    name, proc, dirs = saved

    def more_tiles(r):
        r["tiles_per_image"][1] += 1

    path = _damaged(dirs["none"], tmp_path, 3, more_tiles)
    line = _only_error(mmpipe.validate_dataset(path, processor=proc), "tiles_per_image", [3])
    assert "image 1" in line and "tile count" in line
    if name == "gemma3":  # one feature run per tile: visible without the processor too
        _only_error(mmpipe.validate_dataset(path), "mm_token_type_ids", [3])


@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_a_feature_token_replaced_in_the_ids(saved, tmp_path, pixels):
    name, proc, dirs = saved

    def replace(r):
        at = int(np.flatnonzero(np.asarray(r["mm_token_type_ids"]) == 1)[2])
        r["input_ids"][at] = r["input_ids"][0] if r["input_ids"][0] != r["input_ids"][at] else r["input_ids"][1]

    path = _damaged(dirs[pixels], tmp_path, 1, replace)
    for kw in ({}, {"processor": proc}):
        line = _only_error(mmpipe.validate_dataset(path, **kw), "input_ids", [1])
        assert "marked as image features" in line


def test_a_feature_token_cut_out(saved, tmp_path):
    """One feature token deleted from every token column: the row is self-consistent, but holds
    one token fewer than its image needs (the processor's count)."""
    name, proc, dirs = saved

    def cut(r):
        at = int(np.flatnonzero(np.asarray(r["mm_token_type_ids"]) == 1)[0])
        for col in ("input_ids", "attention_mask", "labels", "mm_token_type_ids"):
            del r[col][at]

    path = _damaged(dirs["none"], tmp_path, 2, cut)
    line = _only_error(mmpipe.validate_dataset(path, processor=proc), "input_ids", [2])
    assert "wrong number" in line


def test_token_columns_of_different_lengths_are_reported_not_raised(saved, tmp_path):
    """input_ids cut shorter than mm_token_type_ids in one row: without a processor the feature token
    is guessed from the marked ids of every row; the short row is reported by row and column, not
    an IndexError from arrays that do not line up."""
    name, proc, dirs = saved

    def cut(r):
        del r["input_ids"][-1]

    path = _damaged(dirs["uint8"], tmp_path, 1, cut)
    for kw in ({}, {"processor": proc}):
        report = mmpipe.validate_dataset(path, **kw)
        assert not report.ok and [1] in [i.rows for i in report.errors], str(report)


def test_a_feature_token_left_unmarked(saved, tmp_path):
    name, proc, dirs = saved

    def unmark(r):
        at = int(np.flatnonzero(np.asarray(r["mm_token_type_ids"]) == 1)[-1])
        r["mm_token_type_ids"][at] = 0

    line = _only_error(mmpipe.validate_dataset(_damaged(dirs["uint8"], tmp_path, 3, unmark)), "mm_token_type_ids", [3])
    assert "not marked" in line


def test_wrong_processor_and_wrong_types(saved, tmp_path):
    name, proc, dirs = saved
    other = _processor("internvl" if name != "internvl" else "gemma3")
    report = mmpipe.validate_dataset(str(dirs["uint8"]), processor=other)
    assert [i.column for i in report.errors] == ["family"], str(report)
    ds = datasets.load_from_disk(str(dirs["uint8"]))
    bad = ds.cast_column("image_hw", datasets.List(datasets.Value("float32")))
    report = mmpipe.validate_dataset(bad)
    assert [(i.kind, i.column) for i in report.errors] == [("type", "image_hw")], str(report)


def test_a_flipped_byte_in_stored_source_files(tmp_path):
    """Rows with pixels="source" carry a digest of their image files: one flipped byte is reported
    by row and column (uint8 tile rows: test_a_flipped_byte_in_stored_tiles)."""
    import io

    def png(img):
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return {"bytes": buf.getvalue()}

    for name in ("gemma3", "llava_onevision"):
        proc = _processor(name)
        raws = [dict(_raw(n, k), images=[png(im) for im in IMAGES[:n]]) for k, n in enumerate((0, 1, 2))]
        enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(raws), proc, pixels="source")
        report = mmpipe.validate_dataset(enc, processor=proc)
        assert report.ok and report.pixel_format == "source", str(report)
        rows = enc.to_list()
        flipped = bytearray(rows[2]["image_sources"][1])
        flipped[len(flipped) // 2] ^= 1
        rows[2]["image_sources"][1] = bytes(flipped)
        report = mmpipe.validate_dataset(datasets.Dataset.from_list(rows, features=enc.features))
        assert "pixel_digest" in _only_error(report, "image_sources", [2])


def test_a_flipped_byte_in_stored_tiles(saved, tmp_path):
    """Rows with uint8 tiles carry a digest of the tile bytes: one flipped byte inside a tile is
    reported for its row and column, and reading the row back refuses it."""
    from mmpipe.errors import PixelDataError
    from mmpipe.records.row import MultiModalInputs

    name, proc, dirs = saved

    def flip(row):
        row["pixel_values_u8"][len(row["pixel_values_u8"]) // 3] ^= 1

    ds = datasets.load_from_disk(str(dirs["uint8"]))
    assert all(r["pixel_digest"] is not None for r in ds.select_columns(["pixel_digest"]).to_list())
    bad = _damaged(dirs["uint8"], tmp_path, 2, flip)
    report = mmpipe.validate_dataset(bad, processor=proc)
    assert "pixel_digest" in _only_error(report, "pixel_values_u8", [2])
    with pytest.raises(PixelDataError, match="pixel_digest"):
        MultiModalInputs.from_dict(datasets.load_from_disk(bad)[2], row=2)
