"""Quick checks of the offline fixtures in mmpipe.testing (real transformers classes, no download)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mmpipe.offline as T
from mmpipe.offline import tokenizer as offline_tokenizer
from mmpipe.compat import hf_get_rope_index, is_transformers_5, mm_token_type_ids_kwargs
from mmpipe.families import family_of, get_family

FAMILIES = T.FAMILY_NAMES
REAL_PROCESSOR = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}


def _chat(proc, content, **kw):
    msgs = [{"role": "user", "content": content}]
    return proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)


# ---------------------------------------------------------------------------- tokenizer


def test_tokenizer_basics():
    tok = T.build_tokenizer()
    # 5.x's Qwen2Tokenizer is the tokenizers-backed one; on 4.x that class is Qwen2TokenizerFast
    assert type(tok).__name__ == ("Qwen2Tokenizer" if is_transformers_5() else "Qwen2TokenizerFast") and tok.is_fast
    assert len(tok) < 1024
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    ids = T.special_token_ids()
    for t in T.SPECIAL_TOKENS + T.EXTRA_TOKENS:
        assert tok.encode(t) == [ids[t]]
    assert len(set(ids.values())) == len(ids)
    assert max(ids.values()) == len(tok) - 1
    assert T.special_token_ids("qwen3_vl") == ids  # same ids in every family
    text = "The picture shows a small red box on the table next to a window."
    enc = tok.encode(text)
    assert len(enc) < len(text) / 2  # real merges, not one token per character
    assert tok.decode(enc) == text


def test_tokenizer_offsets_mapping():
    tok = T.build_tokenizer("qwen2_5_vl")
    text = "Hello world! <|vision_start|><|image_pad|><|vision_end|>Describe it, 42 times. naïve café"
    enc = tok(text, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    assert len(offsets) == len(enc["input_ids"])
    # Offsets are contiguous and cover the whole string (the byte tokens of one non-ASCII
    # character share that character's span); each special token maps to itself.
    spans = [o for i, o in enumerate(offsets) if i == 0 or o != offsets[i - 1]]
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 == s1 and s0 < e0
    assert len(spans) < len(offsets)  # "ï" and "é" are two byte tokens each
    specials = {v: k for k, v in T.special_token_ids().items()}
    for tid, (s, e) in zip(enc["input_ids"], offsets):
        if tid in specials:
            assert text[s:e] == specials[tid]


def test_tokenizer_copies_are_independent():
    a = T.build_tokenizer()
    a.padding_side = "left"
    assert T.build_tokenizer().padding_side == "right"


def test_bpe_is_deterministic_across_processes():
    def digest():
        vocab, merges = offline_tokenizer._bpe_vocab_and_merges()
        return hashlib.sha256(json.dumps([sorted(vocab.items()), merges]).encode()).hexdigest()

    code = (
        "import hashlib, json; from mmpipe.offline import tokenizer as T; v, m = T._bpe_vocab_and_merges(); "
        "print(hashlib.sha256(json.dumps([sorted(v.items()), m]).encode()).hexdigest())"
    )
    root = Path(offline_tokenizer.__file__).resolve().parents[2]  # the directory holding the mmpipe package
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == digest()


def test_chat_templates():
    content = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    t2 = _chat(T.build_processor("qwen2_vl"), content)
    assert t2 == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    t3 = _chat(T.build_processor("qwen3_vl"), content)
    assert t3 == t2.split("<|im_end|>\n", 1)[1]  # no default system prompt
    tok = T.build_tokenizer()
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"image": "x.png"}, {"type": "video"}, {"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "ok"},
    ]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>hi<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )


# ---------------------------------------------------------------------------- processor


@pytest.mark.parametrize("family", FAMILIES)
def test_processor_family_and_outputs(family):
    proc = T.build_processor(family)
    fam = get_family(family)
    assert family_of(proc).name == family
    assert REAL_PROCESSOR[family] in [c.__name__ for c in type(proc).__mro__]
    assert proc.chat_template == proc.tokenizer.chat_template
    ip = proc.image_processor
    assert (ip.patch_size, ip.merge_size, ip.temporal_patch_size) == (fam.patch_size, fam.merge_size, 2)

    imgs = [T.tiny_image(300, 400), T.tiny_image(97, 211, seed=1), T.tiny_image(48, 64, seed=2)]
    texts = [
        _chat(proc, [{"type": "image"}, {"type": "text", "text": "Describe."}]),
        _chat(proc, [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]),
        _chat(proc, "No image here, only a question."),
    ]
    out = proc(text=texts, images=imgs, return_tensors="pt", padding=True, **mm_token_type_ids_kwargs())
    assert set(out) >= {"input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids"}
    grid = out["image_grid_thw"]
    assert grid.dtype == torch.int64 and grid.shape == (3, 3) and (grid[:, 0] == 1).all()
    pv = out["pixel_values"]
    assert pv.dtype == torch.float32 and pv.shape == (int(grid.prod(-1).sum()), fam.patch_dim)
    assert fam.patch_dim == (1176 if fam.patch_size == 14 else 1536)
    lo, hi = T.default_pixel_bounds(family)
    for h, w in grid[:, 1:].tolist():
        assert h % fam.merge_size == 0 and w % fam.merge_size == 0
        assert lo <= h * w * fam.patch_size**2 <= hi
    n_tok = (grid.prod(-1) // fam.merge_size**2).tolist()
    image_id = T.special_token_ids()["<|image_pad|>"]
    is_img = out["input_ids"] == image_id
    assert is_img.sum(1).tolist() == [n_tok[0], n_tok[1] + n_tok[2], 0]
    assert torch.equal(out["mm_token_type_ids"] == 1, is_img)
    assert (out["mm_token_type_ids"] != 2).all()


def test_processor_pixel_bounds_override():
    # The FACTS example with the real Qwen2-VL bounds: 300x400 -> 308x392, grid (1, 22, 28), 154 tokens.
    fam = get_family("qwen2_vl")
    proc = T.build_processor("qwen2_vl", min_pixels=fam.min_pixels, max_pixels=fam.max_pixels)
    prompt = "<|vision_start|><|image_pad|><|vision_end|>"
    out = proc(text=[prompt], images=[T.tiny_image(300, 400)], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 22, 28]]
    assert out["pixel_values"].shape == (616, 1176)
    assert int((out["input_ids"] == T.special_token_ids()["<|image_pad|>"]).sum()) == 154
    with pytest.raises(ValueError):
        T.build_processor("qwen2_vl", min_pixels=10_000, max_pixels=5_000)


# ---------------------------------------------------------------------------- model


@pytest.mark.parametrize("family", FAMILIES)
def test_model_forward_rope_generate(family):
    proc = T.build_processor(family)
    model = T.build_model(family)
    assert family_of(model).name == family
    assert not model.training and next(model.parameters()).dtype == torch.float32
    text = _chat(proc, [{"type": "image"}, {"type": "text", "text": "What is this?"}])
    inputs = proc(text=[text], images=[T.tiny_image(97, 211)], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(**inputs).logits
        assert logits.shape == (1, n, len(proc.tokenizer))
        assert torch.isfinite(logits).all()
        pos, delta = hf_get_rope_index(
            model,
            inputs["input_ids"],
            proc(text=[text], images=[T.tiny_image(97, 211)], return_tensors="pt", **mm_token_type_ids_kwargs())[
                "mm_token_type_ids"],
            image_grid_thw=inputs["image_grid_thw"],
            attention_mask=inputs["attention_mask"],
        )
        assert pos.shape == (3, 1, n) and delta.shape == (1, 1)
        assert int(pos.max()) + 1 - n == int(delta)
        gen = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert gen.shape[0] == 1 and n < gen.shape[1] <= n + 3
    assert torch.equal(gen[:, :n], inputs["input_ids"])


def test_model_batched_equals_per_row():
    proc = T.build_processor("qwen2_5_vl")
    proc.tokenizer.padding_side = "left"
    model = T.build_model("qwen2_5_vl")
    imgs = [[T.tiny_image(64, 96)], [T.tiny_image(97, 211, seed=1), T.tiny_image(48, 64, seed=2)], []]
    texts = [
        _chat(proc, [{"type": "image"}, {"type": "text", "text": "What?"}]),
        _chat(proc, [{"type": "image"}, {"type": "text", "text": "versus"}, {"type": "image"}]),
        _chat(proc, "A longer text only question about the weather in the city today."),
    ]
    batch = proc(text=texts, images=[i for row in imgs for i in row], return_tensors="pt", padding=True)
    with torch.no_grad():
        batched = model(**batch).logits
        for i, (t, im) in enumerate(zip(texts, imgs)):
            row = proc(text=[t], images=im or None, return_tensors="pt")
            single = model(**row).logits[0]
            # Not bit-equal: GEMM blocking depends on the batch shape and the CPU's SIMD path
            # (2.5e-7 on an AVX-512 EPYC); 1e-5 is far below what a lost image or a wrong
            # position changes (>= 1e-2).
            torch.testing.assert_close(single, batched[i][batch["attention_mask"][i].bool()], atol=1e-5, rtol=0)


def test_model_seeded_and_copies_independent():
    a, b, c = T.build_model("qwen3_vl"), T.build_model("qwen3_vl"), T.build_model("qwen3_vl", seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    with torch.no_grad():
        next(a.parameters()).add_(1.0)
    fresh = T.build_model("qwen3_vl")
    assert torch.equal(next(fresh.parameters()), next(b.parameters()))
    cfg = fresh.config
    ids = T.special_token_ids()
    assert (cfg.image_token_id, cfg.vision_start_token_id) == (ids["<|image_pad|>"], ids["<|vision_start|>"])
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size
    assert cfg.vision_config.patch_size == 16


# ---------------------------------------------------------------------------- images


def test_generated_images_deterministic():
    a, b = T.generated_images(), T.generated_images()
    assert [n for n, _ in a] == [n for n, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert x.mode == y.mode and x.size == y.size and np.array_equal(np.asarray(x), np.asarray(y))
    modes = {im.mode for _, im in a}
    assert {"RGB", "RGBA", "L"} <= modes
    assert T.tiny_image(5, 7).size == (7, 5)
    assert not np.array_equal(np.asarray(T.tiny_image(8, 8, seed=0)), np.asarray(T.tiny_image(8, 8, seed=1)))
    assert T.tiny_image(8, 8, mode="L").mode == "L"


def test_sample_photos():
    pytest.importorskip("matplotlib")
    photos = dict(T.sample_photos())
    assert "grace_hopper.jpg" in photos
    assert all(im.mode == "RGB" for im in photos.values())
    assert photos["grace_hopper.jpg"].size == (512, 600)
