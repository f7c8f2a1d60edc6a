"""InternVL and LLaVA-OneVision as native tiled families (issue 20.2), end to end with their real
processors and tiny models built offline: mmpipe.encode == the processor (ids, pixel_values
bit for bit, image_sizes) on real photos and odd sizes; batched logits == per-row logits (and
== the processor's own outputs run alone) with 0..3 images per row; the collate/unbatch round
trip; layout-only == full; compact bytes vs float32; packing available (tests/batching/test_tiled_packing.py)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.families import family_of, tiled_family_of
from mmpipe.offline.tile_builders import TILED2_FAMILIES, build_tiled2_model, build_tiled2_processor
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing.invariants import assert_batched_logits_match, assert_roundtrip, assert_rows_equal

RNG = np.random.default_rng(7)
ODD = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8))
       for h, w in [(1, 1), (1, 500), (500, 1), (32, 64), (128, 128), (33, 97)]]
# other modes: converted as the processor converts them (transparency over white)
ODD += [testing.tiny_image(90, 70, seed=3, mode="RGBA"), testing.tiny_image(64, 130, seed=4, mode="L")]
PHOTOS = [img for _, img in testing.sample_photos()]


def _raw(n_images: int, k: int = 0, *, images=None, answer: bool = True) -> dict:
    images = images if images is not None else [testing.tiny_image(40 + 23 * i, 70 + 11 * k, seed=k + i)
                                                for i in range(n_images)]
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": f"what is in row {k}?"}]
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"a picture, row {k}"}]})
    return {"messages": msgs, "images": images}


def _reference(proc, raw, **images_kwargs):
    """The processor's own outputs for the row, its images as its chat path passes them: LLaVA-OneVision
    takes one image list per chat (its per-conversation mode, mmpipe's default: issue 28.4; the flat
    mode is tests/encoding/test_onevision_modes.py's), the others a flat list."""
    text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=False)
    images = raw["images"] or None
    if images and family_of(proc).name == "llava_onevision":
        images = [images]
    return proc(text=[text], images=images, return_tensors="np", **images_kwargs)


@pytest.fixture(params=TILED2_FAMILIES)
def name(request):
    return request.param


def test_the_family_comes_from_the_class(name):
    proc = build_tiled2_processor(name)
    fam = family_of(proc)
    assert fam is tiled_family_of(proc) and fam.name == name
    assert tiled_family_of(build_tiled2_model(name)) is fam  # from the config's model_type
    assert not mmpipe.families.takes_generic_path(proc)


@pytest.mark.parametrize("which", ["photos", "odd"])
def test_encode_matches_the_processor(name, which):
    proc = build_tiled2_processor(name)
    images = PHOTOS if which == "photos" else ODD
    fam = family_of(proc)
    feature = fam.token_ids(proc.tokenizer)["feature"]
    raws = [_raw(1, i, images=[img]) for i, img in enumerate(images)] + [_raw(3, 9, images=images[:3])]
    for raw in raws:
        row = MultiModalInputs.from_dict(mmpipe.encode(raw, processor=proc))
        ref = _reference(proc, raw)
        assert row.input_ids.tolist() == ref["input_ids"][0].tolist()
        assert np.array_equal(row.mm_token_type_ids, row.input_ids == feature)
        batch = mmpipe.collate([row], processor=proc)
        assert batch.pixel_values.dtype == np.float32
        assert np.array_equal(batch.pixel_values, ref["pixel_values"])  # bit for bit
        if "image_sizes" in ref:
            assert np.array_equal(batch.extras["image_sizes"], ref["image_sizes"])


def test_internvl_images_kwargs_match_the_processor_call():
    """Encoder(images_kwargs=...) == the processor called with the same image options."""
    proc = build_tiled2_processor("internvl")
    raw = _raw(2, images=[PHOTOS[1], ODD[2]])
    for kwargs in ({"crop_to_patches": False}, {"min_patches": 3, "max_patches": 8}):
        row = MultiModalInputs.from_dict(mmpipe.encode(raw, processor=proc, images_kwargs=kwargs))
        ref = _reference(proc, raw, **kwargs)
        assert row.input_ids.tolist() == ref["input_ids"][0].tolist()
        assert np.array_equal(mmpipe.collate([row], processor=proc).pixel_values, ref["pixel_values"])


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_match_each_row_alone(name, side):
    """Rows with 0, 1, 2, 3 images in one padded batch: logits at each row's tokens == the row
    run alone through mmpipe, and == the row's own processor outputs run alone."""
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    raws = [_raw(n, k) for k, n in enumerate([0, 1, 2, 3, 1])]
    rows = [mmpipe.encode(r, processor=proc) for r in raws]
    assert_roundtrip(rows, processor=proc, padding_side=side)
    assert_batched_logits_match(model, rows, proc, padding_side=side)
    refs = [dict(_reference(proc, r)) for r in raws]  # LLaVA-OneVision's batch_num_images included
    assert_batched_logits_match(model, rows, proc, padding_side=side, references=refs)


def test_layout_only_equals_full(name, tmp_path):
    """pixels="none" reads image headers only (files here) and gives the same rows but the
    pixels; such rows collate without pixels."""
    proc = build_tiled2_processor(name)
    paths = []
    for i, img in enumerate([PHOTOS[1], PHOTOS[2], *ODD[1:4], ODD[-2]]):
        paths.append(str(tmp_path / f"{i}.png"))
        img.save(paths[-1])
    raws = [_raw(n, k, images=paths[k:k + n]) for k, n in enumerate([0, 1, 3, 2, 1])]
    for i, raw in enumerate(raws):
        full = mmpipe.encode_row(raw, proc, idx=i)
        layout = mmpipe.encode_row(raw, proc, idx=i, pixels="none")
        assert layout.pixel_values_u8 is None and full.diff(layout) == ["pixel_values_u8"]
    rows = [mmpipe.encode(r, processor=proc, pixels="none") for r in raws]
    batch = assert_roundtrip(rows, processor=proc, allow_layout_only=True)
    assert batch.pixel_values is None and "pixel_values" not in batch.model_inputs()


@pytest.mark.parametrize("side", ["left", "right"])
def test_arrow_rows_through_the_collator(name, side):
    """dataset.map -> Arrow rows -> mmpipe.Collator -> model: the rows read back equal the
    encoded rows, and the batch's logits equal each row alone."""
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    raws = [_raw(n, k) for k, n in enumerate([2, 0, 3, 1])]
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    assert_rows_equal(list(enc), rows, what="dataset.map")
    batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert isinstance(batch, BatchedMultiModalInputs)
    assert_batched_logits_match(model, rows, proc, batch=batch)
    assert_roundtrip(rows, batch)


def test_compact_bytes_are_a_quarter_of_float32(name):
    """uint8 tiles [N, S, S, 3] vs the processor's float32 pixel_values, on the real photos."""
    proc = build_tiled2_processor(name)
    for img in PHOTOS:
        row = MultiModalInputs.from_dict(mmpipe.encode(_raw(1, images=[img]), processor=proc))
        ref = _reference(proc, _raw(1, images=[img]))
        assert row.pixel_values_u8.nbytes * 4 == ref["pixel_values"].nbytes


def test_packing_is_available(name):
    """Packing itself is tested in tests/batching/test_tiled_packing.py."""
    proc = build_tiled2_processor(name)
    rows = [mmpipe.encode(_raw(1, k), processor=proc) for k in range(2)]
    assert family_of(proc).no_packing is None
    assert mmpipe.pack(rows, processor=proc).num_rows == 2


def test_the_models_take_packed_rows(name):
    """Why the refusal says the model itself would take packed rows: the rows end to end, 1-D
    positions restarting at 0 per row, no attention mask -> each row's own logits."""
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    rows = [MultiModalInputs.from_dict(mmpipe.encode(_raw(n, k), processor=proc)) for k, n in enumerate([1, 0, 2])]
    batch = mmpipe.collate(rows, processor=proc)
    kw = batch.model_inputs()
    pixels = {k: v for k, v in kw.items() if k in ("pixel_values", "image_sizes", "batch_num_images")}
    if pixels["pixel_values"].dim() == 5:  # LLaVA-OneVision: the model also takes the tiles concatenated
        pixels["pixel_values"] = torch.cat([pv[:n] for pv, n in zip(pixels["pixel_values"], batch.tiles_per_image)])
    ids = torch.cat([torch.from_numpy(r.input_ids) for r in rows])[None]
    pos = torch.cat([torch.arange(len(r)) for r in rows])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False, **pixels).logits[0]
        alone = torch.cat([model(**mmpipe.collate([r], processor=proc).model_inputs(labels=False)).logits[0]
                           for r in rows])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
