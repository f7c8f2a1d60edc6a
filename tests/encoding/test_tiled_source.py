"""``pixels="source"`` for the tiled families (Gemma 3, InternVL, LLaVA-OneVision; issue 20/18.3):
the rows keep each image's file bytes plus the layout from the headers, and collate decodes,
tiles and normalises them - bit for bit the ``"uint8"`` rows' pixels and the processor's own,
on real photos (JPEG/PNG files), odd sizes, RGBA/P/L images and an EXIF-rotated JPEG; through
Arrow (datasets.map) and a DataLoader worker; ~1.0x the source files on disk."""

from __future__ import annotations

import pickle
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.offline.tile_builders import build_tiled2_processor
from mmpipe.records.row import MultiModalInputs

from helpers import odd_images, photo_paths

PAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
CASES = {"gemma3": ("gemma3", {}), "gemma3_pan_and_scan": ("gemma3", PAN),
         "internvl": ("internvl", {}), "llava_onevision": ("llava_onevision", {})}


def _processor(family: str):
    return build_processor(family)


def _raw(images: list, k: int) -> dict:
    content = [{"type": "text", "text": f"row {k}:"}] + [{"type": "image"}] * len(images) + \
              [{"type": "text", "text": "what is shown?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"answer {k}"}]}],
            "images": images}


def _upright_rgb(value) -> Image.Image:
    from mmpipe.images.load import load_image, to_rgb_image, upright

    return to_rgb_image(upright(load_image(value)))


@pytest.fixture(params=list(CASES))
def case(request):
    family, kwargs = CASES[request.param]
    return _processor(family), kwargs


def test_source_rows_collate_to_the_uint8_rows_and_the_processor(case):
    proc, kwargs = case
    paths, odd = photo_paths(), odd_images()
    sets = [[], [paths[1]], [paths[0], odd[0], odd[2]], odd[3:5], odd[5:] + [odd[1]], paths]
    u8 = [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs) for k, s in enumerate(sets)]
    src = [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs, pixels="source") for k, s in enumerate(sets)]
    for a, b in zip(u8, src):  # the same layout from the headers alone; files instead of tiles
        assert a.diff(b) == ["image_sources", "pixel_values_u8"]
        assert b.pixel_values_u8 is None and len(b.image_sources) == b.num_images
    stored = [MultiModalInputs.from_dict(r.to_dict(), i) for i, r in enumerate(src)]
    assert all(s.equals(r) for s, r in zip(stored, src))
    want, got = mmpipe.collate(u8, processor=proc), mmpipe.collate(stored, processor=proc)
    for name in ("input_ids", "attention_mask", "mm_token_type_ids", "tiles_per_image", "image_hw", "labels"):
        assert np.array_equal(getattr(want, name), getattr(got, name)), name
    assert got.pixel_values.dtype == np.float32 and np.array_equal(want.pixel_values, got.pixel_values)
    assert np.array_equal(want.pixel_values_u8, got.pixel_values_u8)
    assert want.extras.keys() == got.extras.keys() and all(np.array_equal(want.extras[k], got.extras[k])
                                                           for k in want.extras)
    for k, (s, row) in enumerate(zip(sets, src)):  # and the processor's own call on the upright images
        if not s:
            continue
        text = proc.apply_chat_template(_raw(s, k)["messages"], tokenize=False)
        images = [_upright_rgb(v) for v in s]
        if type(proc).__name__.endswith("LlavaOnevisionProcessor"):  # one list per chat, as its chat path (issue 28.4)
            images = [images]
        own = proc(text=[text], images=images, return_tensors="np", **kwargs)
        assert np.array_equal(own["input_ids"][0], row.input_ids)
        assert np.array_equal(own["pixel_values"], mmpipe.collate([row], processor=proc).pixel_values)


def test_arrow_dataloader_worker_and_bytes_vs_the_files(case):
    proc, kwargs = case
    paths = photo_paths()
    files = [{"bytes": Path(p).read_bytes(), "path": None} for p in paths]
    ds = datasets.Dataset.from_list([_raw(files[:n], n) for n in (1, 3, 2, 0)])
    ds = ds.cast_column("images", datasets.List(datasets.Image(decode=False)))
    common = {"remove_columns": ds.column_names}
    src = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source", "images_kwargs": kwargs}, **common)
    u8 = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "images_kwargs": kwargs}, **common)
    assert "pixel_values_u8" not in src.column_names and "image_sources" in src.column_names
    assert ("images_kwargs" in src.column_names) == bool(kwargs)
    assert src[1]["image_sources"] == [f["bytes"] for f in files[:3]]  # the files themselves
    stored = sum(len(b) for row in src["image_sources"] for b in row)
    on_disk = sum(len(f["bytes"]) for n in (1, 3, 2) for f in files[:n])
    tiles = sum(len(row) for row in u8["pixel_values_u8"])
    print(f"\n[{type(proc).__name__} {kwargs}] source bytes {stored} = {stored / on_disk:.3f}x the files; "
          f"uint8 tiles {tiles} ({tiles / on_disk:.1f}x the files); float32 {4 * tiles}")
    assert stored == on_disk
    collator = pickle.loads(pickle.dumps(mmpipe.Collator(proc)))  # as a DataLoader worker gets it
    loader = torch.utils.data.DataLoader(mmpipe.ArrowRows(src), batch_size=4, collate_fn=collator, num_workers=1)
    (batch,) = list(loader)
    want = mmpipe.Collator(proc)(mmpipe.ArrowRows(u8).__getitems__(range(4)))
    assert np.array_equal(batch.pixel_values, want.pixel_values) and np.array_equal(batch.input_ids, want.input_ids)
    rows = mmpipe.ArrowRows(src).__getitems__(range(4))
    assert np.array_equal(mmpipe.collate(rows, processor=proc).pixel_values, want.pixel_values)
    assert np.array_equal(mmpipe.collate(src.with_format("arrow")[:4], processor=proc).pixel_values,
                          want.pixel_values)


def test_a_changed_byte_is_caught_by_the_digest():
    proc = _processor("internvl")
    row = mmpipe.encode_row(_raw([photo_paths()[1]], 0), proc, pixels="source").to_dict()
    data = bytearray(row["image_sources"][0])
    data[len(data) // 2] ^= 0x40
    with pytest.raises(PixelDataError, match="pixel_digest"):
        MultiModalInputs.from_dict({**row, "image_sources": [bytes(data)]}, 0)


def test_collating_source_rows_needs_the_encoding_processor():
    proc = _processor("internvl")
    row = mmpipe.encode_row(_raw([photo_paths()[1]], 0), proc, pixels="source")
    with pytest.raises(ArgumentError, match="needs the processor"):
        mmpipe.collate([row])
    other = build_tiled2_processor("internvl", max_patches=2)  # other settings: other tile counts
    with pytest.raises(PixelDataError, match="tile"):
        mmpipe.collate([row], processor=other)
    row.image_backend = "torchvision"
    with pytest.raises(InputError, match="image backend"):
        mmpipe.collate([row], processor=proc)


def test_source_mode_checks_the_file_at_encode():
    """A source file is decoded once when its row is encoded (issue 29.4): one whose pixel data is
    cut fails there, naming the row and image (so on_error="skip" catches it), not at collate."""
    proc = _processor("gemma3")
    jpeg = Path(photo_paths()[1]).read_bytes()
    with pytest.raises(InputError, match="row 0, image 0: cannot read the image"):
        mmpipe.encode_row(_raw([jpeg[: len(jpeg) // 2]], 0), proc, idx=0, pixels="source")
    row = mmpipe.encode_row(_raw([jpeg], 0), proc, pixels="source")
    assert row.image_hw.tolist() == [list(_upright_rgb(jpeg).size[::-1])]


def test_skipped_rows_keep_the_source_columns_and_images_kwargs():
    """A row failing under on_error="skip" is written with the same columns (an empty source
    list, the encoder's images_kwargs), so datasets.map keeps one schema; the rest collate."""
    proc = _processor("gemma3")
    ds = datasets.Dataset.from_list([_raw([photo_paths()[1]], 0), _raw(["/nonexistent/photo.jpg"], 1), _raw([], 2)])
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source", "on_error": "skip",
                                           "images_kwargs": PAN}, remove_columns=ds.column_names)
    assert [len(s) for s in out["image_sources"]] == [1, 0, 0] and set(out["images_kwargs"]) == {
        '{"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 8}'}
    ok, _ = mmpipe.drop_failed(out)
    assert [MultiModalInputs.from_dict(r).images_kwargs for r in ok] == [PAN, PAN]
    want = mmpipe.collate([mmpipe.encode_row(_raw([photo_paths()[1]], 0), proc, images_kwargs=PAN)], processor=proc)
    assert np.array_equal(mmpipe.collate(ok.select([0]), processor=proc).pixel_values, want.pixel_values)


def test_source_rows_pack_as_the_uint8_rows():
    """InternVL / OneVision rows pack (mmpipe.pack, PackingCollator): source rows give the same pack."""
    for family in ("internvl", "llava_onevision"):
        proc = _processor(family)
        sets = [[photo_paths()[1]], [], odd_images()[2:4]]
        u8 = [mmpipe.encode_row(_raw(s, k), proc) for k, s in enumerate(sets)]
        src = [mmpipe.encode_row(_raw(s, k), proc, pixels="source") for k, s in enumerate(sets)]
        want = mmpipe.pack(u8, processor=proc)
        for got in (mmpipe.pack(src, processor=proc), mmpipe.PackingCollator(proc)([r.to_dict() for r in src])):
            assert np.array_equal(got.input_ids, want.input_ids)
            assert np.array_equal(got.model_inputs()["pixel_values"], want.model_inputs()["pixel_values"])
