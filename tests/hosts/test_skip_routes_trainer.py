"""transformers.Trainer + TrainerCollator on a dataset holding a row that failed to encode under
on_error="skip" (skip / bad-input hunt): refused at the first batch, before the first step, naming the
row in the dataset, not when that row's batch comes up (possibly hours in) by its place in the batch."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import Trainer, TrainingArguments

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.hosts import TrainerCollator, trainer_settings

from conftest import model_for, processor_for

FAILED = 7  # the last of 8 rows: with batches of 2 its batch comes up in step 0 to 3


def _mapped_with_a_failed_row(proc):
    """A plain ds.map(mmpipe.encode, on_error="skip") of SFT rows; row FAILED has two image
    placeholders for one image, so it is kept as an empty placeholder carrying its failure."""
    def raw(i, placeholders):
        return {"messages": [{"role": "user", "content": [{"type": "image"}] * placeholders
                              + [{"type": "text", "text": f"What is in picture {i}?"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}."}]}],
                "images": [testing.tiny_image(28, 28 + 4 * i, seed=i)]}

    ds = datasets.Dataset.from_list([raw(i, 2 if i == FAILED else 1) for i in range(8)])
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "on_error": "skip"}, with_indices=True,
                 remove_columns=ds.column_names)
    assert enc[FAILED]["mmpipe_error"] and not enc[0]["mmpipe_error"]
    return enc


def _trainer(tmp_path, enc, collator, **kw):
    torch.manual_seed(0)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, max_steps=4, report_to=[],
                             save_strategy="no", logging_steps=1, use_cpu=True, **trainer_settings(**kw))
    return Trainer(model=model_for("qwen2_vl"), args=args, train_dataset=enc, data_collator=collator)


def test_a_failed_row_is_refused_at_the_first_batch_by_its_dataset_row(tmp_path):
    """Old code: InputError 'row 1' (its place in its batch) when that batch was collated, here at the second
    collate call (the row's dataset index only inside the failure text)."""
    proc = processor_for("qwen2_vl")
    enc = _mapped_with_a_failed_row(proc)
    calls = []
    collator = TrainerCollator(proc)
    trainer = _trainer(tmp_path, enc, lambda rows: calls.append(len(rows)) or collator(rows))
    with pytest.raises(InputError) as e:
        trainer.train()
    assert (e.value.row, e.value.column, trainer.state.global_step, len(calls)) == (FAILED, "mmpipe_error", 0, 1)
    assert "failed to encode under on_error='skip'" in str(e.value) and "drop_failed" in str(e.value)


def test_the_filtered_dataset_trains(tmp_path):
    """Guard: the fix the error names (mmpipe.drop_failed) gives a dataset that trains."""
    proc = processor_for("qwen2_vl")
    enc, errors = mmpipe.drop_failed(_mapped_with_a_failed_row(proc))
    assert len(errors) == 1 and len(enc) == 7
    collator = TrainerCollator(proc)
    trainer = _trainer(tmp_path, enc, collator)
    trainer.train()
    assert trainer.state.global_step == 4
