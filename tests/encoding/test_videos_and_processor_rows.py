"""Rows from transformers processor output (any padding), exact compaction, and videos
through collate / unbatch / the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.images.spec import VisionSpec
from mmpipe.testing.invariants import assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip

from helpers import video_row
from conftest import model_for, processor_for


def test_processor_batch_output_gives_the_encoded_rows(processor, photos):
    chats = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "one"}]}],
        [{"role": "user", "content": "no image here, longer text " * 3}],
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "image"}]}],
    ]
    images = [[photos[0]], [], [photos[1], photos[2]]]
    texts = [processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    processor.tokenizer.padding_side = "left"
    try:
        out = processor(text=texts, images=[im for ims in images for im in ims], padding=True, return_tensors="pt")
    finally:
        processor.tokenizer.padding_side = "right"
    rows = mmpipe.rows_from_processor_output(out, processor)
    for row, c, ims in zip(rows, chats, images):
        enc = mmpipe.encode_row({"messages": c, "images": ims}, processor, labels=False)
        assert row.pixel_format == "float32"
        assert mmpipe.compact(row, VisionSpec.from_processor(processor)) == enc


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_video_rows_batch_unbatch_and_match_the_model(family):
    proc, model = processor_for(family), model_for(family)
    # temporal extents stay within max(h, w)/merge: there transformers 5.23 and the original
    # Qwen rule agree, so the model's own positions are a valid reference (the divergent case
    # is pinned in test_rope.py)
    outs = [video_row(family, (2, 4, 6), seed=1, sec=0.5), video_row(family, (2, 6, 4), seed=2, sec=1.0)]
    vrows = [mmpipe.rows_from_processor_output(o, proc)[0] for o, _ in outs]
    text_row = mmpipe.encode_row({"messages": [{"role": "user", "content": "plain"}]}, proc, labels=False)
    img_row = mmpipe.compact(mmpipe.encode_row(
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
         "images": [testing.tiny_image(60, 40)]}, proc, labels=False, pixels="float32"))
    compact_v = [mmpipe.compact(r, VisionSpec.from_processor(proc)) for r in vrows]
    assert np.array_equal(compact_v[0].pixel_values_videos_u8, outs[0][1])
    for rows in (vrows + [text_row], compact_v + [text_row, img_row]):
        batch = assert_roundtrip(rows, processor=proc)
        assert_positions_match_rows(batch, rows, model=model)
        assert batch.sample_to_video_indices[:2] == [[0], [1]]
    batch = mmpipe.collate(compact_v + [text_row, img_row], processor=proc)
    kw = batch.model_inputs()
    assert "pixel_values_videos" in kw and "pixel_values" in kw
    assert ("second_per_grid_ts" in kw) == (family == "qwen2_5_vl")
    # the two video rows against the processor-layout rows run alone; the others against collate([row])
    ref_kw = [{k: torch.as_tensor(v) for k, v in o.items() if k != "second_per_grid_ts" or family == "qwen2_5_vl"}
              for o, _ in outs]
    assert_batched_logits_match(model, compact_v + [text_row, img_row], proc, batch=batch, rtol=1e-5, atol=1e-5,
                                references=ref_kw + [None, None])
