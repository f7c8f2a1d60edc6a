"""Pixel bounds the processor refuses are refused when mmpipe reads them (skip / bad-input hunt):
`VisionSpec.from_processor` (the Encoder builds it at construction) refuses a given min_pixels /
max_pixels of 0, a negative one, a fraction or a non-number, and a processor whose own size holds a
fraction or a string, with an ArgumentError naming the setting, expected vs found and the fix.
Before: min_pixels=0 made one window a side for a thin image (sizes no processor makes; transformers 5
refuses 0), a fraction was rounded down silently (another size at the bound), -5 was taken, and a
string was a bare TypeError."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from mmpipe import Encoder, testing
from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.images.spec import VisionSpec

from conftest import processor_for


def _own_size(shortest, longest=1003520):
    proc = copy.deepcopy(processor_for("qwen2_vl"))
    proc.image_processor.size = {"shortest_edge": shortest, "longest_edge": longest}
    return proc


@pytest.mark.parametrize("given, expected", [
    ({"min_pixels": 0}, "an int >= 1"), ({"min_pixels": 3136.5}, "an int"), ({"max_pixels": 2.5e5 + 0.5}, "an int"),
])
def test_the_encoder_refuses_a_bound_of_zero_or_a_fraction(given, expected):
    """Old code: built (0: one window a side; a fraction: rounded down)."""
    (arg, value), = given.items()
    with pytest.raises(ArgumentError, match=f"{arg}={value!r} is .*expected {expected}, found {value!r}") as e:
        Encoder(processor_for("qwen2_vl"), **given)
    assert ("min_pixels=1 for no lower bound" if value == 0 else "pass a whole number") in str(e.value)


@pytest.mark.parametrize("given", [{"min_pixels": -5}, {"min_pixels": "3136"}, {"max_pixels": -1}, {"min_pixels": True}])
def test_vision_spec_refuses_a_given_bound_that_is_no_pixel_count(given):
    """Old code: -5 and True were taken as bounds, '3136' a bare TypeError; max_pixels=-1 was named only as
    'min_pixels 3136 is more than max_pixels -1'."""
    (arg, value), = given.items()
    with pytest.raises(ArgumentError, match=f"{arg}={value!r} is "):
        VisionSpec.from_processor(processor_for("qwen2_vl"), **given)


@pytest.mark.parametrize("shortest, why", [("3136", "not a whole number"), (3136.5, "not a whole number")])
def test_vision_spec_refuses_a_processor_size_that_is_no_pixel_count(shortest, why):
    """Old code: '3136' (a hand-edited preprocessor_config.json) was a bare TypeError; 3136.5 was read as
    3136 (a 56x56 image stays 56x56 where the processor, comparing with 3136.5, scales it to 84x84)."""
    with pytest.raises(ArgumentError, match=f"has size shortest_edge={shortest!r} \\(min_pixels\\), which is {why}") as e:
        VisionSpec.from_processor(_own_size(shortest))
    assert 'preprocessor_config.json "size"' in str(e.value)


@pytest.mark.skipif(not is_transformers_5(), reason="transformers 4.x reads its min_pixels / max_pixels attributes")
@pytest.mark.parametrize("size", [{"height": 448, "width": 448}, {"shortest_edge": 3136}])
def test_a_processor_size_without_both_bounds_is_refused_as_transformers_5_refuses_it(size):
    """Old code: the family's defaults were used (3136, 1003520) for a processor whose own call raises
    "size dict must contain 'shortest_edge' and 'longest_edge'" (a fixed 448x448 was meant here)."""
    proc = _own_size(None)
    proc.image_processor.size = size
    with pytest.raises(ValueError, match="must contain"):
        proc.image_processor(images=[testing.tiny_image(20, 30)], return_tensors="np")
    with pytest.raises(ArgumentError, match="has no size (shortest|longest)_edge") as e:
        VisionSpec.from_processor(proc)
    assert "preprocessor_config.json" in str(e.value)
    given = VisionSpec.from_processor(proc, min_pixels=3136, max_pixels=10**6)  # both given: the call's keywords
    assert (given.min_pixels, given.max_pixels) == (3136, 10**6)


def test_min_pixels_one_is_no_lower_bound_with_the_processor_s_own_sizes():
    """Guard (the fix the error names): with min_pixels=1 every image, thin ones included, gets the grid the
    processor gives with the same bound (transformers' rule: a side that rounds to 0 scales the image up)."""
    proc = processor_for("qwen2_vl")
    enc = Encoder(proc, min_pixels=1)
    for h, w in ((10, 10), (10, 300), (20, 30), (60, 80), (56, 56)):
        img = testing.tiny_image(h, w, seed=h + w)
        got = enc.encode_one({"prompt": "<image> hi", "images": [np.asarray(img)]})["image_grid_thw"]
        size = {"shortest_edge": 1, "longest_edge": enc.spec.max_pixels}
        want = proc.image_processor(images=[img], size=size, return_tensors="np")["image_grid_thw"]
        assert np.asarray(got).tolist() == np.asarray(want).tolist(), (h, w)


@pytest.mark.skipif(not is_transformers_5(), reason="transformers 4.x takes these values (see _check_bound)")
@pytest.mark.parametrize("given", [{"min_pixels": 0}, {"max_pixels": 0}, {"min_pixels": 3136.5}])
def test_transformers_5_refuses_the_same_call_keywords(given):
    """Guard: what mmpipe refuses, transformers 5's image processor refuses as call keywords (the form the
    rollout sends them in, mm_processor_kwargs)."""
    proc = processor_for("qwen2_vl")
    with pytest.raises(Exception):
        proc.image_processor(images=[testing.tiny_image(20, 30)], return_tensors="np", **given)
    with pytest.raises(ArgumentError):
        VisionSpec.from_processor(proc, **given)
