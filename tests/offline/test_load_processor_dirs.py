"""``load_processor(dir)`` of what ``processor.save_pretrained(dir)`` writes, for every offline
processor (`mmpipe.offline.builders.PROCESSOR_NAMES`), in this environment without torchvision: the
loaded processor encodes a row with an image (and an audio clip for the Omni thinkers) exactly as the
original. LLaVA-OneVision-1.5 (EXAONE 4.5's processor class), Ovis2.5, MiniCPM-V 4.6 / 4.7 and the
two Omni thinkers failed ("AutoProcessor built only the tokenizer"; recording the stock class, as
their checkpoints do: "Can't load video processor"): their image-only / no-video classes are now
found by name, as GLM-4.1V's are."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.offline.builders import PROCESSOR_NAMES
from mmpipe.processors import load_processor

# stock processors that need torchvision (a video processor) and have no family-table row
NO_VIDEO = ("llava_onevision1_5", "ovis2_5", "minicpmv4_6", "minicpmv4_7", "qwen2_5_omni", "qwen3_omni_moe")
# InternVL / LLaVA-OneVision: their image-only subclasses took the stock settings behind ``**kwargs``,
# which transformers neither saves (ProcessorMixin saves what the signature names) nor loads
# (from_args_and_dict keeps ``__init__.__code__.co_varnames``): InternVL's image_seq_length 4 came
# back as 256, LLaVA-OneVision's num_image_tokens as None (a TypeError in encode)
CASES = [pytest.param(n, "saved") for n in PROCESSOR_NAMES]
CASES += [pytest.param(n, "stock") for n in NO_VIDEO if n in PROCESSOR_NAMES]


def _plain(x):
    """Tensors / arrays as (dtype, shape, values), records as their fields, recursively: comparable with ==."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return (str(x.dtype), tuple(x.shape), x.tolist())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if type(x).__module__.startswith("mmpipe.") and hasattr(x, "__dict__"):
        return _plain(vars(x))
    return x


def _row(name: str) -> dict:
    """One image (and for the Omni thinkers one 1 s tone at 16 kHz) in a user turn, and an answer."""
    omni = "omni" in name
    user = [{"type": "image"}] + [{"type": "audio"}] * omni + [{"type": "text", "text": "What is this?"}]
    row = {"messages": [{"role": "user", "content": user},
                        {"role": "assistant", "content": [{"type": "text", "text": "An answer."}]}],
           "images": [testing.tiny_image(40, 52, seed=1)]}
    if omni:
        tone = (0.2 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)).astype(np.float32)
        row["audios"] = [{"array": tone, "sampling_rate": 16000}]
    return row


@pytest.mark.parametrize("name, recorded", CASES)
def test_a_saved_offline_processor_loads_back_and_encodes_the_same(tmp_path, name, recorded):
    """``recorded``: "saved" keeps the class name save_pretrained writes (the image-only / no-video
    subclass); "stock" records the stock transformers class, as the family's checkpoints do."""
    proc = load_processor("testing:" + name)
    proc.save_pretrained(tmp_path)
    if recorded == "stock":
        stock = next(c for c in type(proc).__mro__ if c.__module__.startswith("transformers.models."))
        for f in ("processor_config.json", "tokenizer_config.json"):
            path = tmp_path / f
            path.write_text(json.dumps(dict(json.loads(path.read_text()), processor_class=stock.__name__)))
    loaded = load_processor(str(tmp_path), log=lambda message: None)
    row = _row(name)
    assert _plain(mmpipe.encode_row(row, loaded)) == _plain(mmpipe.encode_row(row, proc))
