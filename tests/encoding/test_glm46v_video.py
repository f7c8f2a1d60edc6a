"""GLM-4.6V videos (video_rule ``"glm46v"``, `mmpipe.encoding.glm_videos`) in the main env, against
transformers' GLM-4.6V classes that load without torchvision (the video processor does not:
tests/encoding/test_glm46v_video_stock.py holds the stock processor's chat path and flat call).

Oracles: the real ``Glm46VProcessor``'s text path (``replace_video_token`` with the row's grid and
sampled frames, ``get_text_with_replacements``, the tokenizer, ``create_mm_token_type_ids``): its
``"1.5 seconds"`` frame times; the tiny ``Glm46VForConditionalGeneration``'s ``get_rope_index``;
its logits on each row alone. Before: every GLM-4.6V row with a video raised a `VideoError`.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.encoding.glm_videos import glm46v_plan
from mmpipe.errors import VideoError
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, video_layout
from mmpipe.testing.invariants import (assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip,
                                       assert_row_positions)

from conftest import model_for, processor_for
from helpers import all_frames, make_video

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
pytest.importorskip("transformers.models.glm46v", reason="GLM-4.6V needs transformers 5")
FAMILY = "glm46v"
BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}
MSGS = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Describe it"}]},
        {"role": "assistant", "content": "A moving bar."}]


@functools.lru_cache(maxsize=None)
def _oracle_processor():
    proc = testing.build_processor(FAMILY)
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    return proc


def _processor_text(messages, grid, frames_indices, fps):
    """ids, mm_token_type_ids of the real Glm46VProcessor's text path for one video."""
    from transformers.video_utils import VideoMetadata

    proc = _oracle_processor()
    text = proc.apply_chat_template(messages, tokenize=False)
    meta = VideoMetadata(total_num_frames=len(frames_indices), fps=fps, frames_indices=list(frames_indices))
    rep = proc.replace_video_token({"video_grid_thw": torch.tensor([grid]), "video_metadata": [meta]}, video_idx=0)
    texts, _ = proc.get_text_with_replacements([text], [], [rep])
    ids = proc.tokenizer(texts)["input_ids"][0]
    return ids, list(np.asarray(proc.create_mm_token_type_ids([ids])[0]).tolist())


@pytest.mark.parametrize("video", [(20, 10.0, 64, 80), (89, 24.0, 48, 64), (9, 2.0, 56, 84)])
def test_file_rows_write_the_processors_frame_times(video):
    """A video file: ids and token types == Glm46VProcessor's text for the row's frames ("0.4 seconds"
    after each group), positions == Glm46VModel.get_rope_index."""
    n, fps, h, w = video
    got = mmpipe.encode_row({"messages": MSGS, "videos": [make_video(n, fps, h, w, seed=n)]}, processor_for(FAMILY),
                            video_options=BOUNDS)
    got.validate()
    spec = VisionSpec.from_processor(processor_for(FAMILY))
    idx = video_layout(make_video(n, fps, h, w, seed=n), spec, VideoOptions(**BOUNDS), plan=glm46v_plan).frame_indices
    ids, mm = _processor_text(MSGS, got.video_grid_thw[0].tolist(), idx.tolist(), fps)
    assert got.input_ids.tolist() == ids and got.mm_token_type_ids.tolist() == mm
    assert " seconds" in processor_for(FAMILY).tokenizer.decode(got.input_ids)
    assert_row_positions(got, model=model_for(FAMILY))


def test_frame_lists_rows_and_batches_equal_the_processor_and_model():
    """Frame lists (every frame, an odd count's last repeated): ids == the processor's text; rows with
    0..2 videos and a text row: positions == get_rope_index, batched logits == each row alone, both
    padding sides, collate round trip."""
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    a = [Image.fromarray(f) for f in all_frames(make_video(5, 3.0, 56, 84, seed=1))]
    one = {"messages": MSGS, "videos": [{"frames": a, "fps": 3.0}]}
    row = mmpipe.encode_row(one, proc, video_options=BOUNDS)
    ids, mm = _processor_text(MSGS, row.video_grid_thw[0].tolist(), range(5), 3.0)
    assert row.input_ids.tolist() == ids and row.mm_token_type_ids.tolist() == mm
    assert "1.3 seconds" in proc.tokenizer.decode(row.input_ids)  # frame 4 at 3 fps, GLM-4.1V writes "1"
    two = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "and"},
                                                     {"type": "video"}]}, {"role": "assistant", "content": "Two."}],
           "videos": [{"frames": a, "fps": 3.0}, make_video(12, 6.0, 40, 64, seed=2)]}
    text = {"messages": [{"role": "user", "content": "no media at all"}, {"role": "assistant", "content": "Ok."}]}
    rows = [mmpipe.encode_row(r, proc, idx=i, video_options=BOUNDS) for i, r in enumerate([one, text, two])]
    for side in ("left", "right"):
        batch = assert_roundtrip(rows, processor=proc, padding_side=side)
        assert_positions_match_rows(batch, rows, model=model)
        assert_batched_logits_match(model, rows, proc, batch=batch, padding_side=side, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("option", [{"fps": 1.0}, {"nframes": 4}])
def test_a_sampling_rate_the_processor_ignores_is_refused(option):
    """Glm46VVideoProcessor.sample_frames picks its rate by the duration and ignores fps / num_frames."""
    row = {"messages": MSGS, "videos": [make_video(20, 10.0, 64, 80, seed=1)]}
    with pytest.raises(VideoError, match="picks its own rate"):
        mmpipe.encode_row(row, processor_for(FAMILY), video_options={**BOUNDS, **option})


def test_vllm_prompts_of_video_rows_are_refused():
    """vLLM's glm4_1v processor writes whole seconds: a GLM-4.6V video row's prompt is refused, typed."""
    from mmpipe.rollout import to_vllm_prompts

    proc = processor_for(FAMILY)
    msgs = [MSGS[0]]
    row = mmpipe.encode_row({"messages": msgs, "videos": [make_video(20, 10.0, 64, 80, seed=1)]}, proc,
                            video_options=BOUNDS, labels=False)
    with pytest.raises(VideoError, match="1.5 seconds") as e:
        to_vllm_prompts([row], proc)
    assert e.value.stage == "rollout"


def test_a_processor_with_another_video_processor_is_refused():
    """GLM-GA checkpoints ship Glm46VProcessor with GlmgaVideoProcessor (fps 2, another frame rule):
    its videos are refused rather than sampled by Glm46VVideoProcessor's rule (a class of that name
    here: the real one needs torchvision, test_glm46v_video_stock.py)."""
    proc = processor_for(FAMILY)
    proc.video_processor = type("GlmgaVideoProcessor", (), {})()
    with pytest.raises(VideoError, match="GlmgaVideoProcessor") as e:
        mmpipe.encode_row({"messages": MSGS, "videos": [make_video(20, 10.0, 64, 80, seed=1)]}, proc,
                          video_options=BOUNDS)
    assert e.value.expected == "Glm46VVideoProcessor" and e.value.column == "videos"
    proc.video_processor = type("MyVideoProcessor", (type("Glm46VVideoProcessor", (), {}),), {})()  # a subclass
    assert mmpipe.encode_row({"messages": MSGS, "videos": [make_video(20, 10.0, 64, 80, seed=1)]}, proc,
                             video_options=BOUNDS).video_grid_thw.shape == (1, 3)
