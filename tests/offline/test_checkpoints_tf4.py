"""`mmpipe.offline.checkpoints.save_checkpoint` under transformers 4.57 (the line cosmos-rl and
EasyR1 pin; scripts/envs/cosmos.sh, scripts/envs/tf457.sh): the text config carries
``rope_theta`` + ``rope_scaling`` (with the M-RoPE split) as 4.x reads them, where 5.x's
``rope_parameters`` alone made 4.57's Qwen2-VL / Qwen2.5-VL attention fail
(``self.rope_scaling["mrope_section"]`` on None); the saved model loads with 4.57's own
``from_pretrained`` and gives the logits of the model save_checkpoint built, on an image row.

The stock processor save_checkpoint writes needs torchvision's transforms, which 4.57 does not
see in these environments (no torchvision distribution metadata), so here it is replaced by the
offline image-only processor: the model files are what is under test."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.families import get_family
from mmpipe.offline import checkpoints
from mmpipe.offline.checkpoints import checkpoint_config, rope_fields, save_checkpoint

from conftest import processor_for

FAMILIES_4 = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}


def test_rope_fields_per_transformers_line():
    assert rope_fields(ROPE, "5.24.0") == {"rope_parameters": ROPE}
    four = rope_fields(ROPE, "4.57.6")
    assert four == {"rope_theta": 10000.0,
                    "rope_scaling": {"rope_type": "default", "type": "default", "mrope_section": [8, 12, 12]}}
    assert "rope_theta" in ROPE  # the input is not changed


@pytest.mark.needs_env("cosmos", "tf457")
@pytest.mark.parametrize("family", FAMILIES_4)
def test_saved_checkpoint_loads_on_transformers_4_57(family, tmp_path, monkeypatch):
    import transformers

    assert transformers.__version__.startswith("4.57")
    monkeypatch.setattr(checkpoints, "build_checkpoint_processor", lambda fam, **kw: processor_for(fam))
    path = save_checkpoint(family, tmp_path / family, seed=3)
    text = json.loads((path / "config.json").read_text())["text_config"]
    fam = get_family(family)
    section = [s * checkpoints.HEAD_DIM // 128 for s in fam.mrope_section]
    assert text["rope_scaling"]["mrope_section"] == section and text["rope_theta"] == 10000.0
    assert "rope_parameters" not in text

    cls = getattr(transformers, fam.model_class)
    loaded, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.random.fork_rng(devices=[]):  # what save_checkpoint built, in memory
        torch.manual_seed(3)
        built = cls._from_config(checkpoint_config(family), dtype=torch.float32)
    proc = processor_for(family)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                         "images": [image]}, proc)
    batch = mmpipe.collate([row], processor=proc)
    kw = batch.model_inputs(labels=False)
    assert kw["position_ids"].shape[0] == 3 and int(kw["image_grid_thw"].shape[0]) == 1
    with torch.no_grad():
        got, want = loaded(**kw).logits, built(**kw).logits
    assert torch.isfinite(got).all() and torch.equal(got, want)
