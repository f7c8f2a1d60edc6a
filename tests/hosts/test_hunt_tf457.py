"""mmpipe's hosts on transformers 4.57 (scripts/envs/tf457.sh), what a 4.57 user meets after the
first steps:

- ``resume_from_checkpoint`` / ``load_best_model_at_end``: 4.57's ``save_pretrained`` also writes
  VLM checkpoints under their published names (it reverses ``_checkpoint_conversion_mapping``:
  Qwen2-VL ``model.visual.*`` -> ``visual.*``), and its Trainer loads them with a plain non-strict
  ``load_state_dict``: every key missed, a warning, and the run went on from the weights it had
  before the resume. `restore_checkpoint_weights` was a no-op on 4.x (and read no pytorch_model.bin).
- ``VisionGRPOTrainer``: TRL's ``unwrap_model_for_generation(generation_kwargs=...)`` swaps in a
  generation config copy without ``_original_object_hash`` on 4.x; 4.57's ``generate()`` then failed
  with an AttributeError for a model whose config came from its model config.

And on both lines (unmarked: the main suite runs it too): `mmpipe.compat.forward_accepts` read the
signature of a PEFT / ``torch.compile`` wrapper (``**kwargs``), so on 5.x the generate kwargs of a
LoRA model lost ``mm_token_type_ids`` and its rollouts ran with other positions (logits off by 2e-3).
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.hosts import TrainerCollator, trainer_settings
from mmpipe.hosts.resume import load_checkpoint_weights, restore_checkpoint_weights

from conftest import processor_for

TF457 = pytest.mark.needs_env("tf457")


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        k = i % 2
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"What is {i}?"}]
        out.append({"messages": [{"role": "user", "content": content},
                                 {"role": "assistant", "content": [{"type": "text", "text": f"It is {i}." + " y" * i}]}],
                    "images": [testing.tiny_image(36, 44 + 4 * i, seed=i)] * k})
    return out


def token_accuracy(pred):
    logits, labels = pred.predictions, pred.label_ids
    hit = (logits[:, :-1].argmax(-1) == labels[:, 1:]) & (labels[:, 1:] != -100)
    return {"token_accuracy": float(hit.sum() / (labels[:, 1:] != -100).sum())}


def train(enc, out_dir, steps, resume=None):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(str(out_dir), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                             max_steps=steps, save_strategy="steps", save_steps=2, learning_rate=1e-2,
                             logging_steps=1, report_to=[], seed=0, use_cpu=True, **trainer_settings())
    trainer = restore_checkpoint_weights(Trainer(
        model=testing.build_model("qwen2_vl"), args=args, train_dataset=enc, eval_dataset=enc,
        data_collator=TrainerCollator(processor_for("qwen2_vl")), compute_metrics=token_accuracy))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@TF457
def test_trainer_resume_continues_from_the_checkpoints_weights(tmp_path):
    import transformers

    assert transformers.__version__.startswith("4.57")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows(6)), processor_for("qwen2_vl"))
    full = train(enc, tmp_path, 4)
    resumed = train(enc, tmp_path, 4, resume=str(tmp_path / "checkpoint-2"))
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (full, resumed)]
    # the resumed history holds steps 1-2 from trainer_state.json, then its own steps 3-4
    assert len(losses[0]) == len(losses[1]) == 4
    assert losses[0][2:] == pytest.approx(losses[1][2:], abs=1e-4)  # 4.57 logs losses rounded to 4 places
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    metrics = [t.evaluate() for t in (full, resumed)]
    assert metrics[0]["eval_loss"] == pytest.approx(metrics[1]["eval_loss"], abs=1e-6)
    assert 0.0 <= metrics[0]["eval_token_accuracy"] == metrics[1]["eval_token_accuracy"] <= 1.0


@TF457
@pytest.mark.parametrize("name,safetensors", [("qwen2_vl", True), ("qwen2_5_vl", True), ("qwen3_vl", True),
                                              ("gemma3", True), ("qwen2_vl", False)])
def test_load_checkpoint_weights_reads_what_4_57_saves(name, safetensors, tmp_path):
    """Published names on save (Qwen3-VL: none to rename), in model.safetensors or, with
    ``save_safetensors=False``, pytorch_model.bin (the stock resume mis-keys both)."""
    from mmpipe.offline.gemma3 import build_gemma3_model

    build = build_gemma3_model if name == "gemma3" else (lambda: testing.build_model(name))
    saved = build()
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(0.5)
    saved.save_pretrained(tmp_path, safe_serialization=safetensors)
    assert (tmp_path / ("model.safetensors" if safetensors else "pytorch_model.bin")).is_file()
    model = build()
    load_checkpoint_weights(model, str(tmp_path))
    got, want = model.state_dict(), saved.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@TF457
def test_grpo_generates_on_4_57_with_a_model_config_generation_config(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    model = testing.build_model("qwen2_vl")
    assert model.generation_config._from_model_config  # built from its config, as without generation_config.json
    prompts = [{"prompt": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"Show {k}."}]}],
                "images": [testing.tiny_image(56, 56, seed=k)] * k} for k in range(2)]
    args = GRPOConfig(str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=3,
                      temperature=1.0, max_steps=1, report_to="none", save_strategy="no", seed=0,
                      gradient_checkpointing=False, **grpo_settings())
    trainer = VisionGRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                                args=args, train_dataset=datasets.Dataset.from_list(prompts),
                                processing_class=processor_for("qwen2_vl"))
    trainer.train()
    assert trainer.state.global_step == 1
    assert sorted(r.num_images for r in trainer.last_rollout) == [0, 0, 1, 1]
    assert all(np.asarray(r.input_ids).size > 0 for r in trainer.last_rollout)


class PeftLike(torch.nn.Module):
    """What PEFT's PeftModel is to the generate kwargs: forward(*args, **kwargs), get_base_model()."""

    def __init__(self, model):
        super().__init__()
        self.base_model = model

    def forward(self, *args, **kwargs):
        return self.base_model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    def get_base_model(self):
        return self.base_model


def test_generate_kwargs_of_a_wrapped_model_are_the_models():
    from mmpipe.compat import forward_accepts, unwrapped_model
    from mmpipe.rollout.inputs import to_generate_kwargs

    proc, model = processor_for("qwen2_vl"), testing.build_model("qwen2_vl")
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
           "images": [testing.tiny_image(56, 56, seed=1)]}
    batch = mmpipe.collate([mmpipe.encode_row(row, proc, labels=False)], processor=proc, padding_side="left")
    want = to_generate_kwargs(batch, model=model)
    for wrapped in (PeftLike(model), torch.compile(model), PeftLike(torch.compile(model))):
        assert unwrapped_model(wrapped) is model
        assert forward_accepts(wrapped, "mm_token_type_ids") == forward_accepts(model, "mm_token_type_ids")
        got = to_generate_kwargs(batch, model=wrapped)
        assert sorted(got) == sorted(want)
    kw = dict(max_new_tokens=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
    a = model.generate(**want, **kw)
    b = PeftLike(model).generate(**to_generate_kwargs(batch, model=PeftLike(model)), **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert all(torch.equal(x, y) for x, y in zip(a.scores, b.scores))
