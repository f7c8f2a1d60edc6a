"""Qwen2.5-Omni's processor under ``torch.set_default_dtype(torch.float64)``: its audio feature
extraction fails inside transformers ("expected scalar type Double but found Float"). mmpipe's
audio probe now says so (`ArgumentError` naming the default dtype and the fix).

Before the fix the probe swallowed the RuntimeError and recorded a processor taking no audio: the
encode of an audio row then failed with an `InputError` blaming the processor and telling the user to
check the row's image items.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.offline.qwen_omni import build_processor

TONE = {"array": (0.1 * np.sin(np.arange(16000) / 8)).astype(np.float32), "sampling_rate": 16000}
ROW = {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is it?"}]},
                    {"role": "assistant", "content": "A tone."}], "audios": [TONE]}


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_audio_probe_names_the_default_dtype(float64_default):
    with pytest.raises(ArgumentError, match=r"default dtype is torch\.float64") as e:
        mmpipe.encode_row(ROW, build_processor(), audio="source")
    assert "torch.float32" in str(e.value) and "image items" not in str(e.value)


def test_audio_row_encodes_under_the_float32_default():  # guard
    assert torch.get_default_dtype() == torch.float32
    row = mmpipe.encode_row(ROW, build_processor(), audio="source")
    assert row.num_tokens > 0
