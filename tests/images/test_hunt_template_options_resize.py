"""Patch-grid families (Qwen2/2.5/3-VL, GLM-4.1V) whose image processor has ``do_resize=False``
(a preprocessor_config.json for images resized beforehand): the processor keeps each image at its
own size, whatever its pixel bounds. mmpipe's rows must equal the processor's chat path with that
processor (ids, pixel_values, grids; positions the transformers rule of those), in every pixel
format, and an image the processor cannot cut into merge windows is an `ImageError` naming the fix.

Before the fix the spec ignored ``do_resize`` and smart-resized every image into the bounds: a
560x840 image became grid (1, 12, 18) where the processor gives (1, 40, 60), a 28x56 one was
enlarged to the minimum, silently.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError
from mmpipe.testing.invariants import assert_row_positions

from conftest import processor_for
from helpers import chat_path

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")


@functools.lru_cache(maxsize=None)
def _unresizing(family: str):
    proc = copy.deepcopy(processor_for(family))
    proc.image_processor.do_resize = False
    return proc


def _raw(family: str) -> dict:
    """Two images whose sides are multiples of the merge window: one over the processor's
    max_pixels, one under its min_pixels (each resized by smart_resize with do_resize=True)."""
    f = 32 if family == "qwen3_vl" else 28
    images = [testing.tiny_image(20 * f, 30 * f, seed=1), testing.tiny_image(f, 2 * f, seed=2)]
    content = [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}, {"type": "text", "text": "?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": "Two."}]}], "images": images}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pixels", ["uint8", "float32", "source", "none"])
def test_do_resize_false_keeps_image_sizes_as_the_processor_does(family, pixels):
    proc, raw = _unresizing(family), _raw(family)
    ref = chat_path(proc, raw)
    row = mmpipe.encode_row(raw, proc, pixels=pixels)
    np.testing.assert_array_equal(row.input_ids, np.asarray(ref["input_ids"]).reshape(-1))
    np.testing.assert_array_equal(row.image_grid_thw, np.asarray(ref["image_grid_thw"]))
    if pixels != "none":
        batch = mmpipe.Collator(proc)([row]).model_inputs()
        np.testing.assert_array_equal(np.asarray(batch["pixel_values"]), np.asarray(ref["pixel_values"]))
    labelled = proc.tokenizer.decode(row.input_ids[row.labels != mmpipe.IGNORE_INDEX])
    assert labelled in ("Two.<|im_end|>", "Two."), labelled  # the answer, nothing else (GLM writes no end)
    if pixels == "uint8":
        assert_row_positions(row.to_dict(), model=testing.build_model(family) if family == "qwen2_vl" else None)


@pytest.mark.parametrize("family", FAMILIES)
def test_do_resize_false_refuses_an_image_the_processor_cannot_cut(family):
    """The processor fails on it with a bare reshape ValueError; mmpipe names the image and the fix."""
    proc = _unresizing(family)
    raw = dict(_raw(family), images=[testing.tiny_image(45, 61, seed=3), _raw(family)["images"][1]])
    with pytest.raises(ValueError):
        chat_path(proc, raw)
    with pytest.raises(ImageError, match=r"image 0.*do_resize=False.*multiples of"):
        mmpipe.encode_row(raw, proc)


@pytest.mark.parametrize("family", FAMILIES)
def test_do_resize_true_still_resizes_into_the_bounds(family):
    """Guard: the processor's default (do_resize=True) is unchanged: the same rows as its chat path."""
    proc, raw = processor_for(family), _raw(family)
    ref = chat_path(proc, raw)
    row = mmpipe.encode_row(raw, proc)
    np.testing.assert_array_equal(row.input_ids, np.asarray(ref["input_ids"]).reshape(-1))
    np.testing.assert_array_equal(row.image_grid_thw, np.asarray(ref["image_grid_thw"]))
    batch = mmpipe.Collator(proc)([row]).model_inputs()
    np.testing.assert_array_equal(np.asarray(batch["pixel_values"]), np.asarray(ref["pixel_values"]))
