"""Images and video frames that ``datasets`` stored as nested lists: a row built with a numpy
array (``Dataset.from_list``, a ``map`` returning frames) reads back as lists of lists of ints.
The old code refused every such row ("unsupported image value of type list"); it now encodes
as the array itself on every pixel route, and refuses what is not uint8 pixels."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError
from mmpipe.testing import invariants

ARR = np.asarray(testing.tiny_image(60, 44, seed=3))
FRAMES = np.random.default_rng(0).integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)


def _row(kind, value) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What is it?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "A test card."}]}],
            f"{kind}s": [value]}


@pytest.mark.parametrize("family, pixels", [("qwen2_vl", "uint8"), ("qwen2_vl", "source"), ("qwen2_vl", "none"),
                                            ("gemma3", "uint8"), ("gemma3", "none"), ("idefics3", "float32")])
def test_images_stored_by_datasets_encode_as_the_array(family, pixels):
    proc = testing.build_processor(family)
    stored = datasets.Dataset.from_list([_row("image", ARR)])[0]
    assert isinstance(stored["images"][0], list)
    assert mmpipe.encode_row(stored, proc, pixels=pixels) == mmpipe.encode_row(_row("image", ARR), proc, pixels=pixels)


@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_video_frames_stored_by_datasets_encode_as_the_frames(pixels):
    proc = testing.build_processor("qwen2_vl")
    ds = datasets.Dataset.from_list([_row("video", FRAMES)])
    want = mmpipe.encode_row(_row("video", FRAMES), proc, pixels=pixels)
    assert want.num_videos == 1 and mmpipe.encode_row(ds[0], proc, pixels=pixels) == want
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": pixels}, remove_columns=ds.column_names)
    invariants.assert_rows_from_arrow(out.data.table, [want])


@pytest.mark.parametrize("value, words", [
    ((ARR.astype(np.int64) * 2).tolist(), "outside 0..255"),  # 16-bit-ish values: never wrapped around
    (ARR.astype(np.float32).tolist(), "unsupported image value of type list"),
    ([[1, 2, 3], [4, 5]], "unsupported image value of type list"),  # ragged
])
def test_nested_lists_that_are_not_pixels_are_refused(value, words):
    with pytest.raises(ImageError, match=words) as e:
        mmpipe.encode_row(_row("image", value), testing.build_processor("qwen2_vl"), idx=3)
    assert e.value.row == 3
