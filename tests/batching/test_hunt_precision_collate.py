"""Precision hunt: patch-grid rows whose float32 ``pixel_values`` column was cast to float16 after
encoding (a halved cache) are refused at collate by what happened to them. Before, the
normalisation check said they "were not made with this processor's image settings" and to collate
with the processor they were encoded with, which they were."""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import PixelDataError

from helpers import generic_chat_rows


def test_float16_rounded_rows_are_named_at_collate():
    proc = testing.build_processor("qwen2_vl")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(generic_chat_rows([1, 2])), proc, pixels="float32")
    half = enc.cast_column("pixel_values", datasets.List(datasets.List(datasets.Value("float16"))))
    assert mmpipe.collate(list(enc), processor=proc).pixel_values is not None
    with pytest.raises(PixelDataError, match="rounded to float16 after encoding") as e:
        mmpipe.collate(list(half), processor=proc)
    assert "re-encode" in str(e.value) and "image settings" not in str(e.value)
