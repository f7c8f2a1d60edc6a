"""VisionGRPOTrainer (mmpipe.hosts.trl_grpo) driven with the real TRL GRPOTrainer where
tests/hosts/test_trl_grpo.py does not go: TRL's string-content prompts with an image column, a
reward column named ``family``, reward functions that read the images from ``prompts`` (as stock
TRL hands them), and sampling at a temperature other than 1 (the rollout's logprobs must not reach
TRL's loss as if they were the training forward's)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

import mmpipe  # noqa: E402
from mmpipe import testing  # noqa: E402
from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings  # noqa: E402

from conftest import processor_for  # noqa: E402
from test_trl_grpo import Spy  # noqa: E402  (records the loss batches and logprobs)


def _image(k: int, j: int):
    return testing.tiny_image(56, 56, seed=10 * k + j)


def _rows(ks=(0, 1, 3)) -> list[dict]:
    """TRL's VLM rows (structured ``prompt`` + ``images``); row k holds k images."""
    return [{"prompt": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"Show {k}"}]}],
             "images": [_image(k, j) for j in range(k)]} for k in ks]


def _config(tmp_path, **over) -> GRPOConfig:
    kw = dict(per_device_train_batch_size=6, num_generations=2, max_completion_length=6, temperature=1.0,
              max_steps=1, learning_rate=1e-2, report_to="none", save_strategy="no", seed=0,
              gradient_checkpointing=False, dataloader_num_workers=0)
    kw.update(over)
    return GRPOConfig(str(tmp_path / "out"), **kw, **grpo_settings())


def _reward_len(completions, **kwargs) -> list[float]:
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def _trainer(tmp_path, rows, reward=_reward_len, cls=VisionGRPOTrainer, **over):
    return cls(model=testing.build_model("qwen2_vl"), reward_funcs=reward, args=_config(tmp_path, **over),
               train_dataset=datasets.Dataset.from_list(rows), processing_class=processor_for("qwen2_vl"))


def test_trl_string_content_prompts_and_a_family_column(tmp_path):
    """TRL's VLM format also allows string contents (``{"role": "user", "content": "What?"}``) with
    an ``image`` / ``images`` column: TRL puts the images before the first user turn's text
    (``prepare_multimodal_messages``). And a raw row's ``family`` column is the user's (a reward
    kwarg), not mmpipe's encoded-row marker."""
    proc = processor_for("qwen2_vl")
    trainer = _trainer(tmp_path, _rows())
    img = [_image(2, 0), _image(2, 1)]
    system = {"role": "system", "content": "Be brief."}
    structured = [system, {"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                       {"type": "text", "text": "What is shown?"}]}]
    want = mmpipe.encode_row({"prompt": structured, "images": img}, proc, labels=False).input_ids.tolist()
    plain = [system, {"role": "user", "content": "What is shown?"}]
    got = trainer._prompt_row({"prompt": plain, "images": img}, 0)
    assert got.num_images == 2 and got.input_ids.tolist() == want
    one = trainer._prompt_row({"prompt": [{"role": "user", "content": "What is shown?"}], "image": img[0]}, 0)
    assert one.num_images == 1
    # a column named "family" (e.g. the answer of a taxonomy task) on a raw row
    row = {"prompt": structured, "images": img, "family": "felidae"}
    assert trainer._prompt_row(row, 0).input_ids.tolist() == want


def test_reward_functions_get_the_prompts_with_their_images(tmp_path):
    """Stock TRL gives reward functions ``prompts`` whose image parts hold the row's images
    (``{"type": "image", "image": <PIL>}``); each completion's prompt holds its own row's images."""
    seen = []

    def reward_reads_images(completions, prompts, images, **kwargs):
        for prompt, imgs in zip(prompts, images):
            parts = [p for m in prompt for p in m["content"] if p["type"] == "image"]
            seen.append((int(prompt[-1]["content"][-1]["text"].split()[-1]), [p["image"] for p in parts], imgs))
        return [float(len(c[0]["content"])) for c in completions]

    _trainer(tmp_path, _rows(), reward=reward_reads_images).train()
    assert sorted(k for k, _, _ in seen) == [0, 0, 1, 1, 3, 3]
    for k, from_prompt, from_column in seen:
        assert len(from_prompt) == len(from_column) == k
        for j, im in enumerate(from_prompt):
            assert np.array_equal(np.asarray(im), np.asarray(_image(k, j)))


def test_temperature_sampling_logprobs_are_not_passed_as_the_policys(tmp_path):
    """At temperature T != 1 TRL's training logprobs are of logits / T, the engine's of the raw
    logits. TRL's off-policy sequence mask (``off_policy_mask_threshold``) compares
    ``sampling_per_token_logps`` with the loss's logprobs, so those must be the policy's (or absent,
    as with stock TRL's transformers generation): on the first step, before any update, they agree."""
    trainer = _trainer(tmp_path, _rows(), cls=Spy, temperature=0.5, off_policy_mask_threshold=0.05)
    trainer.loss_inputs, trainer.loss_logps = [], []
    trainer.train()
    batch, mask = trainer.loss_inputs[0], trainer.loss_inputs[0]["completion_mask"].bool()
    assert mask.any()
    sampled = batch.get("sampling_per_token_logps")
    if sampled is not None:
        gap = float((trainer.loss_logps[0] - sampled).abs()[mask].max())
        assert gap < 1e-4, f"sampling logprobs differ from the policy's by {gap:.3e}"
