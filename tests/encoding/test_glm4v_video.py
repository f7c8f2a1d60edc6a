"""GLM-4.1V videos (`mmpipe.encoding.glm_videos`) against transformers' GLM-4.1V classes.

Oracles in the main env (``Glm4vVideoProcessor`` needs torchvision, which cannot be installed here;
tests/rollout/test_glm4v_video_vllm.py compares with the real video processor in the vLLM env):
- sampled frames: the real ``Glm4vVideoProcessor.sample_frames`` (it reads only ``fps`` and
  ``max_duration`` of ``self``) on the video's metadata; a frame list is used whole;
- frame size: transformers' glm4v video ``smart_resize`` with the frame count;
- pixels: each sampled frame resized by the torchvision rule (`backends.resize_u8_torch`, checked
  against torchvision in the vLLM env), the fused float32 table, patched by the real
  ``Glm4vVideoProcessor.patchify``;
- ids, token types, grids: the real ``Glm4vProcessor``'s text path (``replace_video_token`` with
  the video processor's grid and metadata, ``get_text_with_replacements``, the tokenizer,
  ``create_mm_token_type_ids``);
- positions: the tiny model's own ``get_rope_index``; logits: the model on each row alone.
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
from mmpipe.errors import VideoError
from mmpipe.images.backends import resize_u8_torch
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.testing.invariants import (assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip,
                                       assert_row_positions)

from conftest import model_for, processor_for
from helpers import all_frames, make_video

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
FAMILY = "glm4v"
BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}

CASES = {
    # {"type": "video"} + a videos column (a file's bytes), and an image
    "column": dict(video=(20, 10.0, 64, 80), options={**BOUNDS}, image=True),
    # an inline item carrying a path and its own fps; timestamps cross whole seconds
    "inline": dict(video=(31, 29.97, 112, 84), options={**BOUNDS}, item={"fps": 1.5}),
    # verl-style <video> marker, an odd frame list with its fps ({"frames", "fps"}), and an <image>
    "prompt": dict(video=(5, 3.0, 56, 84), options={**BOUNDS}, frames=True, image=True),
    # a small frame (a side below 28 scales up) at 25 fps
    "small": dict(video=(40, 25.0, 20, 60), options={**BOUNDS, "fps": 4.0}),
}


@functools.lru_cache(maxsize=None)
def oracle_processor():
    proc = testing.build_processor(FAMILY)
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    return proc


def build_case(name: str, tmp_path):
    c = CASES[name]
    n, fps, h, w = c["video"]
    data = make_video(n, fps, h, w, seed=len(name))
    img = testing.tiny_image(40, 56, seed=3)
    frames = all_frames(data)
    items = [{"type": "video"}, {"type": "text", "text": "Describe it"}] + ([{"type": "image"}] if c.get("image") else [])
    oracle_msgs = [{"role": "user", "content": items}, {"role": "assistant", "content": "A moving bar."}]
    if name == "prompt":
        row = {"prompt": [{"role": "user", "content": "<video>Describe it<image>"}], "completion": "A moving bar.",
               "videos": [{"frames": [Image.fromarray(f) for f in frames], "fps": fps}], "images": [img]}
    elif name == "inline":
        path = tmp_path / "clip.mp4"
        path.write_bytes(data)
        row = {"messages": [{"role": "user", "content": [{"type": "video", "video": str(path), **c["item"]},
                                                         {"type": "text", "text": "Describe it"}]},
                            {"role": "assistant", "content": "A moving bar."}]}
    else:
        row = {"messages": oracle_msgs, "videos": [data], **({"images": [img]} if c.get("image") else {})}
    return row, oracle_msgs, frames, fps, [img] if c.get("image") else []


def sampled(name: str, frames: list, fps: float) -> list[int]:
    """Glm4vVideoProcessor.sample_frames on the video's metadata (a frame list: every frame)."""
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor
    from transformers.video_utils import VideoMetadata

    c = CASES[name]
    if c.get("frames"):
        return list(range(len(frames)))
    want = c.get("item", {}).get("fps", c["options"].get("fps"))
    meta = VideoMetadata(total_num_frames=len(frames), fps=fps, duration=len(frames) / fps)
    owner = SimpleNamespace(fps=2, max_duration=300)
    return Glm4vVideoProcessor.sample_frames(owner, meta, fps=want).tolist()


def pixel_oracle(frames: list, spec: VisionSpec) -> tuple[np.ndarray, list]:
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor, smart_resize

    h, w = frames[0].shape[:2]
    th, tw = smart_resize(len(frames), h, w, temporal_factor=2, factor=28, min_pixels=BOUNDS["min_pixels"],
                          max_pixels=BOUNDS["max_pixels"])
    lut = spec.for_videos().lut()
    small = np.stack([resize_u8_torch(f, th, tw) for f in frames])  # [n, th, tw, 3]
    x = torch.from_numpy(np.stack([lut[c][small[..., c]] for c in range(3)], axis=1))[None]  # [1, n, 3, th, tw]
    patches, gt, gh, gw = Glm4vVideoProcessor.patchify(None, x, 14, 2, 2)
    return patches[0].numpy(), [gt, gh, gw]


def processor_oracle(messages, images, n_frames, grid, frames_indices, fps):
    from transformers.video_utils import VideoMetadata

    proc = oracle_processor()
    text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    img_out = proc.image_processor(images=images, return_tensors="np") if images else None
    img_rep = [proc.replace_image_token(img_out, image_idx=i) for i in range(len(images))]
    meta = VideoMetadata(total_num_frames=n_frames, fps=fps, frames_indices=list(frames_indices))
    vid_in = {"video_grid_thw": torch.tensor([grid]), "video_metadata": [meta]}
    texts, _ = proc.get_text_with_replacements([text], img_rep, [proc.replace_video_token(vid_in, video_idx=0)])
    ids = proc.tokenizer(texts)["input_ids"][0]
    mm = proc.create_mm_token_type_ids([ids])[0]
    return np.asarray(ids), np.asarray(mm), (img_out["image_grid_thw"] if img_out else np.zeros((0, 3)))


@pytest.mark.parametrize("name", list(CASES))
def test_glm_video_rows_equal_the_processor(name, tmp_path):
    row, messages, frames, fps, images = build_case(name, tmp_path)
    proc = processor_for(FAMILY)
    spec = VisionSpec.from_processor(proc)
    got = mmpipe.encode_row(row, proc, idx=0, video_options=CASES[name]["options"])
    got.validate()
    idx = sampled(name, frames, fps)
    ref_pv, grid = pixel_oracle([frames[i] for i in idx], spec)
    ids, mm, img_grids = processor_oracle(messages, images, len(frames), grid, idx, fps)
    assert got.input_ids.tolist() == ids.tolist()
    assert np.array_equal(got.mm_token_type_ids, mm) and (mm == 2).any()
    assert got.video_grid_thw.tolist() == [grid] and np.array_equal(got.image_grid_thw, img_grids)
    assert np.array_equal(u8_video_to_pixel_values(got.pixel_values_videos_u8, spec.for_videos().lut()), ref_pv)
    assert (got.labels[got.mm_token_type_ids > 0] == -100).all() and (got.labels != -100).any()
    assert_row_positions(got, model=model_for(FAMILY))  # == Glm4vModel.get_rope_index
    f32 = mmpipe.encode_row(row, proc, idx=0, video_options=CASES[name]["options"], pixels="float32")
    assert np.array_equal(f32.pixel_values_videos, ref_pv) and f32.input_ids.tolist() == ids.tolist()
    lay = mmpipe.encode_row(row, proc, idx=0, video_options=CASES[name]["options"], pixels="none")
    for col in ("input_ids", "mm_token_type_ids", "position_ids", "video_grid_thw", "image_grid_thw", "labels"):
        assert np.array_equal(getattr(lay, col), getattr(got, col)), (name, col)


def test_glm_video_and_text_rows_batch_like_rows_alone(tmp_path):
    """Rows with videos (a file, a path item, a frame list; 0..2 videos) and rows without media:
    positions == the model's get_rope_index per row, batched logits == each row alone,
    rows round-trip through collate (assert_roundtrip). (Images and videos never share a forward here: see below.)"""
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    frames = [Image.fromarray(f) for f in all_frames(make_video(5, 3.0, 56, 84, seed=1))]
    two = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "and"},
                                                     {"type": "video"}]}, {"role": "assistant", "content": "Two."}],
           "videos": [{"frames": frames, "fps": 3.0}, make_video(12, 6.0, 40, 64, seed=2)]}
    rows = [mmpipe.encode_row(r, proc, idx=i, video_options=BOUNDS) for i, r in enumerate([
        build_case("small", tmp_path)[0], {"messages": [{"role": "user", "content": "no media at all"}]},
        build_case("inline", tmp_path)[0], two])]
    batch = assert_roundtrip(rows, processor=proc)
    assert_positions_match_rows(batch, rows, model=model)
    assert batch.sample_to_video_indices == [[0], [], [1], [2, 3]]
    assert_batched_logits_match(model, rows, proc, batch=batch, rtol=1e-5, atol=1e-5)
    edited = dict(two, videos=[{"frames": frames[:2] + [Image.fromarray(255 - np.asarray(frames[2]))] + frames[3:],
                                "fps": 3.0}, two["videos"][1]])
    rows2 = rows[:3] + [mmpipe.encode_row(edited, proc, idx=3, video_options=BOUNDS)]
    with torch.no_grad():
        a, b = (model(**mmpipe.collate(r, processor=proc).model_inputs()).logits for r in (rows, rows2))
    assert torch.equal(a[:3], b[:3]) and not torch.allclose(a[3], b[3])


def test_images_with_videos_in_one_forward_fail_in_transformers(tmp_path):
    """transformers' Glm4vModel.get_placeholder_mask takes every <|image|> as both an image and a
    video token, so a forward holding images AND videos fails there (with the processor's own
    outputs too, which a row equals): mmpipe encodes such rows (vLLM, positions, storage), but a
    transformers forward needs batches of image rows or of video rows."""
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    row = mmpipe.encode_row(build_case("column", tmp_path)[0], proc, video_options=BOUNDS)
    assert row.image_grid_thw.shape[0] == 1 and row.video_grid_thw.shape[0] == 1
    with torch.no_grad(), pytest.raises(ValueError, match="Image features and image tokens do not match"):
        model(**mmpipe.collate([row], processor=proc).model_inputs())


def test_glm_video_takes_no_nframes(tmp_path):
    row = build_case("inline", tmp_path)[0]
    row["messages"][0]["content"][0] = {"type": "video", "video": row["messages"][0]["content"][0]["video"],
                                        "nframes": 4}
    with pytest.raises(VideoError, match="no nframes"):
        mmpipe.encode_row(row, processor_for(FAMILY), video_options=BOUNDS)


@pytest.mark.parametrize("total,video_fps,fps", [(20, 10.0, None), (31, 29.97, 1.5), (7, 3.0, 2.0), (1, 24.0, None),
                                                 (9001, 30.0, None), (700, 2.0, 1.0), (40000, 25.0, 2.0)])
def test_frame_sampling_equals_the_video_processor(total, video_fps, fps):
    """`glm_sample_indices` == ``Glm4vVideoProcessor.sample_frames``, past 300 s (its linspace branch) too."""
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor
    from transformers.video_utils import VideoMetadata

    from mmpipe.encoding.glm_videos import glm_sample_indices

    meta = VideoMetadata(total_num_frames=total, fps=video_fps, duration=total / video_fps)
    ref = Glm4vVideoProcessor.sample_frames(SimpleNamespace(fps=2, max_duration=300), meta, fps=fps)
    assert glm_sample_indices(total, video_fps, fps, total / video_fps).tolist() == ref.tolist()


@pytest.mark.parametrize("n", [2, 3, 5, 8, 31])
@pytest.mark.parametrize("hw", [(20, 60), (64, 80), (480, 640), (1080, 1920), (13, 2000)])
def test_frame_size_equals_the_video_processor(n, hw):
    from transformers.models.glm4v.video_processing_glm4v import smart_resize

    from mmpipe.encoding.glm_videos import glm_video_size
    from mmpipe.images.video import VideoOptions

    spec = VisionSpec.from_processor(processor_for(FAMILY))
    for lo, hi in [(BOUNDS["min_pixels"], BOUNDS["max_pixels"]), (112 * 112, 28 * 28 * 2 * 30000)]:
        ref = smart_resize(n, *hw, temporal_factor=2, factor=28, min_pixels=lo, max_pixels=hi)
        assert glm_video_size(n, *hw, spec, VideoOptions(min_pixels=lo, max_pixels=hi), "v") == ref
