"""PaliGemma on transformers 4.57 (scripts/envs/tf457.sh; hunt): its processor refuses a call
without images ("`images` are expected"), so a text-only row cannot be encoded on the generic
path. Old code: the row's error said "check the row's image items against its images and the
chat template" (the row has none). Now it keeps the processor's message and says what to do:
give every row an image, or filter the text-only rows out (``on_error="skip"`` drops them)."""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError

from conftest import processor_for

pytestmark = pytest.mark.needs_env("tf457")


def _raw(n_images: int, k: int = 0) -> dict:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": "a cat."}]}],
            "images": [testing.tiny_image(40, 56, seed=k)] * n_images}


def test_text_only_row_names_the_missing_image():
    proc = processor_for("paligemma")
    assert mmpipe.encode_row(_raw(1), proc).input_ids.size  # a row with an image encodes
    with pytest.raises(InputError) as info:
        mmpipe.encode_row(_raw(0, 1), proc)
    e = info.value
    assert e.column == "images" and "`images` are expected" in str(e), str(e)
    assert "filter the text-only rows" in e.fix and "image items" not in e.fix, e.fix


def test_text_only_rows_are_skipped_with_that_reason():
    proc = processor_for("paligemma")
    raw = datasets.Dataset.from_list([_raw(1, 0), _raw(0, 1), _raw(1, 2)])
    enc, report = mmpipe.encode_dataset(raw, proc, on_error="skip")
    assert len(enc) == 2
    assert [(f["row"], f["column"]) for f in report.errors] == [(1, "images")], report
