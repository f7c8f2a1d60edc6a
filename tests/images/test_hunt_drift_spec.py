"""A patch-grid processor whose image processor's patch_size / merge_size drifted from its family's
(an edited preprocessor_config.json): encode counted tokens by the table (rows disagreeing with
the processor's own call) and collate / rollout used the rows as if it were the encoder's. Now
every stage building its `VisionSpec` refuses it with an `ArgumentError` naming both sizes."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError
from mmpipe.rollout import to_vllm_prompts

from helpers import edited_processor, one_image_row

RAW = one_image_row(testing.tiny_image(60, 90))


@pytest.mark.parametrize("key,value", [("merge_size", 1), ("patch_size", 16)])
def test_processor_with_other_patch_or_merge_size_is_refused_at_every_stage(key, value):
    drifted = edited_processor(**{key: value})
    with pytest.raises(ArgumentError, match=f"{key}={value}.*qwen2_vl models take {key}="):
        mmpipe.encode_row(RAW, drifted)
    rows = [mmpipe.encode_row(RAW, edited_processor())]
    with pytest.raises(ArgumentError, match=key):
        mmpipe.collate(rows, processor=drifted)
    with pytest.raises(ArgumentError, match=key):
        to_vllm_prompts(rows, drifted)


def test_the_families_own_sizes_encode_as_the_processor_calls():
    p = edited_processor()
    row = mmpipe.encode_row(RAW, p)
    text = p.apply_chat_template(RAW["messages"], add_generation_prompt=True, tokenize=False)
    ref = p(text=[text], images=RAW["images"], return_tensors="np")
    assert np.array_equal(row.input_ids, ref["input_ids"][0])


def test_a_patch_expand_factor_other_than_1_is_refused():
    """GLM-GA's image processors (`Glm46VProcessor` around `GlmgaImageProcessor`) take a
    ``patch_expand_factor``: its torchvision backend resizes to multiples of patch * merge * factor,
    which the glm46v rows do not (measured with factor 2: grid 6x10 where the processor gives 8x8).
    Every published config has 1; any other is refused by name, and 1 encodes as before."""
    drifted = edited_processor("glm46v", patch_expand_factor=2)
    with pytest.raises(ArgumentError, match="patch_expand_factor=2.*expected patch_expand_factor=1"):
        mmpipe.encode_row(RAW, drifted)
    assert mmpipe.encode_row(RAW, edited_processor("glm46v", patch_expand_factor=1)).image_grid_thw is not None
