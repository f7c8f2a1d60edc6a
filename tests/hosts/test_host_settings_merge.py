"""The host settings take the user's own keywords: ``TrainingArguments(bf16=True, **grpo_settings())``
is a duplicate-keyword TypeError (grpo_settings sets bf16; on transformers 4.x trainer_settings sets
gradient_checkpointing_kwargs), so each settings function merges what the user passes, dict
settings key by key, and refuses values that undo what the rows need."""

from __future__ import annotations

import pytest

from mmpipe.errors import ArgumentError
from mmpipe.hosts.trainer import sft_settings, trainer_settings


def test_trainer_settings_merge_the_users_keywords(tmp_path):
    from transformers import TrainingArguments

    kw = trainer_settings(bf16=False, gradient_checkpointing_kwargs={"preserve_rng_state": False},
                          accelerator_config={"split_batches": True}, ddp_find_unused_parameters=False)
    args = TrainingArguments(str(tmp_path), report_to="none", use_cpu=True, **kw)
    assert args.remove_unused_columns is False and args.ddp_find_unused_parameters is False
    assert args.accelerator_config.dispatch_batches is False and args.accelerator_config.split_batches is True
    # the user's checkpointing keyword joins the settings' own (use_reentrant where the settings set it)
    assert kw["gradient_checkpointing_kwargs"]["preserve_rng_state"] is False
    assert kw["gradient_checkpointing_kwargs"].get("use_reentrant", False) is False


def test_an_accelerator_config_object_is_merged_as_its_fields(tmp_path):
    from transformers.trainer_pt_utils import AcceleratorConfig

    kw = trainer_settings(accelerator_config=AcceleratorConfig(split_batches=True))
    assert kw["accelerator_config"]["split_batches"] is True and kw["accelerator_config"]["dispatch_batches"] is False


@pytest.mark.parametrize("yours, named", [
    ({"remove_unused_columns": True}, "remove_unused_columns"),
    ({"accelerator_config": {"dispatch_batches": True}}, "dispatch_batches"),
    ({"accelerator_config": {"dispatch_batches": None}}, "dispatch_batches"),
    ({"accelerator_config": "accelerate.json"}, "as a dict"),
])
def test_values_that_undo_a_needed_setting_are_refused(yours, named):
    with pytest.raises(ArgumentError, match=named):
        trainer_settings(**yours)
    with pytest.raises(ArgumentError, match="sft_settings"):
        sft_settings(**yours)


def test_sft_settings_keep_skip_prepare_dataset_under_the_users_dataset_kwargs(tmp_path):
    trl = pytest.importorskip("trl")

    kw = sft_settings(dataset_kwargs={"append_concat_token": False}, bf16=False)
    assert kw["dataset_kwargs"] == {"skip_prepare_dataset": True, "append_concat_token": False}
    cfg = trl.SFTConfig(str(tmp_path), report_to="none", use_cpu=True, **kw)
    assert cfg.dataset_kwargs["skip_prepare_dataset"] is True and cfg.remove_unused_columns is False


def test_grpo_settings_take_bf16_and_the_rest(tmp_path):
    trl = pytest.importorskip("trl")
    from mmpipe.hosts.trl_grpo import grpo_settings

    kw = grpo_settings(bf16=False, temperature=1.0, max_completion_length=64)
    cfg = trl.GRPOConfig(str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=2,
                         num_generations=2, **kw)
    assert cfg.bf16 is False and cfg.use_vllm is False and cfg.remove_unused_columns is False
    assert cfg.temperature == 1.0 and cfg.max_completion_length == 64
    with pytest.raises(ArgumentError, match="grpo_settings"):
        grpo_settings(remove_unused_columns=True)
