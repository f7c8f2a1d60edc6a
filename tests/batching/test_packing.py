"""Padding-free packing: one [1, T] sequence per batch, the model's logits and loss equal
the rows run alone, and ``unpack(pack(rows)) == rows`` exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe import testing
from mmpipe.records.packed import PackedMultiModalInputs
from mmpipe.batching.packing import PackingCollator, pack, to_padded
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.testing.invariants import assert_pack_roundtrip, assert_packed_logits_match, assert_roundtrip

from conftest import FAMILIES, model_for, processor_for
from strategies import raw_rows


def _raws(photos, counts=(0, 2, 1, 0, 1)):
    """Rows with 0, 1 and 2 images; answered (labels) and one RL-style prompt row."""
    pool = photos + [im for _, im in testing.generated_images()][:3]
    raws, k = [], 0
    for i, n in enumerate(counts):
        content = [{"type": "text", "text": f"Row {i}: look."}]
        imgs = []
        for j in range(n):
            content += [{"type": "image"}, {"type": "text", "text": f" image {j}."}]
            imgs.append(pool[k % len(pool)])
            k += 1
        msgs = [{"role": "user", "content": content}]
        if i != 3:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "fine " * (i + 1)}]})
        raws.append({"messages": msgs, "images": imgs})
    return raws


@pytest.fixture(scope="module")
def encoded(photos):
    return {f: [mmpipe.encode_row(r, processor_for(f)) for r in _raws(photos)] for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_pack_layout(family, encoded):
    rows = encoded[family]
    p = pack(rows, processor=processor_for(family))
    lens = [r.num_tokens for r in rows]
    T = sum(lens)
    assert isinstance(p, PackedMultiModalInputs) and p.num_rows == len(rows) and p.num_tokens == T
    assert p.input_ids.shape == (1, T) and p.input_ids.dtype == torch.int64
    assert p.position_ids.shape == (4, 1, T) and p.position_ids.dtype == torch.int64
    assert p.cu_seqlens.dtype == torch.int32 and p.cu_seqlens.tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    cu = p.cu_seqlens.tolist()
    for k, r in enumerate(rows):
        sl = slice(cu[k], cu[k + 1])
        assert np.array_equal(p.input_ids[0, sl].numpy(), r.input_ids)
        assert p.position_ids[0, 0, sl].tolist() == list(range(r.num_tokens))  # text row restarts at 0
        assert np.array_equal(p.position_ids[1:, 0, sl].numpy(), r.position_ids)  # the row's own M-RoPE
        assert np.array_equal(p.mm_token_type_ids[0, sl].numpy(), r.mm_token_type_ids)
        assert int(p.labels[0, cu[k]]) == IGNORE_INDEX  # never predict a row's first token from the previous row
        want = r.labels if r.labels is not None else np.full(r.num_tokens, IGNORE_INDEX)
        assert np.array_equal(p.labels[0, cu[k] + 1:cu[k + 1]].numpy(), want[1:])
    # pixels: exactly the padded collate's (uint8 -> float32 rebuilt the same way), in row order
    b = mmpipe.collate(rows, processor=processor_for(family))
    assert torch.equal(p.pixel_values, b.pixel_values) and torch.equal(p.image_grid_thw, b.image_grid_thw)
    kw = p.model_inputs()
    assert "attention_mask" not in kw and kw["use_cache"] is False
    assert set(kw) == {"input_ids", "mm_token_type_ids", "position_ids", "pixel_values", "image_grid_thw",
                       "labels", "use_cache"}
    assert_pack_roundtrip(rows, packed=p)
    assert_roundtrip(rows, batch=to_padded(p, "left"))
    stored = pack([r.to_dict() for r in rows], processor=processor_for(family))  # rows as datasets stores them
    assert torch.equal(stored.input_ids, p.input_ids) and torch.equal(stored.position_ids, p.position_ids)
    assert torch.equal(stored.pixel_values, p.pixel_values)
    assert_pack_roundtrip(rows, packed=stored)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logits_equal_rows_alone(family, attn, encoded):
    """The tiny model's logits on a pack equal each row's logits alone (fp32); the packed
    loss equals the padded batch's loss (token mean over the same targets)."""
    proc, rows = processor_for(family), encoded[family]
    model = testing.build_model(family)
    model.set_attn_implementation(attn)
    p = PackingCollator(proc)(rows)
    out = assert_packed_logits_match(model, rows, proc, packed=p, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        per_row = p.split(out.logits)
        padded = mmpipe.collate(rows, processor=proc, padding_side="right")
        torch.testing.assert_close(out.loss, model(**padded.model_inputs()).loss, rtol=1e-5, atol=1e-5)
        # per-row losses from the packed logits equal the rows' own losses
        for k, r in enumerate(rows):
            if r.labels is None or not (r.labels != IGNORE_INDEX).any():
                continue
            alone = model(**mmpipe.collate([r], processor=proc).model_inputs()).loss
            lab = torch.from_numpy(r.labels)
            mine = torch.nn.functional.cross_entropy(per_row[k][:-1], lab[1:], ignore_index=IGNORE_INDEX)
            torch.testing.assert_close(mine, alone, rtol=1e-5, atol=1e-5)
        # pretraining-style labels (every text token a target, first tokens included): the
        # packed loss still never predicts a row's first token from the row before
        full = [mmpipe.MultiModalInputs(**{**r.__dict__, "labels": np.where(r.mm_token_type_ids == 0, r.input_ids,
                                                                              IGNORE_INDEX)}) for r in rows]
        p_full = pack(full, processor=proc)
        padded_full = mmpipe.collate(full, processor=proc, padding_side="right")
        torch.testing.assert_close(model(**p_full.model_inputs()).loss, model(**padded_full.model_inputs()).loss,
                                   rtol=1e-5, atol=1e-5)
        assert_pack_roundtrip(full, packed=p_full)


def test_mask_or_cache_would_leak_across_rows(encoded):
    """Why model_inputs() omits attention_mask and sets use_cache=False: with either, the
    model sees one long sequence and row 2 attends to rows 0-1."""
    proc, rows = processor_for("qwen2_vl"), encoded["qwen2_vl"]
    model = model_for("qwen2_vl")
    p = pack(rows, processor=proc)
    kw = p.model_inputs(labels=False)
    with torch.no_grad():
        good = model(**kw).logits
        with_mask = model(**{**kw, "attention_mask": torch.ones_like(p.input_ids)}).logits
        with_cache = model(**{**kw, "use_cache": True}).logits
    second = slice(int(p.cu_seqlens[1]), int(p.cu_seqlens[2]))
    assert (good[0, second] - with_mask[0, second]).abs().max() > 1e-3
    assert (good[0, second] - with_cache[0, second]).abs().max() > 1e-3


def test_text_family_pack_equals_rows_alone():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = testing.build_tokenizer("qwen2_vl")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg).eval()
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": "hello " * (i + 1)},
                                            {"role": "assistant", "content": "hi"}]}, tok) for i in range(3)]
    p = PackingCollator(tok)(rows)
    assert p.position_ids.shape == (1, p.num_tokens)
    assert_packed_logits_match(model, rows, tok, packed=p, rtol=1e-5, atol=1e-5,
                               references=[{"input_ids": torch.from_numpy(r.input_ids)[None]} for r in rows])
    assert_pack_roundtrip(rows, packed=p)


def test_budgets_and_unpadded_rows_are_enforced(encoded):
    proc, rows = processor_for("qwen2_vl"), encoded["qwen2_vl"]
    total = sum(r.num_tokens for r in rows)
    assert pack(rows, processor=proc, max_tokens=total).num_tokens == total
    with pytest.raises(ValueError, match=f"{total} tokens.*max_tokens={total - 1}"):
        PackingCollator(proc, max_tokens=total - 1)(rows)
    with pytest.raises(ValueError, match="4 images.*max_images=3"):
        PackingCollator(proc, max_images=3)(rows)
    holed = mmpipe.MultiModalInputs(**{**rows[1].__dict__, "attention_mask": rows[1].attention_mask.copy()})
    holed.attention_mask[2] = 0
    with pytest.raises(ValueError, match="row 1: attention_mask"):
        pack([rows[0], holed], processor=proc)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_unpack_inverts_pack(data):
    """For any rows (0..n images, labels or not, uint8 / float32 / layout-only pixels: a pack
    of ids without pixels, asked for with allow_layout_only=True), ``unpack(pack(rows)) == rows``
    and the pack's positions restart at every boundary."""
    family = data.draw(st.sampled_from(FAMILIES))
    pixels = data.draw(st.sampled_from(["uint8", "float32", "none"]))
    proc = processor_for(family)
    raws = data.draw(st.lists(raw_rows(max_turns=2, max_images=2), min_size=1, max_size=4))
    rows = [mmpipe.encode_row(r, proc, pixels=pixels, labels=data.draw(st.booleans())) for r in raws]
    p = assert_pack_roundtrip(rows, processor=proc, allow_layout_only=pixels == "none")
    starts = p.cu_seqlens[:-1].long()
    assert (p.position_ids[0, 0, starts] == 0).all()
    assert int((p.mm_token_type_ids == 1).sum()) * get_merge(family) == int(p.image_grid_thw.prod(-1).sum())


def get_merge(family: str) -> int:
    return mmpipe.family_of(family).merge_size ** 2


def test_dataloader_with_token_budget_sampler_packs_every_row_once(tmp_path):
    """Saved encoded dataset (as Arrow rows) -> TokenBudgetBatchSampler(cost="packed") ->
    PackingCollator in 2 workers:
    each pack is under both budgets and the packs unpack to every stored row exactly once."""
    import datasets
    from torch.utils.data import DataLoader

    from mmpipe.cli import demo
    from mmpipe.batching.sampler import TokenBudgetBatchSampler

    proc = processor_for("qwen2_5_vl")
    raw, _ = demo.build_rows(14, demo.image_pool())
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    enc.save_to_disk(str(tmp_path / "enc"))
    enc = datasets.load_from_disk(str(tmp_path / "enc"))
    budget, max_images = 600, 4
    sampler = TokenBudgetBatchSampler.from_dataset(enc, max_tokens=budget, max_images=max_images, cost="packed", seed=3)
    loader = DataLoader(mmpipe.ArrowRows(enc), batch_sampler=sampler, num_workers=2,
                        collate_fn=PackingCollator(proc, max_tokens=budget, max_images=max_images))
    seen = []
    for batch_idx, packed in zip(sampler.batches(), loader):
        assert packed.num_tokens <= budget and packed.num_images <= max_images
        assert_pack_roundtrip([enc[i] for i in batch_idx], packed=packed)
        seen += list(batch_idx)
    assert sorted(seen) == list(range(len(enc)))


@pytest.mark.parametrize("family", FAMILIES)
def test_pack_with_videos_images_and_text_rows(family):
    """Videos pack like images (grids, second_per_grid_ts and pixels in row order): logits
    equal each row alone, and the pack unpacks exactly (float32 and compact video rows)."""
    from helpers import video_row

    from mmpipe.images.spec import VisionSpec

    proc = processor_for(family)
    model = testing.build_model(family)
    vrows = [mmpipe.rows_from_processor_output(video_row(family, g, seed=s, sec=sec)[0], proc)[0]
             for g, s, sec in (((2, 4, 6), 1, 0.5), ((2, 6, 4), 2, 1.0))]
    text_row = mmpipe.encode_row({"messages": [{"role": "user", "content": "plain"}]}, proc, labels=False)
    img_row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                                 "images": [testing.tiny_image(60, 40)]}, proc, labels=False)
    compact = [mmpipe.compact(r, VisionSpec.from_processor(proc)) for r in vrows]
    for rows in (vrows + [text_row], [compact[0], img_row, text_row, compact[1]]):
        p = assert_pack_roundtrip(rows, processor=proc)
    kw = p.model_inputs()
    assert "pixel_values_videos" in kw and "pixel_values" in kw
    assert ("second_per_grid_ts" in kw) == (family == "qwen2_5_vl")
    assert_packed_logits_match(model, rows, proc, packed=p, rtol=1e-5, atol=1e-5)


def test_packed_gradients_equal_padded_gradients(encoded):
    """Training on a pack is training on the rows: the parameter gradients of the packed loss
    equal those of the padded batch's loss (Qwen3-VL, deepstack merger and vision tower included)."""
    proc, rows = processor_for("qwen3_vl"), encoded["qwen3_vl"]
    model = testing.build_model("qwen3_vl")

    def grads(kw):
        model.zero_grad()
        model(**kw).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    packed = grads(pack(rows, processor=proc).model_inputs())
    padded = grads(mmpipe.collate(rows, processor=proc, padding_side="right").model_inputs())
    assert packed.keys() == padded.keys() and any("visual" in n for n in packed)
    for n in packed:
        torch.testing.assert_close(packed[n], padded[n], rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("family", FAMILIES + ("glm4v", "internvl", "llava_onevision"))
def test_every_packing_family_checks_its_model_and_packs_exactly(family, photos):
    """``PackingCollator(processor, model=model)`` on every family that packs: the tiny model's
    layers are read (all full attention) and the checked pack's logits equal each row alone,
    rows with 0..3 images (tests/batching/test_packing_models.py: the models it refuses)."""
    proc, model = testing.build_processor(family), testing.build_model(family)
    rows = [mmpipe.encode_row(r, proc) for r in _raws(photos, counts=(0, 3, 1, 2))]
    collator = PackingCollator(proc, model=model)
    assert collator.layers.kinds == ("full_attention",) and collator.layers.attn_implementation == "eager"
    assert_packed_logits_match(model, rows, proc, packed=collator(rows), rtol=0, atol=1e-4)
