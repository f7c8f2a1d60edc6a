"""``TrainerCollator(pixels_on_device=True)``: refused by name, with what to use instead.

Measured before the fix: it was accepted and its dict was the default one, key for key and value
for value (``pixel_values`` float32 [N, 1176], expanded from the uint8 rows on the CPU inside the
collator): the Trainer moves the dict to the device itself and never calls
``batch.model_inputs(device)``, so the option saved nothing and said otherwise.
"""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.hosts.trainer import TrainerCollator

from conftest import processor_for


def _rows(proc):
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "A."}]}],
           "images": [mmpipe.testing.tiny_image(56, 84, seed=0)]}
    return [mmpipe.encode_row(row, proc).to_dict()]


def test_pixels_on_device_is_refused_with_what_to_use_instead():
    proc = processor_for("qwen2_vl")
    with pytest.raises(ArgumentError, match=r"model_inputs\(device\)") as e:
        TrainerCollator(proc, pixels_on_device=True)
    assert "mmpipe.Collator(processor, pixels_on_device=True)" in str(e.value)


def test_the_default_collator_hands_the_trainer_float32_pixels():  # guard
    proc = processor_for("qwen2_vl")
    out = TrainerCollator(proc, pixels_on_device=False)(_rows(proc))
    assert out["pixel_values"].dtype == torch.float32 and out["pixel_values"].shape[1] == 1176
