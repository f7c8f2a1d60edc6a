"""Qwen2.5-Omni's processor under ``torch.set_default_dtype(torch.float64)``: its audio feature
extraction fails inside transformers ("expected scalar type Double but found Float"). An audio row's
failure now names the default dtype and the fix (an `InputError` on column ``audios``); rows without
audio encode as before (the image path works in that default dtype).

Before the fix the layout probe swallowed the RuntimeError (a processor taking no audio) and the
audio row failed with an `InputError` blaming the processor on column ``messages`` and telling the
user to check the row's image items.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.errors import InputError
from mmpipe.offline.qwen_omni import build_processor

TONE = {"array": (0.1 * np.sin(np.arange(16000) / 8)).astype(np.float32), "sampling_rate": 16000}
AUDIO_ROW = {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is it?"}]},
                          {"role": "assistant", "content": "A tone."}], "audios": [TONE]}
IMAGE_ROW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                          {"role": "assistant", "content": "A square."}],
             "images": [mmpipe.testing.tiny_image(56, 56, seed=0)]}


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_an_audio_row_names_the_default_dtype(float64_default):
    with pytest.raises(InputError, match=r"default dtype is torch\.float64") as e:
        mmpipe.encode_row(AUDIO_ROW, build_processor(), audio="source")
    err = e.value
    assert err.column == "audios" and "torch.float32" in str(err) and "image items" not in str(err)


def test_rows_without_audio_still_encode_in_that_default_dtype(float64_default):  # guard
    assert mmpipe.encode_row(IMAGE_ROW, build_processor()).num_images == 1


def test_audio_row_encodes_under_the_float32_default():  # guard
    assert torch.get_default_dtype() == torch.float32
    assert mmpipe.encode_row(AUDIO_ROW, build_processor(), audio="source").num_tokens > 0
