"""trl.GRPOTrainer, the real one, through mmpipe.hosts.trl_grpo: two optimizer steps on the tiny
Qwen2-VL with prompts holding 0..3 images in one batch. The images reach the model in
generation and in the loss, no completion holds a vision token, the loss positions are the
exact M-RoPE ones, the rollout/training logprob gap is measured, and the weights move."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

import mmpipe  # noqa: E402
from mmpipe import testing  # noqa: E402
from mmpipe.errors import ArgumentError  # noqa: E402
from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings  # noqa: E402
from mmpipe.rollout.transformers_engine import banned_tokens  # noqa: E402

from conftest import processor_for  # noqa: E402

GAP_LIMIT = 1e-4  # fp32 on CPU; measured ~1e-6


def trl_rows() -> list[dict]:
    """TRL's VLM format (``prompt`` messages + ``images``): row i holds i images, 0..3."""
    rows = []
    for i in range(4):
        content = [{"type": "image"}] * i + [{"type": "text", "text": f"Describe the {i} pictures."}]
        rows.append({"prompt": [{"role": "user", "content": content}],
                     "images": [testing.tiny_image(28 * (2 + j % 2), 28 * (2 + i % 2), seed=10 * i + j)
                                for j in range(i)],
                     "answer": f"answer {i}"})
    return rows


def reward_len(completions, answer, **kwargs) -> list[float]:
    """Any varied reward will do: the length of the completion's text."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(len(t)) / 10.0 for t in texts]


class Spy(VisionGRPOTrainer):
    """Records the loss inputs and logprobs TRL computes (shuffled batch rows, as TRL sees them)."""

    def _compute_loss(self, model, inputs):
        self.loss_inputs.append(inputs)
        return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            self.loss_logps.append(out[0].detach())
        return out


def _hooks(model, calls: list, generations: list, vision: list):
    """Spies: every forward's kwargs, every ``generate`` call's kwargs, and the pixel rows the
    vision tower received (with whether a ``generate`` call was running)."""
    def top(module, args, kwargs):
        calls.append({"loss": bool(kwargs.get("fused_lm_head")), "grad": torch.is_grad_enabled(),
                      **{k: kwargs.get(k) for k in ("input_ids", "attention_mask", "position_ids",
                                                     "pixel_values", "image_grid_thw", "mm_token_type_ids")}})

    generate, state = model.generate, {"generating": False}

    def spy_generate(*args, **kwargs):
        generations.append(kwargs)
        state["generating"] = True
        try:
            return generate(*args, **kwargs)
        finally:
            state["generating"] = False

    model.generate = spy_generate
    model.register_forward_pre_hook(top, with_kwargs=True)
    model.model.visual.register_forward_hook(lambda m, a, o: vision.append((a[0].shape[0], state["generating"])))


def _config(tmp_path, **over) -> GRPOConfig:
    kw = dict(per_device_train_batch_size=8, num_generations=2, max_completion_length=16, temperature=1.0,
              max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no",
              seed=0, gradient_checkpointing=False, dataloader_num_workers=0)
    kw.update(over)
    return GRPOConfig(str(tmp_path / "out"), **kw, **grpo_settings())


def test_grpo_two_steps_images_positions_and_logprob_gap(tmp_path):
    processor, model = processor_for("qwen2_vl"), testing.build_model("qwen2_vl")
    calls, generations, vision = [], [], []
    _hooks(model, calls, generations, vision)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Spy(model=model, reward_funcs=reward_len, args=_config(tmp_path),
                  train_dataset=datasets.Dataset.from_list(trl_rows()), processing_class=processor,
                  measure_logprob_gap=True)
    trainer.loss_inputs, trainer.loss_logps = [], []
    gaps = []
    real_log = trainer._log_logprob_gap
    trainer._log_logprob_gap = lambda out: (real_log(out), gaps.append(trainer.last_logprob_gap))
    trainer.train()

    assert trainer.state.global_step == 2 and len(trainer.loss_inputs) == 2
    # every batch mixes prompts with 0, 1, 2 and 3 images (4 prompts x 2 generations)
    for inputs in trainer.loss_inputs:
        assert sorted(inputs["num_images"]) == [0, 0, 1, 1, 2, 2, 3, 3]

    # generation: each generate call got every row's pixels, and the vision tower encoded them
    patches = [int(sum(np.prod(g) for g in mmpipe.encode_row(r, processor, labels=False).image_grid_thw))
               for r in trl_rows()]
    per_batch = 2 * sum(patches)
    assert len(generations) == 2
    for kw in generations:
        assert kw["pixel_values"].shape[0] == per_batch and kw["image_grid_thw"].shape[0] == 2 * (0 + 1 + 2 + 3)
        assert int((kw["mm_token_type_ids"] == 1).sum()) == per_batch // 4
    assert [n for n, generating in vision if generating] == [per_batch, per_batch]
    # the loss forwards (with grad) received the images of their rows, in the rows' order
    loss_calls = [c for c in calls if c["loss"] and c["grad"]]
    assert len(loss_calls) == 2
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for c, inputs in zip(loss_calls, trainer.loss_inputs):
        assert c["pixel_values"].shape[0] == per_batch
        grids = c["image_grid_thw"]
        assert int((c["input_ids"] == image_pad).sum()) == int(grids.prod(-1).sum()) // 4
        assert torch.equal(grids, inputs["image_grid_thw"])
    assert [n for n, generating in vision if not generating][-2:] == [per_batch, per_batch]

    # sampling banned the family's vision special tokens, and no completion holds one
    assert len(banned_tokens(processor)) == 4
    assert all(set(banned_tokens(processor)) <= set(kw["suppress_tokens"]) for kw in generations)
    banned = torch.tensor(banned_tokens(processor))
    for inputs in trainer.loss_inputs:
        done = inputs["completion_ids"][inputs["completion_mask"].bool()]
        assert not torch.isin(done, banned).any()

    # positions of every loss row = mmpipe.rope on that row's own prompt + completion, unpadded;
    # and = the rollout's training rows (positions continued over the completion)
    last_rows = {tuple(np.asarray(r.input_ids).tolist()): r for r in trainer.last_rollout}
    for c in loss_calls:
        for b in range(c["input_ids"].shape[0]):
            keep = c["attention_mask"][b].bool()
            ids, tt = c["input_ids"][b, keep], c["mm_token_type_ids"][b, keep]
            n_img = int((tt == 1).sum())
            grids, start = c["image_grid_thw"], 0
            before_b = int(sum(int((c["mm_token_type_ids"][k] == 1).sum()) for k in range(b)))
            cum = np.concatenate([[0], np.cumsum(grids.prod(-1).numpy() // 4)])
            start, stop = int(np.searchsorted(cum, before_b)), int(np.searchsorted(cum, before_b + n_img))
            want, _ = mmpipe.rope.get_rope_index(ids[None], tt[None], grids[start:stop], family="qwen2_vl")
            assert torch.equal(c["position_ids"][:, b, keep], want[:, 0])
    for c in loss_calls[-1:]:  # the last generation's rows are trainer.last_rollout
        for b in range(c["input_ids"].shape[0]):
            keep = c["attention_mask"][b].bool()
            row = last_rows.get(tuple(c["input_ids"][b, keep].tolist()))
            if row is not None:  # a completion masked as truncated differs from its row
                assert np.array_equal(c["position_ids"][:, b, keep].numpy(), np.asarray(row.position_ids))

    # rollout/training logprob gap at step 1, before the update: the engine's logprobs vs the
    # training forward (measured by the trainer) and vs the loss's own current logprobs
    assert gaps[0] is not None and gaps[0].numel() > 0
    first = trainer.loss_inputs[0]
    mask = first["completion_mask"].bool()
    loss_gap = (trainer.loss_logps[0] - first["sampling_per_token_logps"]).abs()[mask]
    print(f"\nrollout/training logprob gap, step 1: measured max {gaps[0].max():.2e} mean {gaps[0].mean():.2e}; "
          f"loss forward max {loss_gap.max():.2e} over {int(mask.sum())} tokens")
    assert gaps[0].max() < GAP_LIMIT and loss_gap.max() < GAP_LIMIT
    logged = [h for h in trainer.state.log_history if "rollout/logprob_gap/max" in h]
    assert logged and logged[0]["rollout/logprob_gap/max"] < GAP_LIMIT

    # the weights moved
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert any("visual" in n for n in moved) and any("lm_head" in n or "language_model" in n for n in moved)


def test_refuses_what_it_cannot_run(tmp_path):
    processor, model = processor_for("qwen2_vl"), testing.build_model("qwen2_vl")
    ds = datasets.Dataset.from_list(trl_rows())
    with pytest.raises(ArgumentError, match="tools"):
        VisionGRPOTrainer(model=model, reward_funcs=reward_len, args=_config(tmp_path), train_dataset=ds,
                          processing_class=processor, tools=[reward_len])
    with pytest.raises(ArgumentError, match="repetition_penalty"):
        VisionGRPOTrainer(model=model, reward_funcs=reward_len, args=_config(tmp_path, repetition_penalty=1.1),
                          train_dataset=ds, processing_class=processor)


def test_encoded_rows_train_as_the_raw_ones(tmp_path):
    """Rows from mmpipe.encode_dataset (labels=False, the reward's column kept) train too; the
    generation prompts are exactly the encoded ids and images. steps_per_generation=2: one
    generation of 8 rows, split by TRL into two optimizer steps of 4 rows (their pixel rows split
    per row), and TRL's own old-logprob forward (with mmpipe's images) gives the gap."""
    processor, model = processor_for("qwen2_vl"), testing.build_model("qwen2_vl")
    enc, report = mmpipe.encode_dataset(datasets.Dataset.from_list(trl_rows()), processor, labels=False,
                                        keep_columns=["answer"])
    assert report.rows_out == 4
    calls, generations, vision = [], [], []
    _hooks(model, calls, generations, vision)
    args = _config(tmp_path, per_device_train_batch_size=4, steps_per_generation=2)
    trainer = VisionGRPOTrainer(model=model, reward_funcs=reward_len, args=args, train_dataset=enc,
                                processing_class=processor)
    trainer.train()
    assert trainer.state.global_step == 2 and len(generations) == 1
    logged = [h["rollout/logprob_gap/max"] for h in trainer.state.log_history if "rollout/logprob_gap/max" in h]
    assert logged and max(logged) < GAP_LIMIT
    want = {tuple(mmpipe.encode_row(r, processor, labels=False).input_ids.tolist()) for r in trl_rows()}
    kw = generations[0]
    got = {tuple(ids[m.bool()].tolist()) for ids, m in zip(kw["input_ids"], kw["attention_mask"])}
    assert got == want and kw["pixel_values"].shape[0] == vision[0][0]
    # each optimizer step's loss forward holds 4 rows and exactly their pixel rows
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    loss_calls = [c for c in calls if c["loss"] and c["grad"]]
    assert [c["input_ids"].shape[0] for c in loss_calls] == [4, 4]
    for c in loss_calls:
        n_tokens = int((c["input_ids"] == image_pad).sum())  # 4 patches merge into one token
        if n_tokens:
            assert c["pixel_values"].shape[0] == 4 * n_tokens == int(c["image_grid_thw"].prod(-1).sum())
        else:
            assert c["pixel_values"] is None
    # TRL's one-image column ("image") reads as a one-image "images"
    one = trl_rows()[1]
    row = trainer._prompt_row({"prompt": one["prompt"], "image": one["images"][0]}, 0)
    assert row.input_ids.tolist() == mmpipe.encode_row(one, processor, labels=False).input_ids.tolist()
    # the rollout rows hold the prompt's images and a checked completion
    assert sorted(r.num_images for r in trainer.last_rollout) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_readme_block_runs(tmp_path, monkeypatch, capsys):
    """The docs' TRL GRPOTrainer block (docs/how-to/rl.md), verbatim."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "rl.md").read_text()
    blocks = [b for b in readme.split("```python\n")[1:] if "VisionGRPOTrainer(" in b.split("```")[0]]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[0].split("```")[0], "README.md", "exec"), scope)
    assert scope["trainer"].state.global_step == 2
    assert scope["trainer"].state.log_history[0]["rollout/logprob_gap/max"] < GAP_LIMIT
    assert "rollout/training logprob gap:" in capsys.readouterr().out
