"""cosmos-rl data packers (standalone here; tests/rollout/test_packers_cosmos.py runs them
against the real cosmos-rl package): one image-processor run per image, mixed image/no-image
batches, logprob masks at logit positions whose teacher-forced logprobs equal the rollout's,
the rollout-input form, the SFT batch and construction with no arguments + setup(config)."""

from __future__ import annotations

import base64
import importlib
import io
import pickle
import types

import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.encoding.placeholders import expand_placeholders
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.images import row_images, vision_spec_for
from mmpipe.rollout.packers import DataPacker, DecoderOnlyLLMDataPacker, QwenVLDataPacker, shift_to_logit_positions
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.testing.invariants import assert_logprobs_match

from conftest import model_for, processor_for
from helpers import tiny_text_model

encode_module = importlib.import_module("mmpipe.media.patches_encode")  # where the patch grids decode images


def vl_items():
    img = lambda s, h, w: testing.tiny_image(h, w, seed=s)  # noqa: E731
    return [
        [{"role": "user", "content": [{"type": "image", "image": img(1, 50, 70)}, {"type": "text", "text": "What is it?"}]}],
        "Plain text question without an image.",
        [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image", "image": img(2, 40, 40)},
                                      {"type": "text", "text": "and"}, {"type": "image", "image": img(3, 64, 30)}]}],
    ]


def policy_logprobs(model, packer, policy):
    """Teacher-forced logprobs read the way cosmos-rl's compute_logprobs reads them: the logits
    at t where logprob_masks[t] is True, scored against input_ids[t + 1]."""
    batch = packer.policy_collate_fn(policy, packer.policy_compute_max_len(policy))
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in packer.model_keys(batch)}).logits.float()
    shifted = torch.zeros_like(batch["input_ids"])
    shifted[:, :-1] = batch["input_ids"][:, 1:]
    lp = torch.log_softmax(logits, -1).gather(-1, shifted[..., None])[..., 0]
    m = batch["logprob_masks"]
    return [lp[b][m[b]].numpy() for b in range(len(policy))], [shifted[b][m[b]] for b in range(len(policy))], batch


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vl_packer_round_trip_is_consistent(family, monkeypatch):
    proc, model = processor_for(family), model_for(family)
    calls = []
    real = encode_module.image_patches
    monkeypatch.setattr(encode_module, "image_patches", lambda *a, **k: calls.append(1) or real(*a, **k))
    packer = QwenVLDataPacker(proc)
    items = vl_items()
    prompts = [packer.encode_prompt(it) for it in items]
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=5, n=2, temperature=1.0, seed=0))
    # the policy side gets the dataset items again (as cosmos-rl passes them): no re-encoding
    policy, want, resp = [], [], []
    for it, g in zip(items, gens):
        for c in g.completions:
            policy.append(packer.get_policy_input(it, c.token_ids))
            want.append(np.asarray(c.logprobs, np.float32))
            resp.append(list(c.token_ids))
    assert len(calls) == 3, "the image processor must run once per image"
    got, scored, batch = policy_logprobs(model, packer, policy)
    assert_logprobs_match(got, want, atol=1e-4)
    assert [s.tolist() for s in scored] == resp  # exactly the response tokens, the first one included
    assert batch["position_ids"].shape[0] == 3 and batch["image_grid_thw"].shape[0] == 2 * 3
    assert batch["input_ids"].shape[1] == packer.policy_compute_max_len(policy)
    assert batch["logprob_masks"].dtype == torch.bool and "labels" not in batch


def test_logprob_masks_are_the_label_mask_shifted_to_logit_positions():
    proc = processor_for("qwen2_vl")
    packer = QwenVLDataPacker(proc)
    item = vl_items()[0]
    rows = [packer.get_policy_input(item, [5, 6, 7]), packer.get_policy_input("hi", [8, 9], n_ignore_prefix_tokens=1)]
    L = packer.policy_compute_max_len(rows) + 3
    batch = packer.policy_collate_fn(rows, L)
    m = batch["logprob_masks"]
    for b, (row, n_resp) in enumerate(zip(rows, (3, 1))):
        n = row.num_tokens
        # True at t = n - n_resp - 1 ... n - 2: the logits there predict the response tokens
        assert torch.nonzero(m[b]).reshape(-1).tolist() == list(range(n - n_resp - 1, n - 1))
    labels = torch.tensor(np.stack([np.pad(r.labels, (0, L - r.num_tokens), constant_values=-100) for r in rows]))
    assert torch.equal(m, shift_to_logit_positions(labels != -100))


def test_rollout_input_is_cosmos_vllm_form():
    proc = processor_for("qwen2_5_vl")
    packer = QwenVLDataPacker(proc)
    items = vl_items()
    inputs = packer.rollout_collate_fn([packer.get_rollout_input(it) for it in items])
    assert isinstance(inputs, list) and set(inputs[1]) == {"prompt_token_ids"}
    for it, p in zip(items, inputs):
        row = packer.encode_prompt(it)
        # one <|image_pad|> per image: vLLM re-expands to exactly the training ids
        assert np.array_equal(expand_placeholders(p["prompt_token_ids"], row.image_grid_thw, family=proc),
                              row.input_ids)
        if row.num_images:
            assert set(p) == {"prompt_token_ids", "multi_modal_data", "mm_processor_kwargs"}
            strs = p["multi_modal_data"]["image"]
            assert all(isinstance(s, str) for s in strs)  # base64, what decode_vision_info decodes
            decoded = [np.asarray(Image.open(io.BytesIO(base64.b64decode(s)))) for s in strs]
            for got, ref in zip(decoded, row_images(row, vision_spec_for(proc, row.fam))):
                assert np.array_equal(got, np.asarray(ref))  # lossless: the stored resized image


def test_text_packer_and_ignored_prefix_tokens():
    tok = testing.build_tokenizer("qwen2_vl")
    model = tiny_text_model(len(tok))
    packer = DecoderOnlyLLMDataPacker(tok)
    items = ["Tell me a story.", [{"role": "user", "content": "Short answer please."}]]
    prompts = [packer.encode_prompt(it) for it in items]
    gens = TransformersEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=4))
    policy = [packer.get_policy_input(p, g.completions[0]) for p, g in zip(prompts, gens)]
    got, _, batch = policy_logprobs(model, packer, policy)
    assert_logprobs_match(got, [np.asarray(g.completions[0].logprobs) for g in gens], atol=1e-4)
    assert packer.get_rollout_input(items[0]) == {"prompt_token_ids": prompts[0].input_ids.tolist()}
    # text rollout output and n_ignore_prefix_tokens
    text = tok.decode(gens[0].completions[0].token_ids)
    row = packer.get_policy_input(prompts[0], text, n_ignore_prefix_tokens=2)
    n_resp = len(tok(text, add_special_tokens=False)["input_ids"])
    assert (row.labels != -100).sum() == n_resp - 2
    with pytest.raises(ValueError, match="needs a Qwen-VL processor"):
        QwenVLDataPacker(tok)


def test_built_with_no_arguments_then_setup_config(tmp_path):
    """cosmos-rl builds packers with cls() and calls setup(config); the processor comes from
    config.policy.model_name_or_path (a directory or testing:FAMILY)."""
    packer = QwenVLDataPacker()
    with pytest.raises(ValueError, match="setup"):
        packer.get_rollout_input("hi")
    processor_for("qwen3_vl").save_pretrained(tmp_path)
    config = types.SimpleNamespace(policy=types.SimpleNamespace(model_name_or_path=str(tmp_path)),
                                   rollout=types.SimpleNamespace(multi_turn_config=types.SimpleNamespace(enable=False)))
    packer.tool_agent = object()
    packer.setup(config)
    assert packer.config is config and packer.tool_agent is None  # no multi-turn: no tool agent (as cosmos-rl)
    assert packer.encoder.family.name == "qwen3_vl" and packer.pad_token_id == packer.tokenizer.pad_token_id
    assert packer.get_rollout_input("hi")["prompt_token_ids"]
    assert packer.batch_size([1, 2, 3]) == 3 and packer.slice_batch([1, 2, 3], 1, 3) == [2, 3]
    conv = packer.extend_conversation([{"role": "user", "content": "q"}], ["a", "b"])
    last = conv[-1].model_dump() if hasattr(conv[-1], "model_dump") else conv[-1]  # cosmos-rl: a ChatMessage
    assert {k: last[k] for k in ("role", "content")} == {"role": "assistant", "content": "a"}
    assert packer.get_rollout_output(["c"], [None], [[-0.1]], [[5]], extra=1) == (["c"], [None], [[-0.1]], [[5]], {"extra": 1})
    packer.save_state(tmp_path / "saved")
    assert (tmp_path / "saved" / "tokenizer_config.json").is_file()
    assert isinstance(packer, DataPacker)
    assert type(pickle.loads(pickle.dumps(QwenVLDataPacker()))) is QwenVLDataPacker  # the class resolves by name


def test_sft_batch_labels_assistant_tokens_unshifted():
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    packer = QwenVLDataPacker(proc)
    convs = [vl_items()[0] + [{"role": "assistant", "content": "A small picture."}],
             [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]]
    rows = [packer.sft_process_sample(c) for c in convs]
    batch = packer.sft_collate_fn(rows, packer.sft_compute_max_len(rows), ignore_label_id=-7)
    lab = batch["label_ids"]
    for b, (row, conv) in enumerate(zip(rows, convs)):
        target = lab[b][lab[b] != -7]
        assert proc.tokenizer.decode(target).startswith(conv[-1]["content"])
        assert torch.equal(lab[b][: row.num_tokens][lab[b][: row.num_tokens] != -7],
                           batch["input_ids"][b][: row.num_tokens][lab[b][: row.num_tokens] != -7])  # unshifted
    with torch.no_grad():
        out = model(**{k: batch[k] for k in packer.model_keys(batch)}, labels=torch.where(lab == -7, -100, lab))
    assert torch.isfinite(out.loss)


def test_pad_to_length_is_exact_and_checked():
    proc = processor_for("qwen2_vl")
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc)]
    assert mmpipe.collate(rows, pad_to_length=50).input_ids.shape == (1, 50)
    with pytest.raises(ValueError, match="more than pad_to_length=5"):
        mmpipe.collate(rows, pad_to_length=5)
