"""transformers.Trainer / trl.SFTTrainer on encoded rows, the parts a user meets after the first
steps: resume_from_checkpoint restores the weights (transformers 5 saves Qwen2-VL / Gemma 3 /
InternVL / LLaVA-OneVision checkpoints under their published names and its own resume loads them
under the model's names: nothing matched and the run silently went on from the old weights)."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import Trainer, TrainingArguments

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError
from mmpipe.hosts import TrainerCollator, trainer_settings
from mmpipe.hosts.resume import load_checkpoint_weights, restore_checkpoint_weights

from conftest import processor_for


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        k = i % 2
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"What is {i}?"}]
        answer = [{"type": "text", "text": f"It is {i}." + " y" * i}]
        out.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}],
                    "images": [testing.tiny_image(36, 44 + 4 * i, seed=i)] * k})
    return out


def train(enc, out_dir, steps, resume=None, **extra):
    model = testing.build_model("qwen2_vl")
    args = TrainingArguments(str(out_dir), per_device_train_batch_size=2, max_steps=steps, save_strategy="steps",
                             save_steps=2, learning_rate=1e-2, logging_steps=1, report_to=[], seed=0, use_cpu=True,
                             **trainer_settings(), **extra)
    trainer = restore_checkpoint_weights(Trainer(model=model, args=args, train_dataset=enc, eval_dataset=enc,
                                                 data_collator=TrainerCollator(processor_for("qwen2_vl"))))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_resume_continues_from_the_checkpoints_weights(tmp_path):
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows(6)), processor_for("qwen2_vl"))
    full = train(enc, tmp_path, 4)
    resumed = train(enc, tmp_path, 4, resume=str(tmp_path / "checkpoint-2"))
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (full, resumed)]
    assert len(losses[0]) == 4 and losses[0] == pytest.approx(losses[1], abs=1e-5)  # steps 3-4 from step 2's weights
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_load_best_model_at_end_loads_the_best_checkpoint(tmp_path):
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows(4)), processor_for("qwen2_vl"))
    trainer = train(enc, tmp_path, 4, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                    metric_for_best_model="loss", greater_is_better=True)  # the worse (first) checkpoint: a real reload
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    want = testing.build_model("qwen2_vl")
    load_checkpoint_weights(want, trainer.state.best_model_checkpoint)
    got, ref = trainer.model.state_dict(), want.state_dict()
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    fresh = testing.build_model("qwen2_vl").state_dict()
    assert not all(torch.equal(got[k], fresh[k]) for k in ref)


@pytest.mark.parametrize("name", ["gemma3", "internvl", "llava_onevision", "qwen3_vl"])
def test_checkpoint_weights_round_trip_through_save_pretrained(name, tmp_path):
    from mmpipe.offline.gemma3 import build_gemma3_model
    from mmpipe.offline.tile_builders import build_tiled2_model

    tiled = {"gemma3": build_gemma3_model, "internvl": lambda: build_tiled2_model("internvl"),
             "llava_onevision": lambda: build_tiled2_model("llava_onevision")}
    build = tiled.get(name, lambda: testing.build_model(name))
    saved = build()
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(0.5)
    saved.save_pretrained(tmp_path)
    model = build()
    load_checkpoint_weights(model, str(tmp_path))
    want = saved.state_dict()
    assert all(torch.equal(t, want[k]) for k, t in model.state_dict().items())


def test_a_foreign_checkpoint_is_refused_by_name(tmp_path):
    testing.build_model("qwen3_vl").save_pretrained(tmp_path)
    with pytest.raises(ArgumentError, match="does not match Qwen2VLForConditionalGeneration"):
        load_checkpoint_weights(testing.build_model("qwen2_vl"), str(tmp_path))
    with pytest.raises(ArgumentError, match="no model.safetensors"):
        load_checkpoint_weights(testing.build_model("qwen2_vl"), str(tmp_path / "nowhere"))


def test_sft_trainer_resume_continues_from_the_checkpoints_weights(tmp_path):
    """trl.SFTTrainer inherits the loading: the same wrapper, Qwen2.5-VL."""
    from trl import SFTConfig, SFTTrainer

    from mmpipe.hosts import sft_settings

    proc = processor_for("qwen2_5_vl")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows(4)), proc)

    def run(resume=None):
        args = SFTConfig(str(tmp_path), per_device_train_batch_size=2, max_steps=4, save_strategy="steps", save_steps=2,
                         learning_rate=1e-2, logging_steps=1, report_to=[], seed=0, use_cpu=True, bf16=False,
                         **sft_settings())
        trainer = SFTTrainer(model=testing.build_model("qwen2_5_vl"), args=args, train_dataset=enc,
                             processing_class=proc, data_collator=TrainerCollator(proc))
        restore_checkpoint_weights(trainer).train(resume_from_checkpoint=resume)
        return trainer.model.state_dict()

    full, resumed = run(), run(resume=True)  # True: the last checkpoint in output_dir (step 4: nothing left to train)
    assert all(torch.equal(full[k], resumed[k]) for k in full)
