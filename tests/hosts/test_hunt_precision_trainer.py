"""Precision hunt (guards): what bf16 / fp16 users run. A model cast to bfloat16 or float16 gets
from mmpipe's batch exactly the logits and loss it gets from the transformers processor's own
float32 batch (the model casts the pixels itself), for a patch-grid family, a tiled one and the
generic path; and a transformers Trainer with ``bf16=True`` on the CPU, fed by `TrainerCollator`,
logs as its first loss the one of the processor's own batch (mmpipe's labels) under the same
autocast. These pass on the code before the hunt: they hold what the hunt measured."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import mmpipe
from mmpipe import testing
from mmpipe.hosts import TrainerCollator, trainer_settings

from helpers import generic_chat_rows, processor_call

FAMILIES = ["qwen2_vl", "gemma3", "idefics3"]  # patches, tiles, the generic path


def _one_row(family):
    proc = testing.build_processor(family)
    raw = generic_chat_rows([2])[0]
    row = mmpipe.encode_row(raw, proc)
    own = dict(processor_call(proc, [raw], nested=family == "gemma3"))
    return proc, row, own


@pytest.mark.parametrize("family", FAMILIES)
def test_low_precision_model_gets_the_processors_logits_and_loss(family):
    proc, row, own = _one_row(family)
    ours = mmpipe.collate([row], processor=proc).model_inputs()
    assert ours["pixel_values"].dtype == own["pixel_values"].dtype == torch.float32
    own["labels"] = ours["labels"]
    model = testing.build_model(family).eval()
    for dtype in (torch.bfloat16, torch.float16):
        model.to(dtype)
        with torch.no_grad():
            a, b = model(**ours), model(**own)
        assert a.logits.dtype == dtype and torch.equal(a.logits, b.logits), (family, dtype)
        assert torch.isfinite(a.loss) and torch.equal(a.loss, b.loss), (family, dtype)


class _FirstLoss(TrainerCallback):
    """The processor's own batch's loss under the weights and autocast the first step starts from."""

    def __init__(self, own):
        self.own, self.manual = own, None

    def on_step_begin(self, args, state, control, model=None, **kw):
        if self.manual is None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                self.manual = float(model(**self.own).loss)


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_trainer_bf16_first_loss_is_the_processor_batchs(family, tmp_path):
    proc, row, own = _one_row(family)
    own["labels"] = torch.as_tensor(mmpipe.collate([row], processor=proc, padding_side="right").labels)
    model = testing.build_model(family).to(torch.bfloat16)
    rec = _FirstLoss(own)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=1, max_steps=1, logging_steps=1,
                             learning_rate=1e-3, report_to=[], save_strategy="no", seed=0, use_cpu=True, bf16=True,
                             **trainer_settings())
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list([row.to_dict()]),
                      data_collator=TrainerCollator(proc), callbacks=[rec])
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 1 and rec.manual is not None
    assert abs(logged[0] - rec.manual) < 1e-6, (logged, rec.manual)
