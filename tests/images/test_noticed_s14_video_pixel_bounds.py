"""Video pixel bounds the sizing rule refuses are refused by name (s11 did this for the Encoder's
image bounds, `mmpipe.images.spec._check_bound`; videos kept their own options).

transformers 5's video processors (Qwen2-VL, Qwen3-VL, GLM-4.1V: ``_preprocess``) raise
``size dict must contain 'shortest_edge' and 'longest_edge'`` for a ``size`` bound of 0, and
qwen-vl-utils' ``fetch_video`` divides by a ``max_pixels`` of 0 while it takes a ``min_pixels`` of 0
as no lower bound (each side stays at least one window). Before:

- ``sampling="processor"`` read a ``min_pixels`` / ``max_pixels`` of 0 as "not given" and sized frames
  with the class defaults (60x80 frames: grid (2, 20, 28) on Qwen2-VL), sizes the processor never makes;
- a ``max_pixels`` of 0 (a video item's, or GLM's) was a bare ``ZeroDivisionError``;
- GLM-4.6V, whose videos always follow its video processor, took a ``min_pixels`` of 0;
- a negative ``min_pixels`` was taken (as 0).
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.errors import ArgumentError, VideoError
from mmpipe.images.video import VideoOptions

pytest.importorskip("transformers")

FRAMES = [np.random.RandomState(i).randint(0, 255, (60, 80, 3), dtype=np.uint8) for i in range(4)]


def _row(**item_options):
    return {"messages": [{"role": "user", "content": [{"type": "video", "video": FRAMES, **item_options},
                                                      {"type": "text", "text": "what happens?"}]}]}


@pytest.fixture(scope="module")
def processors():
    from mmpipe.testing import build_processor

    return {fam: build_processor(fam) for fam in ("qwen2_vl", "qwen3_vl")}


@pytest.mark.parametrize("bound", ["min_pixels", "max_pixels"])
def test_processor_sampling_refuses_a_bound_of_0_when_built(bound):
    """Failed before: DID NOT RAISE (0 read as 'the class default')."""
    with pytest.raises(ArgumentError, match=rf"VideoOptions\.{bound}=0 .*video processor's size.*>= 1") as got:
        VideoOptions(sampling="processor", **{bound: 0})
    assert f"pass {bound}=" in str(got.value) and "leave it out" in str(got.value)


@pytest.mark.parametrize("fam", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("bound", ["min_pixels", "max_pixels"])
def test_processor_sampling_refuses_a_video_items_bound_of_0_naming_the_row(processors, fam, bound):
    """Failed before: DID NOT RAISE (the row encoded at the class defaults' sizes)."""
    enc = mmpipe.Encoder(processors[fam], video_options={"sampling": "processor"})
    with pytest.raises(VideoError, match=rf"{bound}=0") as got:
        enc.encode_row(_row(**{bound: 0}))
    assert got.value.column is not None or "video 0" in str(got.value)


@pytest.mark.parametrize("fam", ["qwen2_vl", "qwen3_vl", "glm46v"])
def test_a_max_pixels_of_0_is_a_typed_error_not_a_division_by_zero(processors, fam):
    """Failed before: ZeroDivisionError."""
    proc = processors.get(fam) or _glm46v()
    with pytest.raises(VideoError, match="max_pixels=0"):
        mmpipe.Encoder(proc).encode_row(_row(max_pixels=0))


def _glm46v():
    import transformers

    if not hasattr(transformers, "Glm46VProcessor"):
        pytest.skip("transformers without glm46v")
    from mmpipe.testing import build_processor

    return build_processor("glm46v")


def test_glm46v_refuses_a_min_pixels_of_0_its_video_processor_refuses():
    """Failed before: DID NOT RAISE (GLM's frames sized with no lower bound)."""
    with pytest.raises(VideoError, match="min_pixels=0") as got:
        mmpipe.Encoder(_glm46v()).encode_row(_row(min_pixels=0))
    assert "min_pixels=1" in got.value.fix


def test_qwen_vl_utils_sampling_keeps_a_min_pixels_of_0_as_no_lower_bound(processors):
    """qwen-vl-utils' own rule: 0 is no lower bound, the same grid as 1 (guard)."""
    enc = mmpipe.Encoder(processors["qwen2_vl"])
    zero, one = enc.encode_row(_row(min_pixels=0)), enc.encode_row(_row(min_pixels=1))
    assert zero.video_grid_thw.tolist() == one.video_grid_thw.tolist() == [[2, 4, 6]]


def test_a_negative_min_pixels_is_refused_on_every_rule():
    """As the image bounds (`_check_bound`): a negative count of pixels is refused (failed before:
    DID NOT RAISE; qwen-vl-utils and the processors take it as 0)."""
    for sampling in ("qwen-vl-utils", "processor"):
        with pytest.raises(ArgumentError, match="min_pixels=-1"):
            VideoOptions(min_pixels=-1, sampling=sampling)
