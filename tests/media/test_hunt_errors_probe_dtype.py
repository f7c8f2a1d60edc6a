"""An Omni encoder whose layout was probed under ``torch.set_default_dtype(torch.float64)`` and
later used under float32 encodes its audio rows.

Under float64 Qwen2.5-Omni's audio feature extraction fails inside transformers, so the layout probe
finds no audio keys. The probe ran once per encoder, whatever the default dtype was then: before the
fix the same encoder refused every later audio row under float32 with an `InputError` "the processor
returned 'input_features', which its probe did not show". The encoder now probes again when torch's
default dtype changed since its probe.
"""

from __future__ import annotations

import pickle

import torch

import mmpipe
from mmpipe.offline.qwen_omni import build_processor

from media.test_noticed_s10_omni_default_dtype import AUDIO_ROW, IMAGE_ROW


def _under(dtype, fn):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return fn()
    finally:
        torch.set_default_dtype(before)


def test_probe_under_float64_then_audio_row_under_float32():
    enc = mmpipe.Encoder(build_processor(), audio="source")
    assert _under(torch.float64, lambda: enc.encode_row(IMAGE_ROW)).num_images == 1  # probes under float64
    assert torch.get_default_dtype() == torch.float32
    fresh = mmpipe.Encoder(build_processor(), audio="source").encode_row(AUDIO_ROW)
    row = enc.encode_row(AUDIO_ROW)
    assert row.num_tokens == fresh.num_tokens > 0
    assert enc.layout() == mmpipe.Encoder(build_processor(), audio="source").layout()


def test_pickled_encoder_probes_in_its_own_default_dtype():  # guard: the probe's dtype is runtime state
    enc = mmpipe.Encoder(build_processor(), audio="source")
    _under(torch.float64, lambda: enc.encode_row(IMAGE_ROW))
    assert pickle.loads(pickle.dumps(enc)).encode_row(AUDIO_ROW).num_tokens > 0
