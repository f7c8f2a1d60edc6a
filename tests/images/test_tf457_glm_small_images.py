"""GLM-4.1V images with a side below the resize factor (28) on transformers 4.57
(scripts/envs/tf457.sh).

transformers 5's GLM-4.1V ``smart_resize`` scales such an image up first; 4.57's raises
``ValueError: height:H or width:W must be larger than factor:28``, so 4.57's processor (and
every rollout engine that runs it) cannot take the image at all. Before, mmpipe applied 5.x's
rule on every line: on 4.57 it stored a row (grid (1, 2, 66) for a 100x3 image) that the
installed processor refuses, silently. Now `mmpipe.encode_row` refuses it there with an
ImageError naming the factor and the fix; sides from 28 up still equal the 4.57 processor.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError

pytestmark = pytest.mark.needs_env("tf457")


def _raw(image) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}],
            "images": [image]}


@pytest.fixture(scope="module")
def proc():
    return testing.build_processor("glm4v")


def test_the_line_is_4_57():
    import transformers

    assert transformers.__version__.startswith("4.57")


@pytest.mark.parametrize("height, width", [(3, 100), (20, 20), (60, 27)])
def test_a_side_below_the_factor_is_refused_as_the_processor_does(proc, height, width):
    """Before: DID NOT RAISE (a row with a grid the 4.57 processor never makes)."""
    image = testing.tiny_image(height, width, seed=1)
    text = proc.apply_chat_template(_raw(image)["messages"], tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match="must be larger than factor:28"):  # the 4.57 processor itself
        proc(text=[text], images=[image], return_tensors="np")
    for pixels in ("uint8", "none"):
        with pytest.raises(ImageError, match=r"below 28, which transformers 4.x.*transformers>=5") as e:
            mmpipe.encode_row(_raw(image), proc, pixels=pixels, labels=False)
        assert e.value.expected == "height >= 28 and width >= 28"


@pytest.mark.parametrize("height, width", [(28, 60), (28, 28), (45, 29)])
def test_sides_from_the_factor_up_equal_the_processor(proc, height, width):
    """Guard: at and above the factor the row is the 4.57 processor's (ids, grid, pixels)."""
    image = testing.tiny_image(height, width, seed=2)
    raw = _raw(image)
    row = mmpipe.encode_row(raw, proc, labels=False)
    text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=True)
    ref = proc(text=[text], images=[image], return_tensors="np")
    assert np.array_equal(ref["input_ids"][0], row.input_ids)
    assert np.array_equal(ref["image_grid_thw"], row.image_grid_thw)
    assert np.array_equal(ref["pixel_values"], np.asarray(mmpipe.collate([row], processor=proc).pixel_values))
