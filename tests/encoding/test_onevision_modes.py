"""LLaVA-OneVision's two multi-image modes (issue 28.4), with its real processor and a tiny model
built offline. ``"per_conversation"`` (the default): what ``processor.apply_chat_template(...,
tokenize=True)``, TRL's collator and the model's ``batch_num_images`` do - one base tile per image
of a row holding several; ``"flat"`` (``images_kwargs={"multi_image": "flat"}``): a flat image list,
every image tiled, as vLLM does. In each mode, rows of 0..3 images: ids, pixel_values, image_sizes
and batch_num_images == the processor's (chat path / flat call; TRL's collator for the default),
row by row and as a batch;
batched logits == each row alone == the model on the processor's own outputs; source and
layout-only rows, validate and vLLM prompts follow the mode each row was encoded in (vLLM prompts
of per-conversation rows of several images are refused, naming the mode and the fix)."""

from __future__ import annotations

import dataclasses

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.images import onevision
from mmpipe.offline.onevision import build_onevision_model, build_onevision_processor
from mmpipe.rollout import to_vllm_prompts
from mmpipe.testing.invariants import assert_batched_logits_match, assert_roundtrip

FLAT = {"multi_image": "flat"}
MODES = {"per_conversation": {}, "flat": FLAT}  # mode -> the encoder's images_kwargs (default: per-conversation)
COUNTS = [0, 1, 2, 3, 1]  # images per row


@pytest.fixture(scope="module")
def proc():
    return build_onevision_processor()


@pytest.fixture(scope="module")
def model():
    return build_onevision_model()


def _images(n: int, k: int) -> list:
    """Sizes that give different anyres grids (wide, tall, a 1-pixel strip, square)."""
    sizes = [(40 + 23 * i, 70 + 11 * k) for i in range(n)]
    if n == 3:
        sizes[1] = (1, 90)
    return [testing.tiny_image(h, w, seed=10 * k + i) for i, (h, w) in enumerate(sizes)]


def _raw(n: int, k: int, *, answer: bool = True) -> dict:
    """A chat row as mmpipe takes it (one {"type": "image"} per image, the images apart)."""
    content = [{"type": "image"}] * n + [{"type": "text", "text": f"what is in row {k}?"}]
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"pictures, row {k}"}]})
    return {"messages": msgs, "images": _images(n, k)}


def _inline(raw: dict) -> list:
    """The same chat as the processor's chat path takes it (each image inside its content part)."""
    images, out = iter(raw["images"]), []
    for m in raw["messages"]:
        parts = [dict(p, image=next(images)) if p["type"] == "image" else p for p in m["content"]]
        out.append(dict(m, content=parts))
    return out


def _agp(raw: dict) -> bool:
    return raw["messages"][-1]["role"] != "assistant"


def _reference(proc, raws: list, mode: str, **kw) -> dict:
    """The processor's own outputs for ``raws`` (numpy): the chat path for per-conversation, one
    call with the flat image list for flat."""
    if mode == "per_conversation":
        convs = [_inline(r) for r in raws]
        out = proc.apply_chat_template(convs if len(raws) > 1 else convs[0], tokenize=True, return_dict=True,
                                       add_generation_prompt=_agp(raws[0]), return_tensors="np", **kw)
    else:
        texts = [proc.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=_agp(r)) for r in raws]
        images = [im for r in raws for im in r["images"]]
        out = proc(text=texts, images=images or None, return_tensors="np", **kw)
    return {k: np.asarray(v) for k, v in out.items()}


def _rows(proc, mode: str, counts=COUNTS, **options) -> tuple[list, list]:
    raws = [_raw(n, k) for k, n in enumerate(counts)]
    return raws, [mmpipe.encode_row(r, proc, idx=k, images_kwargs=MODES[mode], **options) for k, r in enumerate(raws)]


@pytest.mark.parametrize("mode", list(MODES))
def test_each_row_equals_the_processor_in_its_mode(proc, mode):
    raws, rows = _rows(proc, mode, counts=[0, 1, 2, 3], threads=2)
    for k, (raw, row) in enumerate(zip(raws, rows)):
        ref = _reference(proc, [raw], mode)
        assert row.input_ids.tolist() == ref["input_ids"][0].tolist(), f"row {k}"
        assert np.array_equal(row.mm_token_type_ids, row.input_ids == proc.image_token_id)
        assert row.images_kwargs is None  # the mode is in the layout (onevision.stored_mode), not stored apart
        batch = mmpipe.collate([row], processor=proc)
        if not row.num_images:
            assert "pixel_values" not in ref and "pixel_values" not in batch.model_inputs() and not batch.extras
            continue
        assert np.array_equal(batch.pixel_values, ref["pixel_values"])  # bit for bit
        assert np.array_equal(batch.extras["image_sizes"], ref["image_sizes"])
        assert batch.extras["batch_num_images"].tolist() == ref["batch_num_images"].tolist()
        want = "per_conversation" if mode == "per_conversation" and row.num_images > 1 else \
            ("flat" if row.num_images > 1 else None)
        assert onevision.stored_mode(row.tiles_per_image) == want
    two = rows[2]  # the case: a 2-image row, one tile each vs tiled
    assert two.tiles_per_image.tolist() == ([1, 1] if mode == "per_conversation" else [7, 7])


def test_the_modes_differ_only_where_the_processor_does(proc):
    """0/1-image rows are the same in both modes; a row of several images is shorter in the
    per-conversation mode; the text (and its labels) is the same."""
    _, per = _rows(proc, "per_conversation")
    _, flat = _rows(proc, "flat")
    for a, b in zip(per, flat):
        if a.num_images <= 1:
            assert not a.diff(b)
            continue
        assert a.num_tokens < b.num_tokens and a.tiles_per_image.tolist() == [1] * a.num_images
        for r in (a, b):
            assert r.labels is not None and (r.labels[r.mm_token_type_ids == 1] == -100).all()
        assert a.input_ids[a.mm_token_type_ids == 0].tolist() == b.input_ids[b.mm_token_type_ids == 0].tolist()
        assert a.labels[a.mm_token_type_ids == 0].tolist() == b.labels[b.mm_token_type_ids == 0].tolist()


@pytest.mark.parametrize("mode", list(MODES))
def test_a_batch_equals_the_processors_batch(proc, mode):
    """Rows of 0..3 images collated == the processor on all the chats at once: ids and mask
    (its padding side), pixel_values [I, most tiles, 3, S, S] (zero-padded tile axis),
    image_sizes, batch_num_images (the empty row left out)."""
    raws, rows = _rows(proc, mode)
    side = proc.tokenizer.padding_side
    ref = _reference(proc, raws, mode, padding=True)
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    assert np.array_equal(batch.input_ids, ref["input_ids"])
    assert np.array_equal(batch.attention_mask, ref["attention_mask"])
    assert np.array_equal(batch.pixel_values, ref["pixel_values"])
    assert np.array_equal(batch.extras["image_sizes"], ref["image_sizes"])
    assert batch.extras["batch_num_images"].tolist() == ref["batch_num_images"].tolist()
    assert set(batch.model_inputs()) >= {"pixel_values", "image_sizes", "batch_num_images"}
    assert_roundtrip(rows, batch)
    assert_roundtrip([r.to_dict() for r in rows], processor=proc)  # the stored form


def test_trls_collator_gives_the_per_conversation_batch(proc):
    """TRL's DataCollatorForVisionLanguageModeling (conversational rows: the processor's chat path)
    == mmpipe's default rows collated: ids, pixel_values, image_sizes, batch_num_images."""
    pytest.importorskip("trl")
    import copy

    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    raws, rows = _rows(proc, "per_conversation")
    out = DataCollatorForVisionLanguageModeling(proc)(copy.deepcopy(raws))
    batch = mmpipe.collate(rows, processor=proc, padding_side="right")
    mask = out["attention_mask"].numpy().astype(bool)
    assert np.array_equal(mask, batch.attention_mask.astype(bool))
    assert np.array_equal(out["input_ids"].numpy()[mask], batch.input_ids[mask])
    assert np.array_equal(out["pixel_values"].numpy(), batch.pixel_values)
    assert np.array_equal(out["image_sizes"].numpy(), batch.extras["image_sizes"])
    assert out["batch_num_images"].tolist() == batch.extras["batch_num_images"].tolist() == [1, 2, 3, 1]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_each_row_and_the_processor(proc, model, mode, side):
    raws, rows = _rows(proc, mode)
    assert_batched_logits_match(model, rows, proc, padding_side=side)
    refs = [{k: torch.from_numpy(v) for k, v in _reference(proc, [r], mode).items()} for r in raws]
    assert_batched_logits_match(model, rows, proc, padding_side=side, references=refs)


def test_rows_of_both_modes_share_a_batch(proc, model):
    """batch_num_images says per row which images were tiled: a per-conversation row of several
    images and flat rows in one batch give each row's own logits. Without it the model cannot
    place the one-tile images (the collate must hand it over)."""
    _, per = _rows(proc, "per_conversation", counts=[2, 3])
    _, flat = _rows(proc, "flat", counts=[2, 1])
    rows = [per[0], flat[0], per[1], flat[1]]
    batch = mmpipe.collate(rows, processor=proc)
    assert batch.extras["batch_num_images"].tolist() == [2, 1, 1, 3, 1]
    assert_batched_logits_match(model, rows, proc, batch=batch)
    kw = batch.model_inputs()
    kw.pop("batch_num_images")
    with torch.no_grad(), pytest.raises((ValueError, RuntimeError)):  # a feature-count or split-size error
        model(**kw)


@pytest.mark.parametrize("mode", list(MODES))
def test_source_and_layout_only_rows_keep_their_mode(proc, mode, tmp_path):
    """pixels="source" rows are tiled again at collate in the row's mode (== the uint8 rows);
    pixels="none" rows have the same layout; a source file that does not match its row is named
    by its row in the batch."""
    raws, rows = _rows(proc, mode)
    src = [mmpipe.encode_row(r, proc, idx=k, images_kwargs=MODES[mode], pixels="source") for k, r in enumerate(raws)]
    none = [mmpipe.encode_row(r, proc, idx=k, images_kwargs=MODES[mode], pixels="none") for k, r in enumerate(raws)]
    want = mmpipe.collate(rows, processor=proc)
    got = mmpipe.collate(src, processor=proc)
    assert np.array_equal(got.pixel_values, want.pixel_values)
    assert got.extras.keys() == want.extras.keys()
    assert all(np.array_equal(got.extras[k], want.extras[k]) for k in want.extras)
    for a, b in zip(rows, none):
        assert a.diff(b) == ["pixel_values_u8"] and b.pixel_values_u8 is None
    path = tmp_path / "other.png"
    testing.tiny_image(33, 44).save(path)
    bad = dataclasses.replace(src[3], image_sources=[path.read_bytes()] + list(src[3].image_sources[1:]))
    with pytest.raises(PixelDataError) as e:
        mmpipe.collate([src[0], src[1], src[2], bad], processor=proc)
    assert e.value.row == 3


def test_validate_checks_each_row_in_its_mode(proc, tmp_path):
    """Rows of either mode validate clean with the processor (each in the mode its layout
    shows); naming the other mode reports the multi-image rows, saying which mode."""
    for mode, other in (("per_conversation", FLAT), ("flat", {"multi_image": "per_conversation"})):
        raw = datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate(COUNTS)])
        num_proc = 2 if mode == "flat" else None  # the encoder's options pickled to the workers
        enc, _ = mmpipe.encode_dataset(raw, proc, images_kwargs=MODES[mode], num_proc=num_proc)
        path = tmp_path / mode
        enc.save_to_disk(str(path))
        for kw in ({}, {"images_kwargs": {"multi_image": mode}}):
            report = mmpipe.validate_dataset(str(path), processor=proc, **kw)
            assert report.ok and not report.warnings, str(report)
        report = mmpipe.validate_dataset(str(path), processor=proc, images_kwargs=other)
        errs = report.errors
        assert {e.column for e in errs} == {"tiles_per_image"}, str(report)
        assert sorted(i for e in errs for i in e.rows) == [2, 3], str(report)  # the rows of several images
        assert all(f"{other['multi_image']!r} multi-image mode" in str(e) for e in errs)


def test_vllm_prompts_follow_the_rows_mode(proc):
    """Flat rows: one <image> per image plus the original images; the processor run on that
    prompt (what vLLM does) gives back the row's ids and pixels. Per-conversation rows of 0 or 1
    image prompt the same way; of several images they are refused, naming the mode and the fix."""
    raws = [_raw(n, k, answer=False) for k, n in enumerate(COUNTS)]
    for mode in MODES:
        rows = [mmpipe.encode_row(r, proc, idx=k, images_kwargs=MODES[mode], pixels="source", labels=False)
                for k, r in enumerate(raws)]
        ok = rows if mode == "flat" else [r for r in rows if r.num_images <= 1]
        for r, p in zip(ok, to_vllm_prompts(ok, proc)):
            ids = np.asarray(p["prompt_token_ids"])
            assert int((ids == proc.image_token_id).sum()) == r.num_images and "mm_processor_kwargs" not in p
            if not r.num_images:
                assert np.array_equal(ids, r.input_ids)
                continue
            text = proc.tokenizer.decode(ids, skip_special_tokens=False)
            again = proc(text=[text], images=p["multi_modal_data"]["image"], return_tensors="np")
            assert np.array_equal(again["input_ids"][0], r.input_ids)
            assert np.array_equal(again["pixel_values"], mmpipe.collate([r], processor=proc).pixel_values)
        if mode == "per_conversation":
            for k in (2, 3):
                with pytest.raises(InputError, match="'per_conversation' multi-image mode") as e:
                    to_vllm_prompts([rows[k]], proc)
                assert e.value.column == "tiles_per_image" and e.value.stage == "rollout"
                assert "images_kwargs={'multi_image': 'flat'}" in e.value.fix


def test_the_mode_option(proc):
    with pytest.raises(ArgumentError, match="multi_image='tiled' is not a LLaVA-OneVision multi-image mode"):
        mmpipe.encode_row(_raw(2, 0), proc, images_kwargs={"multi_image": "tiled"})
    # the processor call's own image options are still applied and stored apart from the mode
    row = mmpipe.encode_row(_raw(2, 0), proc, images_kwargs={"multi_image": "flat", "resample": 3})
    assert row.images_kwargs == {"resample": 3} and row.tiles_per_image.tolist() == [7, 7]
