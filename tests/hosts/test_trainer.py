"""transformers.Trainer and trl.SFTTrainer, the real ones, on encoded datasets: a few optimizer
steps on the tiny models, each step's loss equal to a manual forward on the same batch, the
batch's pixel rows reaching the vision tower, streaming, and the remove_unused_columns refusal."""

from __future__ import annotations

import pickle

import datasets
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import mmpipe
from mmpipe import testing
from mmpipe.hosts import TrainerCollator, sft_settings, trainer_settings
from mmpipe.testing.invariants import assert_roundtrip

from conftest import processor_for

STEPS = 3


def sft_rows(n: int = 8) -> list[dict]:
    """Chat rows with 0, 1 or 2 small images and an assistant answer each."""
    rows = []
    for i in range(n):
        k = i % 3
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"What is in picture {i}?"}]
        rows.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}: a gradient."}]}],
                     "images": [testing.tiny_image(36 + 8 * j, 44 + 4 * i, seed=7 * i + j) for j in range(k)]})
    return rows


def encoded(family: str, n: int = 8):
    enc, report = mmpipe.encode_dataset(datasets.Dataset.from_list(sft_rows(n)), processor_for(family))
    assert report.rows_out == n
    return enc


class Recorder(TrainerCallback):
    """Batches as the collator made them, the manual loss of each step's batch computed with the
    weights that step starts from, and the pixel rows the vision tower received in the steps."""

    def __init__(self, model, collator):
        self.batches, self.manual, self.seen = [], [], []
        self.collator, self.manual_forward = collator, False
        model.model.visual.register_forward_hook(self._saw)

    def collate(self, rows):
        self.batches.append(self.collator(rows))
        return self.batches[-1]

    def _saw(self, module, args, out):
        if not self.manual_forward:
            self.seen.append(args[0].detach().clone())

    def on_step_begin(self, args, state, control, model=None, **kw):
        self.manual_forward = True
        with torch.no_grad():
            self.manual.append(float(model(**self.batches[state.global_step]).loss))
        self.manual_forward = False


def check_run(trainer, rec, before):
    """STEPS steps ran; each logged loss equals the manual forward; weights moved; every image
    batch's pixel rows reached the vision tower in order."""
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == STEPS and len(logged) == STEPS
    assert max(abs(a - b) for a, b in zip(logged, rec.manual)) < 1e-5, (logged, rec.manual)
    after = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    assert not torch.equal(before, after)
    want = [b["pixel_values"] for b in rec.batches[:STEPS] if "pixel_values" in b]
    assert want and len(rec.seen) == len(want)
    for got, pv in zip(rec.seen, want):
        assert torch.equal(got, pv)
    return logged


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def make_trainer(family, tmp_path, enc, **settings):
    model = testing.build_model(family)  # fresh: training changes it
    rec = Recorder(model, TrainerCollator(processor_for(family)))
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=3, max_steps=STEPS, logging_steps=1,
                             learning_rate=1e-2, report_to=[], save_strategy="no", seed=0, use_cpu=True, **settings)
    trainer = Trainer(model=model, args=args, train_dataset=enc, data_collator=rec.collate, callbacks=[rec])
    return trainer, rec, params(model)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_trainer_steps_with_the_manual_forwards_loss(family, tmp_path):
    enc = encoded(family)
    trainer, rec, before = make_trainer(family, tmp_path, enc, **trainer_settings())
    check_run(trainer, rec, before)
    batch = rec.batches[0]
    assert set(batch) >= {"input_ids", "attention_mask", "labels", "position_ids", "pixel_values", "image_grid_thw"}
    assert batch["position_ids"].shape[0] == 3 and batch["labels"].shape == batch["input_ids"].shape


def test_trainer_default_remove_unused_columns_is_refused_by_name(tmp_path):
    trainer, _, _ = make_trainer("qwen2_vl", tmp_path, encoded("qwen2_vl", 4))
    with pytest.raises(mmpipe.errors.ArgumentError, match="remove_unused_columns=False") as e:
        trainer.train()
    assert "family" in str(e.value) and "no 'family' column" not in str(e.value)


def test_streaming_needs_dispatch_batches_off(tmp_path):
    """An IterableDataset: accelerate's default dispatch would slice pixel_values / position_ids on
    dim 0 (the forward failed with a size mismatch); the collator refuses it by name. With
    trainer_settings() each step trains on whole batches."""
    enc = encoded("qwen2_vl").to_iterable_dataset()
    trainer, rec, before = make_trainer("qwen2_vl", tmp_path / "a", enc, remove_unused_columns=False)
    with pytest.raises(mmpipe.errors.ArgumentError, match="dispatch_batches") as e:
        trainer.train()
    assert "image_grid_thw" in str(e.value) and "position_ids" in str(e.value)
    trainer, rec, before = make_trainer("qwen2_vl", tmp_path / "b", enc, **trainer_settings())
    check_run(trainer, rec, before)


def test_collator_output_is_the_batch_as_forward_kwargs():
    proc = processor_for("qwen2_5_vl")
    rows = list(encoded("qwen2_5_vl", 4))
    out = TrainerCollator(proc, positions="verl")(rows)
    batch = mmpipe.Collator(proc, padding_side="right")(rows)
    assert_roundtrip([mmpipe.MultiModalInputs.from_dict(r) for r in rows], batch=batch)
    want = batch.model_inputs(positions="verl", labels=False)
    assert set(out) == set(want) | {"labels"} and out["position_ids"].shape[0] == 4
    assert all(torch.equal(out[k], want[k]) for k in want) and torch.equal(out["labels"], batch.labels)
    again = pickle.loads(pickle.dumps(TrainerCollator(proc)))(rows)  # dataloader_num_workers > 0
    assert torch.equal(again["pixel_values"], out["pixel_values"])
    no_labels = [mmpipe.encode_row(r, proc, labels=False).to_dict() for r in sft_rows(2)]
    with pytest.raises(mmpipe.errors.ArgumentError, match="no labels"):
        TrainerCollator(proc)(no_labels)
    with pytest.raises(mmpipe.errors.ArgumentError, match="not encoded rows"):
        TrainerCollator(proc)([{"messages": [], "images": []}])


# ---- TRL ---------------------------------------------------------------------------------
def make_sft(family, tmp_path, enc, **settings):
    from trl import SFTConfig, SFTTrainer

    proc = processor_for(family)
    model = testing.build_model(family)
    rec = Recorder(model, TrainerCollator(proc))
    args = SFTConfig(str(tmp_path), per_device_train_batch_size=3, max_steps=STEPS, logging_steps=1, learning_rate=1e-2,
                     report_to=[], save_strategy="no", seed=0, use_cpu=True, bf16=False, **settings)
    trainer = SFTTrainer(model=model, args=args, train_dataset=enc, processing_class=proc, data_collator=rec.collate,
                         callbacks=[rec])
    return trainer, rec, params(model)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_sft_trainer_steps_with_the_manual_forwards_loss(family, tmp_path):
    trainer, rec, before = make_sft(family, tmp_path, encoded(family), **sft_settings())
    check_run(trainer, rec, before)


def test_sft_trainer_default_remove_unused_columns_is_refused_by_name(tmp_path):
    trainer, _, _ = make_sft("qwen2_vl", tmp_path, encoded("qwen2_vl", 4), dataset_kwargs={"skip_prepare_dataset": True})
    with pytest.raises(mmpipe.errors.ArgumentError, match="remove_unused_columns=False"):
        trainer.train()


def test_readme_block_runs_as_written(tmp_path, monkeypatch):
    """The README's Trainer + SFTTrainer block, as written, on the tiny Qwen2-VL."""
    from helpers import readme_block

    monkeypatch.chdir(tmp_path)
    # a processor of its own: the trainers save a checkpoint at the end, and ProcessorMixin.save_pretrained
    # sets tokenizer._processor_class, which would change the shared processor's datasets hash
    namespace = {"ds": datasets.Dataset.from_list(sft_rows(8)), "processor": testing.build_processor("qwen2_vl"),
                 "model": testing.build_model("qwen2_vl")}
    exec(compile(readme_block("## transformers Trainer and TRL"), "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert type(trainer).__name__ == "SFTTrainer" and trainer.state.global_step == 3
    assert 0 < trainer.state.log_history[-1]["train_loss"] < 20
