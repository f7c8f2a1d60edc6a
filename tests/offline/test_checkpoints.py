"""Tiny vLLM-loadable checkpoints (mmpipe/offline/checkpoints.py): the config vLLM's CPU
attention accepts, and (in the vLLM environment, where torchvision's transforms exist) the
saved directory that AutoProcessor / from_pretrained load as the stock classes."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from mmpipe.errors import ArgumentError
from mmpipe.families import get_family
from mmpipe.offline.checkpoints import HEAD_DIM, build_checkpoint_processor, checkpoint_config, save_checkpoint
from mmpipe.offline.tokenizer import build_tokenizer

from conftest import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_config_has_head_dim_64(family):
    cfg = checkpoint_config(family)
    text, fam = cfg.text_config, get_family(family)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert head_dim == HEAD_DIM == 64
    assert sum(text.rope_parameters["mrope_section"]) == HEAD_DIM // 2
    assert text.vocab_size == len(build_tokenizer(family))
    assert (cfg.vision_config.patch_size, cfg.vision_config.spatial_merge_size) == (fam.patch_size, fam.merge_size)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is importable here")
def test_without_torchvision_the_processor_names_the_environment():
    with pytest.raises(ArgumentError, match="scripts/envs/vllm.sh"):
        build_checkpoint_processor("qwen2_vl")


@pytest.mark.needs_env("vllm")
@pytest.mark.parametrize("family", FAMILIES)
def test_saved_checkpoint_loads_as_the_stock_classes(family, tmp_path):
    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"no vLLM environment on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    import torch
    import transformers

    path = save_checkpoint(family, tmp_path / family)
    stamp = (path / "mmpipe_checkpoint.json").stat().st_mtime_ns
    assert save_checkpoint(family, path) == path and (path / "mmpipe_checkpoint.json").stat().st_mtime_ns == stamp
    proc = transformers.AutoProcessor.from_pretrained(path)
    fam = get_family(family)
    assert type(proc).__name__ == fam.processor_classes[0]
    assert proc.video_processor is not None and proc.image_processor.backend == "torchvision"
    assert json.loads((path / "processor_config.json").read_text())["processor_class"] == fam.processor_classes[0]
    model = getattr(transformers, fam.model_class).from_pretrained(path, dtype=torch.float32)
    assert model.dtype == torch.float32 and model.config.text_config.vocab_size == len(proc.tokenizer)
