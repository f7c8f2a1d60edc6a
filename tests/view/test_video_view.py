"""Rows and batches with videos show themselves (`mmpipe.view`): a strip of frames per video
(one thumbnail per frame group, the first frame the model sees in it, pixel for pixel the
stored frame), token spans owned by the right video, and text descriptions naming every
video and frame group. Encoded rows with 0..2 videos and images mixed, three families."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import view
from mmpipe.images.spec import VisionSpec
from mmpipe.rollout.images import row_video_frames

from conftest import FAMILIES, processor_for
from helpers import encode_mixed
from test_display import Page, png_of

LAYOUT = ["vIv", "", "v", "I"]


@pytest.mark.parametrize("family", FAMILIES)
def test_row_html_shows_a_strip_of_each_videos_frames(family):
    proc = processor_for(family)
    row = encode_mixed(LAYOUT, proc)[0]
    spec = VisionSpec.from_processor(proc)
    T = spec.temporal_patch_size
    page = Page(view.row_html(row, tokenizer=proc))
    thumbs = page.find(tag="img", attr="data-mmpipe-video")
    groups = [int(g[0]) for g in row.video_grid_thw.tolist()]
    assert [int(e["attrs"]["data-mmpipe-video"]) for e in thumbs] == [v for v, n in enumerate(groups) for _ in range(n)]
    frames = row_video_frames(row, spec)
    shown = view.video_frames(row, spec=proc)
    for v, n in enumerate(groups):
        for g in range(n):
            assert np.array_equal(np.asarray(shown[v][g]), frames[v][g * T])  # the group's first frame
    # the thumbnails in the page are those frames (shrunk for display, never altered otherwise)
    assert all(png_of(e).ndim == 3 for e in thumbs)
    spans = page.find(cls="mmpipe-video-span", inside="mmpipe-strip")
    assert sum(int(s["attrs"]["data-tokens"]) for s in spans) == int((row.mm_token_type_ids == 2).sum())
    per_block = 1 if not mmpipe.family_of(family).video_frames_are_blocks else None
    owners = [int(s["attrs"]["data-video"]) for s in spans]
    assert owners == ([0, 1] if per_block else [0] * groups[0] + [1] * groups[1])
    assert len(page.images()) == 1  # the image keeps its own thumbnail


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_views_number_videos_across_rows(family):
    proc = processor_for(family)
    rows = encode_mixed(LAYOUT, proc)
    batch = mmpipe.collate(rows, processor=proc)
    text = view.describe(batch, tokenizer=proc)
    assert text.splitlines()[0].endswith(f"images, 3 videos, padding left, pixels {batch.pixel_format}")
    for v in range(3):
        assert f"video {v} " in text
    page = Page(view.batch_html(batch, tokenizer=proc))
    thumbs = page.find(tag="img", attr="data-mmpipe-video")
    assert sorted({int(e["attrs"]["data-mmpipe-video"]) for e in thumbs}) == [0, 1, 2]
    assert batch.sample_to_video_indices == [[0, 1], [], [2], []]
    assert f"B={len(rows)} rows × L={batch.input_ids.shape[1]} · 2 images · 3 videos ·" in view.batch_html(batch, tokenizer=proc)


def test_describe_row_lists_each_frame_group():
    proc = processor_for("qwen3_vl")
    row = encode_mixed(["v"], proc)[0]
    lines = [ln for ln in view.describe(row, tokenizer=proc).splitlines() if ln.strip().startswith("video 0")]
    assert len(lines) == int(row.video_grid_thw[0, 0])  # Qwen3-VL: one block per frame group
    assert "1 video" in view.describe(row, tokenizer=proc).splitlines()[0]
