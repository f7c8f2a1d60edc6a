"""Packing for the tiled families (mmpipe.batching.packing) on the tiny offline InternVL and
LLaVA-OneVision models: unpack(pack(rows)) == rows; packed logits == each row alone (and == the
processor's own inputs run alone) with 0..3 images per row; the packed loss == the padded batch's;
Arrow rows through a pickled PackingCollator; budgets, padded rows and foreign rows refused;
to_padded == collate. Gemma 3: its model's packed-rows mask is measured wrong in the
sliding-window layers, so pack and PackingCollator refuse with that reason."""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.batching.packing import to_padded
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.offline.gemma3 import build_gemma3_model, build_gemma3_processor
from mmpipe.offline.tile_builders import TILED2_FAMILIES, build_tiled2_model, build_tiled2_processor
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.packed import PackedMultiModalInputs
from mmpipe.testing import invariants

COUNTS = [0, 1, 2, 3, 1]  # images per row


def _raw(n_images: int, k: int = 0, *, answer: bool = True) -> dict:
    images = [testing.tiny_image(40 + 23 * i, 70 + 11 * k, seed=k + i) for i in range(n_images)]
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in row {k}?" + " so" * k}]
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"a picture, row {k}"}]})
    return {"messages": msgs, "images": images}


def _reference(proc, raw) -> dict:
    """The processor's own outputs for the row, its images as its chat path passes them (LLaVA-OneVision:
    one list per chat, its per-conversation mode and mmpipe's default, issue 28.4; with batch_num_images)."""
    text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=False)
    images = raw["images"] or None
    if images and type(proc).__name__.endswith("LlavaOnevisionProcessor"):
        images = [images]
    return dict(proc(text=[text], images=images, return_tensors="np"))


@pytest.fixture(params=TILED2_FAMILIES)
def name(request):
    return request.param


def test_pack_roundtrip_and_logits_equal_each_row(name):
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    raws = [_raw(n, k) for k, n in enumerate(COUNTS)]
    rows = [mmpipe.encode(r, processor=proc) for r in raws]
    packed = invariants.assert_pack_roundtrip(rows, processor=proc)
    assert isinstance(packed, PackedMultiModalInputs) and packed.num_rows == len(rows)
    lengths = [len(r["input_ids"]) for r in rows]
    assert packed.seq_lengths.tolist() == lengths and packed.cu_seqlens.tolist() == np.cumsum([0, *lengths]).tolist()
    # 1-D positions restarting per row; labels -100 at each row's first token, kept in first_labels
    assert packed.position_ids[0].tolist() == [p for n in lengths for p in range(n)]
    starts = packed.cu_seqlens[:-1]
    assert (packed.labels[0, starts] == IGNORE_INDEX).all()
    assert packed.first_labels.tolist() == [r["labels"][0] for r in rows]
    # the pixels are the padded batch's: every row's tiles in row order (+ image_sizes)
    batch = mmpipe.collate(rows, processor=proc)
    kw = packed.model_inputs()
    assert "attention_mask" not in kw and kw["use_cache"] is False and kw["position_ids"].shape == (1, sum(lengths))
    assert np.array_equal(kw["pixel_values"].numpy(), batch.pixel_values)
    assert set(kw) - {"input_ids", "position_ids", "labels", "use_cache", "pixel_values"} == set(batch.extras)
    out = invariants.assert_packed_logits_match(model, rows, proc, packed=packed)
    invariants.assert_packed_logits_match(model, rows, proc, packed=packed, references=[_reference(proc, r) for r in raws])
    with torch.no_grad():  # the token-mean loss over exactly the padded batch's targets
        padded = model(**mmpipe.collate(rows, processor=proc, padding_side="right").model_inputs()).loss
    torch.testing.assert_close(out.loss, padded, rtol=1e-5, atol=1e-6)


def test_packed_logits_with_sdpa_attention(name):
    """sdpa builds the block-diagonal mask from the position restarts too."""
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    model.set_attn_implementation("sdpa")
    rows = [mmpipe.encode(_raw(n, k), processor=proc) for k, n in enumerate([2, 0, 3])]
    invariants.assert_packed_logits_match(model, rows, proc)


@pytest.mark.parametrize("side", ["left", "right"])
def test_to_padded_is_collate(name, side):
    proc = build_tiled2_processor(name)
    rows = [mmpipe.encode(_raw(n, k), processor=proc) for k, n in enumerate([2, 0, 1])]
    got = to_padded(mmpipe.pack(rows, processor=proc), padding_side=side)
    want = mmpipe.collate(rows, processor=proc, padding_side=side, pad_token_id=0)
    assert isinstance(got, BatchedMultiModalInputs)
    for field in ("input_ids", "attention_mask", "position_ids", "mm_token_type_ids", "labels", "lengths", "image_hw",
                  "tiles_per_image", "images_per_row", "pixel_values_u8", "pixel_values"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert got.extras.keys() == want.extras.keys()
    assert all(np.array_equal(got.extras[k], want.extras[k]) for k in got.extras)


def test_arrow_rows_through_a_pickled_packing_collator(name):
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    raws = [_raw(n, k) for k, n in enumerate([3, 0, 1, 2])]
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    collator = pickle.loads(pickle.dumps(mmpipe.PackingCollator(proc, max_tokens=4096, max_images=8)))
    for source in (mmpipe.ArrowRows(enc).__getitems__(range(len(enc))), list(enc)):
        packed = collator(source)
        assert isinstance(packed, PackedMultiModalInputs)
        invariants.assert_pack_roundtrip(rows, packed)
    invariants.assert_packed_logits_match(model, rows, proc, packed=packed)


def test_rows_without_labels_and_layout_only_rows(name):
    proc = build_tiled2_processor(name)
    prompts = [mmpipe.encode(_raw(n, k, answer=False), processor=proc, labels=False) for k, n in enumerate([1, 2])]
    packed = invariants.assert_pack_roundtrip(prompts, processor=proc)
    assert packed.labels is None and packed.first_labels is None and "labels" not in packed.model_inputs()
    layout = [mmpipe.encode(_raw(n, k), processor=proc, pixels="none") for k, n in enumerate([1, 0, 3])]
    with pytest.raises(mmpipe.errors.PixelDataError, match="allow_layout_only=True"):
        mmpipe.pack(layout)  # image tokens without pixels: refused unless asked for
    packed = invariants.assert_pack_roundtrip(layout, allow_layout_only=True)  # no processor needed without pixels
    assert packed.pixel_values is None and "pixel_values" not in packed.model_inputs()
    assert packed.num_images == 4 and packed.sequence_ids[0].tolist() == np.repeat([0, 1, 2], packed.seq_lengths).tolist()


def test_budgets_and_bad_rows_are_refused(name):
    proc = build_tiled2_processor(name)
    rows = [MultiModalInputs.from_dict(mmpipe.encode(_raw(n, k), processor=proc)) for k, n in enumerate([1, 2])]
    total = sum(len(r) for r in rows)
    mmpipe.pack(rows, processor=proc, max_tokens=total, max_images=3)
    with pytest.raises(InputError, match=f"{total} tokens.*max_tokens={total - 1}"):
        mmpipe.pack(rows, processor=proc, max_tokens=total - 1)
    with pytest.raises(InputError, match="3 images.*max_images=2"):
        mmpipe.PackingCollator(proc, max_images=2)(rows)
    holes = MultiModalInputs(**{**rows[1].__dict__, "attention_mask": np.r_[rows[1].attention_mask[:-1], 0]})
    with pytest.raises(InputError, match="must be unpadded") as info:
        mmpipe.pack([rows[0], holes], processor=proc)
    assert info.value.row == 1
    other = build_tiled2_processor(next(n for n in TILED2_FAMILIES if n != name))
    with pytest.raises(FamilyMismatchError):
        mmpipe.pack(rows, processor=other)
    with pytest.raises(FamilyMismatchError):
        mmpipe.PackingCollator(other)(rows)
    with pytest.raises(ArgumentError, match="needs the processor"):
        mmpipe.PackingCollator(family=name)
    with pytest.raises(ArgumentError, match="needs the processor"):  # pixels need the processor's normalisation
        mmpipe.pack(rows)


# ---- Gemma 3: measured, refused ------------------------------------------------------------
def _gemma_masks(model, kwargs) -> dict:
    """kind -> bool [L, L]: the masks Gemma 3 hands its language model (True: attends)."""
    seen = {}
    handle = model.model.language_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.update(kw["attention_mask"]), with_kwargs=True)
    try:
        with torch.no_grad():
            logits = model(**kwargs).logits[0]
    finally:
        handle.remove()
    masks = {k: (m[0, 0] if m.dtype == torch.bool else m[0, 0] == 0) for k, m in seen.items()}
    return {**masks, "logits": logits}


def test_gemma3_packed_rows_get_a_wrong_sliding_mask_so_packing_is_refused():
    """Gemma 3's packed input (rows end to end, 1-D positions restarting per row, token_type_ids,
    no mask): transformers builds the global layers' mask right (block diagonal, each image's
    tokens both ways) but the sliding-window layers' mask wrong from the second row on, and the
    logits differ from each row alone; the right masks handed over as Gemma 3's mask mapping give
    each row's logits (the model's attention allows packing; the mask builder does not). pack /
    PackingCollator refuse with that reason."""
    proc, model = build_gemma3_processor(), build_gemma3_model()
    rows = [MultiModalInputs.from_dict(mmpipe.encode(_raw(n, k), processor=proc)) for k, n in enumerate([1, 0, 2])]
    T = sum(len(r) for r in rows)
    kw = {k: v for k, v in mmpipe.collate(rows, processor=proc).model_inputs().items() if k == "pixel_values"}
    kw.update(input_ids=torch.cat([torch.from_numpy(r.input_ids) for r in rows])[None], use_cache=False,
              token_type_ids=torch.cat([torch.from_numpy(r.mm_token_type_ids) for r in rows])[None],
              position_ids=torch.cat([torch.arange(len(r)) for r in rows])[None])
    packed = _gemma_masks(model, kw)
    want = {kind: torch.zeros(T, T, dtype=torch.bool) for kind in ("full_attention", "sliding_attention")}
    alone, start = [], 0
    for r in rows:
        own = _gemma_masks(model, mmpipe.collate([r], processor=proc).model_inputs(labels=False))
        for kind in want:
            want[kind][start:start + len(r), start:start + len(r)] = own[kind]
        alone.append(own["logits"])
        start += len(r)
    assert torch.equal(packed["full_attention"], want["full_attention"])
    wrong = packed["sliding_attention"] ^ want["sliding_attention"]
    future = wrong & packed["sliding_attention"] & torch.ones(T, T, dtype=torch.bool).triu(1)
    assert int(wrong[:len(rows[0])].sum()) == 0 and int(future.sum()) > 0  # row 0 right; later rows see ahead
    gap = float((packed["logits"] - torch.cat(alone)).abs().max())
    assert gap > 1e-2, gap  # measured 0.41
    # the model itself takes packed rows: the same input with the right masks handed over as
    # Gemma 3's mask mapping (the per-row masks, block diagonal) gives each row's logits
    mapping = {kind: torch.where(want[kind], 0.0, torch.finfo(torch.float32).min)[None, None] for kind in want}
    with torch.no_grad():
        fixed = model(**kw, attention_mask=mapping).logits[0]
    torch.testing.assert_close(fixed, torch.cat(alone), rtol=1e-5, atol=1e-5)  # measured 2.4e-7
    reason = "packing is not available for gemma3.*sliding-window layers"
    with pytest.raises(ArgumentError, match=reason):
        mmpipe.pack(rows, processor=proc)
    with pytest.raises(ArgumentError, match=reason):
        mmpipe.pack(rows, family="gemma3")
    with pytest.raises(ArgumentError, match=reason):
        mmpipe.PackingCollator(proc)


def test_readme_block_runs_as_written():
    from helpers import readme_block

    ds = datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate([1, 0, 2])])
    ns = {"ds": ds}
    exec(compile(readme_block("**Packing tiled rows**"), "README.md", "exec"), ns)
    packed, out = ns["packed"], ns["out"]
    assert isinstance(packed, PackedMultiModalInputs) and set(packed.model_inputs()) == {
        "input_ids", "position_ids", "pixel_values", "labels", "use_cache"}
    assert out.logits.shape[:2] == (1, packed.num_tokens)
    invariants.assert_rows_equal(ns["rows"], list(ns["enc"]))
    invariants.assert_packed_logits_match(ns["model"], ns["rows"], ns["processor"], packed=packed)


def test_token_budget_sampler_counts_tiled_images(name):
    """`TokenBudgetBatchSampler` reads a tiled row's image count from ``tiles_per_image`` (tiled rows
    have no ``image_grid_thw``): every batch it forms under ``max_images`` packs without refusal."""
    from mmpipe.batching.sampler import TokenBudgetBatchSampler, token_counts

    proc = build_tiled2_processor(name)
    counts = [3, 3, 3, 1]
    ds = datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate(counts)])
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    assert token_counts(enc)[1].tolist() == counts
    sampler = TokenBudgetBatchSampler.from_dataset(enc, max_tokens=100_000, max_images=4, seed=0)
    collator = mmpipe.PackingCollator(proc, max_tokens=100_000, max_images=4)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(counts)))
    for b in batches:
        assert sum(counts[i] for i in b) <= 4
        collator(mmpipe.ArrowRows(enc).__getitems__(b))
