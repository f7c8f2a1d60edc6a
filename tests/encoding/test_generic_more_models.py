"""The generic path on two more model classes (issue 20.1), tiny and offline
(`mmpipe.offline.other_vlms`), through encode -> dataset.map -> Arrow rows -> Collator -> model:
Mllama (cross-attention) and PaliGemma (prefix-LM attention from ``token_type_ids``).

PaliGemma: its processor marks trained tokens with token type 1 (the ``suffix`` argument;
causal) and the rest type 0 (the prefix, attended both ways), and returns ``labels`` of
type-1 tokens. Chat rows have no suffix, so mmpipe's labels (the replies) decide: the
suffix runs from a row's first labelled token to its end; a prompt-only row is all prefix,
as the processor gives it. PaliGemma's processor takes no row without an image.

Mllama's row keys: ``pixel_values`` [1, images, tiles, 3, H, W], ``aspect_ratio_ids``
[1, images], ``aspect_ratio_mask`` [1, images, tiles] and ``cross_attention_mask``
[1, L, images, tiles], whose axis 1 is the tokens: collate pads it on the padding side
(`mmpipe.batching.generic.token_aligned`), images and tiles at the end, as the processor does.

Batched logits == per-row logits hold for rows with the same number of images. With
different counts they do not, in the model itself (the processor's own batch gives the same
logits as mmpipe's): a token before a row's first image has an all-zero cross-attention row,
which `MllamaForConditionalGeneration` turns into uniform attention over every vision token of
the batch's padded image axis (gated, not masked), so the padding images change it. Checked
here: mmpipe's batch == the processor's own batch call (inputs and logits) with mixed counts.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.batching.collate import collate
from mmpipe.offline.other_vlms import MORE_MODELS, build_foreign_model, build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows as chat_rows


def collate_generic(rows, **kw):  # the one collate; the generic path's old default: right padding
    return collate(rows, **{"padding_side": "right", **kw})


SAME = [2, 2, 2]  # images per row: batched == per-row
MIXED = [1, 3, 2]  # Mllama's processor refuses a batch mixing rows with and without images
WITH_EMPTY = [2, 0, 3, 1]  # collate/unbatch only


@pytest.fixture(scope="module")
def mllama():
    assert "mllama" in MORE_MODELS
    proc = build_foreign_processor("mllama")
    assert mmpipe.families.takes_generic_path(proc)
    return proc, build_foreign_model("mllama")


def _encoded(proc, counts):
    ds = datasets.Dataset.from_list(chat_rows(counts))
    return ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)


@pytest.mark.parametrize("side", ["left", "right"])
def test_mllama_batched_logits_equal_per_row(mllama, side):
    proc, model = mllama
    enc = _encoded(proc, SAME)
    rows = list(enc)
    batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert len(set(batch.lengths.tolist())) > 1 and "cross_attention_mask" in batch.row_keys
    assert batch.vision["cross_attention_mask"].shape[:2] == batch.input_ids.shape
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    invariants.assert_roundtrip(rows, batch)


def test_mllama_per_row_equals_the_processors_own_call(mllama):
    proc, model = mllama
    enc = _encoded(proc, MIXED)
    raw = chat_rows(MIXED)[1]
    own = proc(text=[proc.apply_chat_template(raw["messages"], tokenize=False)], images=raw["images"],
               return_tensors="pt")
    got = mmpipe.collate([enc[1]], processor=proc).model_inputs()
    for k in ("input_ids", "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask"):
        torch.testing.assert_close(got[k], own[k], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(**got).logits, model(**own).logits, atol=1e-5, rtol=1e-5)


def test_mllama_collate_equals_the_processors_own_batch(mllama):
    """Mixed image counts, right padding: mmpipe's batch holds the processor's batch arrays
    and gives its logits at every real token (the per-row logits differ: module doc)."""
    import logging

    from mmpipe.media import processor_collate as generic_batching

    proc, model = mllama
    raws = chat_rows(MIXED)
    enc = _encoded(proc, MIXED)
    generic_batching.CROSS_ATTENTION_WARNED.clear()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("mmpipe").addHandler(handler)
    try:
        batch = mmpipe.collate(list(enc), processor=proc, padding_side="right")
        mmpipe.collate(list(enc), processor=proc, padding_side="right")
    finally:
        logging.getLogger("mmpipe").removeHandler(handler)
    warned = [r.getMessage() for r in records if "cross-attention" in r.getMessage()]
    assert len(warned) == 1 and "MllamaProcessor" in warned[0] and "equal image counts" in warned[0]  # once
    own = proc(text=[proc.apply_chat_template(r["messages"], tokenize=False) for r in raws],
               images=[r["images"] for r in raws], padding=True, return_tensors="pt")
    got = batch.model_inputs()
    for k in ("input_ids", "attention_mask", "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        assert got[k].shape == own[k].shape, k
        torch.testing.assert_close(got[k], own[k].to(got[k].dtype), rtol=0, atol=0)
    # the processor's mask of a row's last image runs on over its pad tokens; mmpipe's pads are 0
    assert got["cross_attention_mask"].shape == own["cross_attention_mask"].shape
    for i, n in enumerate(batch.lengths):
        torch.testing.assert_close(got["cross_attention_mask"][i, :n], own["cross_attention_mask"][i, :n], rtol=0, atol=0)
        assert not got["cross_attention_mask"][i, n:].any()
    with torch.no_grad():
        a, b = model(**got).logits, model(**own).logits
    for i, n in enumerate(batch.lengths):
        torch.testing.assert_close(a[i, :n], b[i, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_mllama_cross_attention_mask_padded_on_the_token_axis(mllama, side):
    """Each row's [L, images, tiles] mask sits at its tokens (left: at the end), zeros
    elsewhere; the batch cuts back to its rows (a row without images included)."""
    proc, _ = mllama
    enc = mmpipe.Encoder(proc, family="generic", log=lambda _: None)
    rows = [enc.encode_row(r) for r in chat_rows(WITH_EMPTY)]
    batch = collate_generic(rows, padding_side=side, pad_to_multiple_of=8)
    mask = batch.vision["cross_attention_mask"]
    L = batch.input_ids.shape[1]
    assert mask.shape[:2] == (len(rows), L) and L % 8 == 0
    for b, row in enumerate(rows):
        n = len(row)
        cols = slice(L - n, L) if side == "left" else slice(0, n)
        want = np.zeros(mask.shape[1:], mask.dtype)
        if "cross_attention_mask" in row.vision:
            own = row.vision["cross_attention_mask"][0]
            want[cols, :own.shape[1], :own.shape[2]] = own
            assert own[np.flatnonzero(row.input_ids == proc.image_token_id)[0]].any()
        np.testing.assert_array_equal(mask[b], want)
    invariants.assert_roundtrip(rows, batch)


def test_layout_pads_hold_the_processors_fill_of_missing_images(mllama):
    """Mllama pads a missing image's aspect_ratio_mask as [1, 0, 0, 0]; the layout found by
    the probe says so (and travels in the stored JSON); processors padding with 0 have none."""
    proc, _ = mllama
    layout = mmpipe.Encoder(proc, family="generic", log=lambda _: None).layout()
    assert dict(layout.pads) == {"aspect_ratio_mask": (1, 0, 0, 0)}
    assert type(layout).from_json(layout.to_json()) == layout
    other = mmpipe.Encoder(build_foreign_processor("idefics3"), family="generic", log=lambda _: None).layout()
    assert other.pads == () and "pads" not in other.to_json()


# ---- PaliGemma ------------------------------------------------------------------------------
PALI = [1, 3, 2, 1]


@pytest.fixture(scope="module")
def paligemma():
    proc = build_foreign_processor("paligemma")
    assert mmpipe.families.takes_generic_path(proc)
    return proc, build_foreign_model("paligemma")


@pytest.mark.parametrize("side", ["left", "right"])
def test_paligemma_batched_logits_equal_per_row(paligemma, side):
    proc, model = paligemma
    enc = _encoded(proc, PALI)
    rows = list(enc)
    batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert "token_type_ids" in batch.sequence and len(set(batch.lengths.tolist())) > 1
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    invariants.assert_roundtrip(rows, batch)


def test_paligemma_suffix_starts_at_the_first_reply_token(paligemma):
    proc, _ = paligemma
    for row in _encoded(proc, PALI):
        types, labels = np.asarray(row["token_type_ids"]), np.asarray(row["labels"])
        first = np.flatnonzero(labels != -100)[0]
        assert not types[:first].any() and types[first:].all()
        assert "labels" not in row["generic_layout"]  # the processor's own labels are not stored


def test_paligemma_prompt_does_not_see_the_reply(paligemma):
    """Prefix-LM attention: the prompt's logits do not change with the reply (they would if the
    reply were prefix, as with the processor's all-zero token types)."""
    proc, model = paligemma
    raws = chat_rows([2, 2])
    raws[1] = dict(raws[0], messages=[raws[0]["messages"][0], {"role": "assistant", "content": [
        {"type": "text", "text": "a dog 0"}]}])
    rows = [mmpipe.encode(r, processor=proc) for r in raws]
    first = int(np.flatnonzero(np.asarray(rows[0]["labels"]) != -100)[0])
    assert np.array_equal(rows[0]["input_ids"][:first], rows[1]["input_ids"][:first])
    assert not np.array_equal(rows[0]["input_ids"], rows[1]["input_ids"])
    with torch.no_grad():
        a, b = (model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0, :first] for r in rows)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        prefix_all = [mmpipe.collate([r], processor=proc).model_inputs() for r in rows]
        for inputs in prefix_all:
            inputs["token_type_ids"].zero_()
        a, b = (model(**inputs).logits[0, :first] for inputs in prefix_all)
    assert not torch.allclose(a, b, atol=1e-4)


def test_paligemma_prompt_row_equals_the_processors_own_call(paligemma):
    proc, model = paligemma
    raw = chat_rows([2])[0]
    raw["messages"] = raw["messages"][:1]
    row = mmpipe.encode(raw, processor=proc)
    own = proc(text=[proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=True)],
               images=raw["images"], return_tensors="pt")
    got = mmpipe.collate([row], processor=proc).model_inputs()
    for k in ("input_ids", "token_type_ids", "pixel_values"):
        torch.testing.assert_close(got[k], own[k], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(**got).logits, model(**{k: v for k, v in own.items() if k != "labels"}).logits,
                                   atol=1e-5, rtol=1e-5)


def test_paligemma_row_without_an_image_is_refused_naming_the_processor(paligemma):
    proc, _ = paligemma
    raw = chat_rows([0])[0]
    with pytest.raises(mmpipe.errors.InputError, match="PaliGemmaProcessor"):
        mmpipe.encode(raw, processor=proc)


@pytest.mark.parametrize("name", ["mllama", "paligemma"])
def test_saved_rows_validate_clean(name, tmp_path):
    """The stored layout (Mllama's with its pads) passes `mmpipe.validate_dataset`."""
    enc = _encoded(build_foreign_processor(name), SAME)
    enc.save_to_disk(str(tmp_path / name))
    report = mmpipe.validate_dataset(str(tmp_path / name))
    assert report.ok and not report.warnings and report.num_rows == len(SAME), str(report)
