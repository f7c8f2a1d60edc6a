"""pixels="source": the encoded file bytes are stored, collate decodes + resizes them, bit for bit
the uint8 path (and so the processor's pixel_values)."""

from __future__ import annotations

import base64
import io

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import mmpipe
from mmpipe import testing

from conftest import processor_for


def _file(im: Image.Image, fmt: str, **kw) -> bytes:
    f = io.BytesIO()
    im.save(f, fmt, **kw)
    return f.getvalue()


def _row(i: int, images: list) -> dict:
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": f"Question {i}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}."}]}],
            "images": images}


@pytest.fixture(scope="module")
def files():
    photos = [im for _, im in testing.sample_photos()] + [testing.tiny_image(90, 130, seed=3, mode="RGBA")]
    return [_file(im, "JPEG" if i % 2 and im.mode == "RGB" else "PNG") for i, im in enumerate(photos)]


@pytest.fixture(scope="module")
def raw(files):
    rows = [_row(i, [{"bytes": files[(i + j) % len(files)], "path": None} for j in range(k)])
            for i, k in enumerate([1, 2, 0, 3, 1, 2])]
    return datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image(decode=False)))


def test_source_rows_collate_to_the_uint8_pixels_and_store_the_files(raw, files):
    proc = processor_for("qwen2_vl")
    src = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source"}, remove_columns=raw.column_names,
                  **mmpipe.map_kwargs(proc, raw, pixels="source"))
    u8 = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    assert "pixel_values_u8" not in src.column_names
    stored = [b for r in src["image_sources"] for b in r]
    given = [im["bytes"] for r in raw.cast_column("images", datasets.List(datasets.Image(decode=False)))["images"]
             for im in r]
    assert stored == given  # the files themselves: 1.0x the sources on disk
    idx = list(range(len(raw)))
    c = mmpipe.Collator(proc)
    want = c([u8[i] for i in idx])
    for got in (c([src[i] for i in idx]), c(mmpipe.ArrowRows(src).__getitems__(idx))):
        assert torch.equal(got.pixel_values, want.pixel_values)
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.position_ids, want.position_ids)
        assert torch.equal(got.image_grid_thw, want.image_grid_thw)
    one = Image.open(io.BytesIO(files[0]))  # row 0's image
    ref = proc.image_processor(images=[one], return_tensors="pt")["pixel_values"]
    assert torch.equal(c([src[0]]).pixel_values, ref)  # the processor's pixel_values, bit for bit
    rec = mmpipe.MultiModalInputs.from_dict(src[1])
    assert rec.pixel_format == "source" and mmpipe.MultiModalInputs.from_dict(rec.to_dict()) == rec


def test_source_rows_decode_in_dataloader_workers(raw):
    proc = processor_for("qwen2_vl")
    src = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source"}, remove_columns=raw.column_names)
    u8 = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    c = mmpipe.Collator(proc)
    got = list(DataLoader(src, batch_size=3, collate_fn=c, num_workers=1))
    want = list(DataLoader(u8, batch_size=3, collate_fn=c))
    assert all(torch.equal(a.pixel_values, b.pixel_values) for a, b in zip(got, want))


def test_every_image_form_round_trips(tmp_path, files):
    """Paths and data URIs keep their file; PIL images (and EXIF-rotated ones) become lossless
    PNGs of their pixels: the collated pixels equal the uint8 encode's in every case."""
    proc = processor_for("qwen2_5_vl")
    path = tmp_path / "a.jpg"
    path.write_bytes(files[1])
    rotated = testing.tiny_image(60, 100, seed=1)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 on display
    rot_bytes = _file(rotated, "JPEG", exif=exif)
    forms = [str(path), "data:image/png;base64," + base64.b64encode(files[0]).decode(),
             Image.open(io.BytesIO(files[2])).convert("RGB"), Image.open(io.BytesIO(rot_bytes)),
             {"bytes": rot_bytes, "path": None}, np.asarray(testing.tiny_image(40, 70, seed=2))]
    for i, form in enumerate(forms):
        row = _row(i, [form])
        src = mmpipe.encode_row(row, proc, pixels="source")
        u8 = mmpipe.encode_row(row, proc)
        if isinstance(form, str) and not form.startswith("data:"):
            assert src.image_sources == [files[1]]
        if isinstance(form, str) and form.startswith("data:"):
            assert src.image_sources == [files[0]]
        c = mmpipe.Collator(proc)
        assert torch.equal(c([src.to_dict()]).pixel_values, c([u8]).pixel_values), i


def test_a_source_that_disagrees_with_its_grid_is_refused(raw):
    proc = processor_for("qwen2_vl")
    rec = mmpipe.encode_row(raw[0], proc, pixels="source")
    other = mmpipe.encode_row(raw[1], proc, pixels="source")
    rec.image_sources = [other.image_sources[1]]  # another image's file
    if tuple(rec.image_grid_thw[0]) != tuple(other.image_grid_thw[1]):
        with pytest.raises(mmpipe.errors.ImageError, match="stores"):
            mmpipe.Collator(proc)([rec])


def test_readme_source_block_runs():
    from helpers import readme_block

    exec(compile(readme_block("### Source-bytes storage"), "README", "exec"), {})


def _saved_source_table(raw, tmp_path):
    proc = processor_for("qwen2_vl")
    src = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source"}, remove_columns=raw.column_names)
    return proc, src.data.table.combine_chunks()


def _edit_source(table, row: int, edit):
    """``table`` with row ``row``'s first stored file replaced by ``edit(bytes)``."""
    import pyarrow as pa

    values = table.column("image_sources").to_pylist()
    values[row] = [edit(values[row][0])] + values[row][1:]
    i = table.column_names.index("image_sources")
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def test_validate_and_inspect_see_source_rows(raw, tmp_path, capsys):
    """validate_dataset reports pixels=source and checks every stored file (its digest and that
    its header opens); `mmpipe inspect` counts the files as the stored pixel bytes."""
    from mmpipe.cli.main import main
    from mmpipe.data.validate import validate_dataset

    proc, table = _saved_source_table(raw, tmp_path)
    report = validate_dataset(table)
    assert report.ok and report.pixel_format == "source", str(report)
    assert "pixel_digest" in table.column_names
    # a byte flipped inside the compressed data: the header still opens, the digest catches it
    flipped = _edit_source(table, 3, lambda b: b[:-40] + bytes([b[-40] ^ 0x10]) + b[-39:])
    bad = validate_dataset(flipped)
    assert [(i.column, i.rows) for i in bad.errors] == [("image_sources", [3])], str(bad)
    with pytest.raises(mmpipe.errors.PixelDataError, match="row 0.*image_sources|image_sources.*row 0"):
        mmpipe.collate(mmpipe.ArrowRows(datasets.Dataset(flipped)).__getitems__([3]), processor=proc,
                       verify_pixels=True)
    # a file cut to its first bytes: it no longer opens
    cut = _edit_source(table, 1, lambda b: b[:8])
    bad = validate_dataset(cut, positions=False)
    assert any(i.column == "image_sources" and i.rows == [1] and "does not open" in i.message for i in bad.errors), str(bad)
    out = tmp_path / "src"
    datasets.Dataset(table).save_to_disk(str(out))
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    n_bytes = sum(len(b) for r in table.column("image_sources").to_pylist() for b in r)
    assert "pixels       source:" in text and "the image files" in text
    from mmpipe.cli.inspect import dataset_stats

    assert dataset_stats(out).pixel_bytes == n_bytes


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
@pytest.mark.parametrize("batched", [False, True])
def test_a_first_write_without_images_keeps_the_sources_column_typed(files, family, batched):
    """``datasets`` fixes a map's column types from its first written rows: rows without images
    first (a text-only part of an SFT mix) must not type ``image_sources`` as ``list<null>``, to
    which every later row's files would fail to cast ("Couldn't cast array of type binary to null")."""
    proc = processor_for(family)
    raw = datasets.Dataset.from_list([_row(0, []), _row(1, []), _row(2, [{"bytes": files[0], "path": None}])])
    out = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source"}, batched=batched, batch_size=1,
                  writer_batch_size=1, remove_columns=raw.column_names)
    assert out.features["image_sources"] == datasets.List(datasets.Value("binary"))
    assert [len(s) for s in out["image_sources"]] == [0, 0, 1] and out["image_sources"][2][0] == files[0]
    want = mmpipe.collate([mmpipe.encode_row(raw[2], proc)], processor=proc)
    got = mmpipe.Collator(proc)([out[2]])
    assert torch.equal(torch.as_tensor(got.pixel_values), torch.as_tensor(want.pixel_values))


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3", "internvl", "llava_onevision"])
def test_source_rows_come_back_as_source_rows(files, family):
    """``unbatch(collate(rows)) == rows`` for ``pixels="source"`` rows too: each row gets its files
    back (the batch carries them, ``row_image_sources``), not the pixels collate decoded from them;
    next to rows of another storage, through the stored dicts and the batch's Arrow form."""
    from mmpipe.testing import invariants

    proc = processor_for(family)
    raws = [_row(i, [{"bytes": files[(i + j) % len(files)], "path": None} for j in range(k)])
            for i, k in enumerate([1, 0, 2])]
    rows = [mmpipe.encode_row(r, proc, pixels="source") for r in raws]
    for side in ("left", "right"):
        batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
    assert [r.pixel_format for r in rows] == ["source"] * 3  # and unbatch gave them back equal, files included
    assert [len(s) for s in batch.to_arrow().column("row_image_sources")[0].as_py()] == [1, 0, 2]
    invariants.assert_roundtrip([r.to_dict() for r in rows], processor=proc)
    mixed = rows + [mmpipe.encode_row(raws[0], proc)]
    invariants.assert_roundtrip(mixed, processor=proc)
