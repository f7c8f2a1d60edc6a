"""Gemma 3 as a native tiled family (issue 20.2), end to end with its real processor and a tiny
Gemma3ForConditionalGeneration built offline: mmpipe.encode == the processor (ids, token_type_ids,
pixel_values bit for bit) on real photos and odd sizes, with and without pan-and-scan; batched
logits == per-row logits (and == the processor's own inputs) with 0..3 images per row;
collate -> unbatch gives the rows back; layout-only == full; the bidirectional image attention survives
collate; packing refused with the reason; compact bytes vs float32."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
import PIL.ImageFile
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError, PlaceholderError, TruncationError
from mmpipe.families import GEMMA3, family_of, takes_generic_path, tiled_family_of
from mmpipe.images import gemma3
from mmpipe.offline.gemma3 import build_gemma3_model, build_gemma3_processor
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing import invariants

RNG = np.random.default_rng(3)
ODD = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8))
       for h, w in [(1, 1), (1, 300), (300, 1), (33, 97), (130, 33), (64, 64)]]
PHOTOS = [img.convert("RGB") for _, img in testing.sample_photos()]
PAS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}  # small crops: the tiny images pan and scan


@pytest.fixture(scope="module")
def proc():
    return build_gemma3_processor()


@pytest.fixture(scope="module")
def model():
    return build_gemma3_model()


def _raw(images: list, k: int = 0, *, answer: bool = True) -> dict:
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"what is in row {k}?" + " so" * k}]
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}" * (k + 1)}]})
    return {"messages": msgs, "images": images}


def _rows_with(counts) -> list[dict]:
    pool = ODD + PHOTOS
    out, j = [], 0
    for k, n in enumerate(counts):
        out.append(_raw(pool[j:j + n], k))
        j += n
    return out


def _processor_call(proc, raw, **kw):
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    return proc(text=[text], images=raw["images"] or None, return_tensors="np", **kw)


def test_family_comes_from_the_class(proc, model):
    assert family_of(proc) is GEMMA3 and tiled_family_of(proc) is GEMMA3 and not takes_generic_path(proc)
    assert family_of(model.config) is GEMMA3 and family_of("gemma3") is GEMMA3
    assert type(mmpipe.encoding.dataset.make_encoder(proc)).__name__ == "Encoder"


@pytest.mark.parametrize("images_kwargs", [{}, PAS], ids=["one_tile", "pan_and_scan"])
def test_encode_equals_the_processor(proc, images_kwargs):
    """ids, token_type_ids and pixel_values bit for bit, on photos and odd sizes, 0..3 images."""
    for i, raw in enumerate(_rows_with([3, 0, 2, 1, 3])):
        row = mmpipe.encode_row(raw, proc, idx=i, images_kwargs=images_kwargs)
        own = _processor_call(proc, raw, **images_kwargs)
        assert np.array_equal(row.input_ids, own["input_ids"][0]), i
        assert np.array_equal(row.mm_token_type_ids, own["token_type_ids"][0]), i
        batch = mmpipe.collate([row], processor=proc)
        if raw["images"]:
            assert batch.pixel_values.dtype == np.float32
            assert np.array_equal(batch.pixel_values, own["pixel_values"]), i
        assert row.tiles_per_image.sum() == (len(own["pixel_values"]) if raw["images"] else 0)


def test_real_size_processor_on_photos():
    """The real checkpoints' settings: one 896x896 tile and 256 soft tokens per image."""
    proc = build_gemma3_processor(real=True)
    raw = _raw(PHOTOS, 1)
    row = mmpipe.encode_row(raw, proc)
    own = _processor_call(proc, raw)
    assert np.array_equal(row.input_ids, own["input_ids"][0])
    assert row.pixel_values_u8.shape == (len(PHOTOS), 896, 896, 3) and int(row.mm_token_type_ids.sum()) == 256 * 3
    assert np.array_equal(mmpipe.collate([row], processor=proc).pixel_values, own["pixel_values"])
    # compact storage: 1 byte per pixel value where the processor holds 4
    assert row.pixel_values_u8.nbytes * 4 == own["pixel_values"].nbytes == len(PHOTOS) * 896 * 896 * 3 * 4


def test_placeholder_text_is_the_processors(proc):
    tok = proc.tokenizer
    seq = "\n\n<start_of_image>" + "<image_soft_token>" * proc.image_seq_length + "<end_of_image>\n\n"
    assert gemma3.expand_placeholder(40, 56, proc) == seq == proc.full_image_sequence
    assert tok.convert_tokens_to_ids(GEMMA3.image_token) == tok.boi_token_id
    ip = mmpipe.images.tiles.effective_image_processor(proc, **PAS)
    text = gemma3.expand_placeholder(33, 130, proc, ip)  # 4 crops along the long side
    assert text == "Here is the original image " + seq + " and here are some crops to help you see better " \
        + " ".join([seq] * 4)
    assert gemma3.tile_count(33, 130, ip) == 5 and gemma3.image_tokens(33, 130, ip, proc) == 20
    assert gemma3.tile_count(33, 130, mmpipe.images.tiles.effective_image_processor(proc)) == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_per_row_through_arrow(proc, model, side):
    """dataset.map -> Arrow rows -> Collator -> model: each row's logits equal the row alone and
    the processor's own inputs run alone; the rows come back from the batch (invariants.assert_roundtrip)."""
    raws = _rows_with([2, 0, 3, 1])
    ds = datasets.Dataset.from_list([{"messages": r["messages"], "images": r["images"]} for r in raws])
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    invariants.assert_rows_equal(list(enc), rows, what="dataset.map")
    batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert isinstance(batch, BatchedMultiModalInputs) and len(set(batch.lengths.tolist())) > 1
    refs = [{k: v for k, v in _processor_call(proc, r).items()} for r in raws]
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5, rtol=1e-5)
    invariants.assert_roundtrip(rows, batch)
    invariants.assert_roundtrip(list(enc), processor=proc, padding_side=side)


def test_layout_only_equals_full(proc, tmp_path, monkeypatch):
    """pixels="none" reads image headers only (files here; decoding is made to fail) and gives
    the same rows minus pixels; such rows collate without the processor's pixels."""
    paths = []
    for i, img in enumerate(ODD[:3] + PHOTOS[:1]):
        paths.append(str(tmp_path / f"{i}.png"))
        img.save(paths[-1])
    for kw in ({}, {"images_kwargs": PAS}):
        for i, raw in enumerate(_rows_with([1, 0, 3])):
            raw = dict(raw, images=paths[:len(raw["images"])])
            full = mmpipe.encode_row(raw, proc, idx=i, **kw)
            with monkeypatch.context() as m:  # no pixel is decoded on the layout-only path
                m.setattr(PIL.ImageFile.ImageFile, "load", lambda self: (_ for _ in ()).throw(AssertionError("decoded")))
                lay = mmpipe.encode_row(raw, proc, idx=i, pixels="none", **kw)
            assert lay.pixel_values_u8 is None and full.diff(lay) == ["pixel_values_u8"]
    rows = [mmpipe.encode_row(r, proc, pixels="none") for r in _rows_with([1, 2])]
    batch = mmpipe.collate(rows, allow_layout_only=True)
    assert batch.pixel_values is None and "pixel_values" not in batch.model_inputs()
    invariants.assert_roundtrip(rows, batch)


def _masks(model, kwargs):
    """Gemma 3's attention masks as handed to its language model: kind -> bool [B, L, L]."""
    seen = {}
    handle = model.model.language_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.update(kw["attention_mask"]), with_kwargs=True)
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        handle.remove()
    return {k: (m[:, 0] if m.dim() == 4 else m) if m.dtype == torch.bool else (m[:, 0] if m.dim() == 4 else m) == 0
            for k, m in seen.items()}


@pytest.mark.parametrize("side", ["left", "right"])
def test_bidirectional_image_attention_survives_collate(proc, model, side):
    rows = [mmpipe.encode_row(r, proc) for r in _rows_with([2, 0, 1])]
    batch = mmpipe.Collator(proc, padding_side=side)(rows)
    assert "token_type_ids" in batch.model_inputs()
    batched, L = _masks(model, batch.model_inputs()), batch.input_ids.shape[1]
    for b, row in enumerate(rows):
        alone = _masks(model, mmpipe.collate([row], processor=proc).model_inputs())
        cols = slice(L - len(row), L) if side == "left" else slice(0, len(row))
        for kind in ("full_attention", "sliding_attention"):
            assert torch.equal(batched[kind][b, cols, cols], alone[kind][0]), (b, kind)
        image = np.flatnonzero(row.mm_token_type_ids == 1)
        if len(image):  # the first soft token sees the last of its block; text stays causal
            assert bool(alone["full_attention"][0, image[0], image[3]]) and not bool(alone["full_attention"][0, 0, 1])


def test_packing_is_refused_with_the_reason(proc):
    rows = [mmpipe.encode_row(r, proc) for r in _rows_with([1, 1])]
    with pytest.raises(ArgumentError, match="gemma3.*both ways"):
        mmpipe.pack(rows, processor=proc)
    with pytest.raises(ArgumentError, match="packing is not available for gemma3"):
        mmpipe.PackingCollator(proc)


def test_labels_are_the_replies_and_never_image_text(proc):
    raw = {"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "first?"}]},
        {"role": "assistant", "content": "one dog"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image"}]},
        {"role": "assistant", "content": "two cats"}], "images": [ODD[3], PHOTOS[0]]}
    row = mmpipe.encode_row(raw, proc)
    labelled = row.labels != -100
    assert np.array_equal(row.labels[labelled], row.input_ids[labelled])
    assert proc.tokenizer.decode(row.input_ids[labelled]) == "one dog<|im_end|>two cats<|im_end|>"
    assert not (labelled & (row.mm_token_type_ids == 1)).any()
    assert mmpipe.encode_row(raw, proc, labels=False).labels is None
    generic = mmpipe.Encoder(proc, family="generic", log=lambda _: None).encode_row(raw)
    assert np.array_equal(generic.labels, row.labels)  # the generic path (processor calls) labels the same


def test_bad_rows_and_options_are_refused(proc):
    raw = _raw([ODD[0]], 0)
    literal = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a <start_of_image>"}]}],
               "images": [ODD[0]]}
    with pytest.raises(PlaceholderError, match="2 <start_of_image> placeholder.*1 image"):
        mmpipe.encode_row(literal, proc)
    with pytest.raises(TruncationError):
        mmpipe.encode_row(raw, proc, max_length=5)
    for bad in ({"pixels": "float32"}, {"truncation": "truncate_text"}, {"max_pixels": 1000}):
        with pytest.raises(ArgumentError):
            mmpipe.encode_row(raw, proc, **bad)
    ds = datasets.Dataset.from_list([{"messages": r["messages"], "images": r["images"]} for r in _rows_with([1, 0, 2])])
    enc, report = mmpipe.encode_dataset(ds, proc, max_length=60, truncation="drop")
    assert report.rows_in == 3 and report.rows_out + sum(report.dropped.values()) == 3 and len(enc) == report.rows_out
    assert all(isinstance(r, MultiModalInputs) for r in invariants.as_rows(list(enc)))


def test_readme_block_runs_as_written():
    from helpers import readme_block

    ds = datasets.Dataset.from_list([{"messages": r["messages"], "images": r["images"]} for r in _rows_with([1, 0, 2])])
    ns = {"ds": ds}
    exec(compile(readme_block("**Gemma 3 and the tiled families**"), "README.md", "exec"), ns)
    batch, out, rows = ns["batch"], ns["out"], ns["rows"]
    assert isinstance(batch, BatchedMultiModalInputs) and set(batch.model_inputs()) == {
        "input_ids", "attention_mask", "position_ids", "token_type_ids", "pixel_values", "labels"}
    assert out.logits.shape[:2] == tuple(batch.input_ids.shape)
    invariants.assert_rows_equal(rows, list(ns["enc"]))


def test_memory_bounds_and_the_explicit_generic_path(proc):
    """map_kwargs sizes the writer buffer from the tiles (pan-and-scan: the most crops); rows of
    the generic path taken explicitly (Encoder(family="generic")) still collate with Collator(processor)."""
    from mmpipe.encoding.encoder import Encoder

    assert Encoder(proc).image_bytes() == 32 * 32 * 3
    assert Encoder(proc, images_kwargs={"do_pan_and_scan": True}).image_bytes() == 5 * 32 * 32 * 3
    per_row = 2**20 + 2 * 32 * 32 * 3  # the 1 MiB token allowance + two images' tiles
    assert mmpipe.map_kwargs(proc, images_per_row=2)["writer_batch_size"] == 256 * 2**20 // per_row
    generic = mmpipe.Encoder(proc, family="generic", log=lambda _: None)
    rows = [generic.encode_row(r) for r in _rows_with([1, 0])]
    batch = mmpipe.Collator(proc)(rows)
    assert type(batch).__name__ == "BatchedMultiModalInputs" and batch.vision["pixel_values"].shape == (1, 3, 32, 32)


def test_a_corrupt_image_is_an_image_error_naming_row_and_image(proc):
    import io

    from mmpipe.errors import ImageError

    buf = io.BytesIO()
    ODD[3].save(buf, format="PNG")
    broken = {"bytes": buf.getvalue()[:60]}  # a valid header, truncated data
    raw = _raw([ODD[0], broken], 0)
    for threads in (1, 2):
        with pytest.raises(ImageError) as info:
            mmpipe.encode_row(raw, proc, idx=5, threads=threads)
        assert info.value.row == 5 and info.value.image == 1 and info.value.column == "images"
    good = _raw([{"bytes": buf.getvalue()}], 1)
    ds = datasets.Dataset.from_list([good, raw, good])
    enc, report = mmpipe.encode_dataset(ds, proc, on_error="skip")
    assert report.rows_out == len(enc) == 2 and [(e["row"], e["stage"]) for e in report.errors] == [(1, "image")]


def test_image_modes_equal_the_processor(proc):
    """RGBA (composited on white), L, LA and P images: the same pixels as the processor's own RGB conversion."""
    rng = np.random.default_rng(1)
    rgba = Image.fromarray(rng.integers(0, 256, (40, 60, 4), dtype=np.uint8), "RGBA")
    modes = [rgba, Image.fromarray(rng.integers(0, 256, (40, 60), dtype=np.uint8), "L"),
             Image.fromarray(rng.integers(0, 256, (40, 60, 2), dtype=np.uint8), "LA"),
             rgba.convert("RGB").convert("P", palette=Image.ADAPTIVE)]
    for im in modes:
        raw = _raw([im], 0)
        row = mmpipe.encode_row(raw, proc)
        assert np.array_equal(mmpipe.collate([row], processor=proc).pixel_values,
                              _processor_call(proc, raw)["pixel_values"]), im.mode


def test_pan_and_scan_rows_come_back_from_their_batch_with_their_images_kwargs(proc):
    """``unbatch(collate(rows)) == rows`` with the encoder's ``images_kwargs`` (a row's
    pan-and-scan settings; they used to be dropped), through the batch's Arrow row too."""
    from mmpipe.testing import invariants

    rows = [mmpipe.encode_row(raw, proc, idx=i, images_kwargs=PAS) for i, raw in enumerate(_rows_with([2, 0, 1]))]
    assert all(r.images_kwargs == PAS for r in rows)
    batch = mmpipe.collate(rows, processor=proc)
    assert batch.row_images_kwargs == [PAS] * 3
    invariants.assert_roundtrip(rows, processor=proc)
    assert batch.to_arrow().column("row_images_kwargs").to_pylist() == [[json.dumps(PAS, sort_keys=True)] * 3]
    plain = mmpipe.collate([mmpipe.encode_row(_rows_with([1])[0], proc)], processor=proc)
    assert plain.row_images_kwargs is None and plain.to_arrow().column("row_images_kwargs").to_pylist() == [None]
