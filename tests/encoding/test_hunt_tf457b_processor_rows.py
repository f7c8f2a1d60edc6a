"""`mmpipe.rows_from_processor_output` on a processor output without ``mm_token_type_ids``.

transformers 4.57's Qwen-VL processors return ``mm_token_type_ids`` only when called with
``return_mm_token_type_ids=True`` (5.x always). The rows counted image tokens from those types and
took all-zero types when they were absent: every row came back with no image, no grid and no pixels
(positions as plain text), and nothing was raised - the model would never see the images. Now the
types are read from the family's pad tokens in ``input_ids`` when absent, and grids no row claims
raise `PlaceholderError`.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.errors import PlaceholderError
from mmpipe.images import VisionSpec

from conftest import processor_for

CHATS = [
    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "one"}]}],
    [{"role": "user", "content": "no image here"}],
    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "image"}]}],
]


def _output(proc, photos, **kw):
    texts = [proc.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    images = [photos[0], photos[1], photos[2]]
    return proc(text=texts, images=images, padding=True, return_tensors="np", **kw)


@pytest.mark.needs_env("tf457")
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_a_4_57_output_without_token_types_keeps_the_images(family, photos):
    """Before: rows 0 and 2 came back with 0 images (and rope_delta 0) from 4.57's default output."""
    proc = processor_for(family)
    out = _output(proc, photos)
    assert "mm_token_type_ids" not in out  # 4.57's default
    rows = mmpipe.rows_from_processor_output(out, proc)
    assert [r.num_images for r in rows] == [1, 0, 2]
    with_types = mmpipe.rows_from_processor_output(_output(proc, photos, return_mm_token_type_ids=True), proc)
    spec = VisionSpec.from_processor(proc)
    for k, (row, chat, ims) in enumerate(zip(rows, CHATS, [[photos[0]], [], [photos[1], photos[2]]])):
        enc = mmpipe.encode_row({"messages": chat, "images": ims}, proc, labels=False)
        assert mmpipe.compact(row, spec) == enc, k
        assert mmpipe.compact(with_types[k], spec) == enc, k


def test_grids_no_row_claims_are_refused(photos):
    """An output whose ids and token types hold no image token (here the pads made text) while it holds
    image grids: before, every row without images and nothing raised; now PlaceholderError naming the
    grids."""
    proc = processor_for("qwen2_vl")
    out = dict(_output(proc, photos))
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    out["input_ids"] = np.where(out["input_ids"] == pad, proc.tokenizer.convert_tokens_to_ids("a"), out["input_ids"])
    out["mm_token_type_ids"] = np.zeros_like(out["input_ids"])
    with pytest.raises(PlaceholderError, match=r"claim 0 of the output's 3 image grids"):
        mmpipe.rows_from_processor_output(out, proc)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("types", ["4.57", "absent"])
def test_a_video_output_with_4_57_token_types_keeps_the_video(family, types):
    """A video processor output as 4.57 gives it: mm_token_type_ids marking image pads only (with
    return_mm_token_type_ids=True; its video pads 0), or none. Before: the video was dropped silently
    (0 videos); then (types read from pads only when absent) a PlaceholderError for "4.57"; now the
    row equals the one with 5.x's types."""
    from helpers import video_row

    proc = processor_for(family)
    out, _ = video_row(family, (2, 4, 6), seed=1)
    want = mmpipe.rows_from_processor_output(out, proc)[0]
    old = dict(out)
    if types == "absent":
        del old["mm_token_type_ids"]
    else:
        old["mm_token_type_ids"] = np.zeros_like(out["mm_token_type_ids"])  # no image pad in this row
    got = mmpipe.rows_from_processor_output(old, proc)[0]
    assert got.num_videos == 1 and got == want
