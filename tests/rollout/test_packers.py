"""cosmos-rl style data packers: one image-processor run per image, mixed image/no-image
batches, and policy batches whose teacher-forced logprobs equal the rollout's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
import importlib
from mmpipe import testing
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.packers import DecoderOnlyLLMDataPacker, QwenVLDataPacker
from mmpipe.testing.invariants import assert_logprobs_match

from conftest import model_for, processor_for

encode_module = importlib.import_module("mmpipe.encoding.encoder")
from helpers import tiny_text_model


def _vl_items():
    img = lambda s, h, w: testing.tiny_image(h, w, seed=s)  # noqa: E731
    return [
        [{"role": "user", "content": [{"type": "image", "image": img(1, 50, 70)}, {"type": "text", "text": "What is it?"}]}],
        "Plain text question without an image.",
        [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image", "image": img(2, 40, 40)},
                                      {"type": "text", "text": "and"}, {"type": "image", "image": img(3, 64, 30)}]}],
    ]


def _policy_logprobs(model, packer, policy):
    batch = packer.policy_collate_fn(policy, packer.policy_compute_max_len(policy))
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in packer.model_keys(batch)}).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return [lp[b][batch["logprob_masks"][b, 1:]].numpy() for b in range(len(policy))], batch


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vl_packer_round_trip_is_consistent(family, monkeypatch):
    proc, model = processor_for(family), model_for(family)
    calls = []
    real = encode_module.encode_image
    monkeypatch.setattr(encode_module, "encode_image", lambda *a, **k: calls.append(1) or real(*a, **k))
    packer = QwenVLDataPacker(proc)
    items = _vl_items()
    prompts = packer.rollout_collate_fn([packer.get_rollout_input(it) for it in items])
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=5, n=2, temperature=1.0, seed=0))
    # the policy side gets the dataset items again (as cosmos-rl passes them): no re-encoding
    policy, want = [], []
    for it, g in zip(items, gens):
        for c in g.completions:
            policy.append(packer.get_policy_input(it, c))
            want.append(np.asarray(c.logprobs, np.float32))
    assert len(calls) == 3, "the image processor must run once per image"
    got, batch = _policy_logprobs(model, packer, policy)
    assert_logprobs_match(got, want, atol=1e-4)
    assert batch["position_ids"].shape[0] == 3 and batch["image_grid_thw"].shape[0] == 2 * 3
    assert batch["input_ids"].shape[1] == packer.policy_compute_max_len(policy)


def test_text_packer_and_ignored_prefix_tokens():
    tok = testing.build_tokenizer("qwen2_vl")
    model = tiny_text_model(len(tok))
    packer = DecoderOnlyLLMDataPacker(tok)
    items = ["Tell me a story.", [{"role": "user", "content": "Short answer please."}]]
    prompts = [packer.get_rollout_input(it) for it in items]
    gens = TransformersEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=4))
    policy = [packer.get_policy_input(p, g.completions[0]) for p, g in zip(prompts, gens)]
    got, batch = _policy_logprobs(model, packer, policy)
    assert_logprobs_match(got, [np.asarray(g.completions[0].logprobs) for g in gens], atol=1e-4)
    # text rollout output and n_ignore_prefix_tokens
    text = tok.decode(gens[0].completions[0].token_ids)
    row = packer.get_policy_input(prompts[0], text, n_ignore_prefix_tokens=2)
    n_resp = len(tok(text, add_special_tokens=False)["input_ids"])
    assert (row.labels != -100).sum() == n_resp - 2
    with pytest.raises(ValueError, match="needs a Qwen-VL processor"):
        QwenVLDataPacker(tok)


def test_pad_to_length_is_exact_and_checked():
    proc = processor_for("qwen2_vl")
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc)]
    assert mmpipe.collate(rows, pad_to_length=50).input_ids.shape == (1, 50)
    with pytest.raises(ValueError, match="more than pad_to_length=5"):
        mmpipe.collate(rows, pad_to_length=5)
