"""GLM-4.1V videos bit for bit against the STOCK ``Glm4vProcessor`` with its ``Glm4vVideoProcessor``
(torchvision's Python transforms: the vLLM environment, scripts/envs/vllm.sh).

The stock processor gets every decoded frame of the clip with its metadata and samples by its own
rule (``do_sample_frames=True``, ``sample_frames``), or a frame list whole (``do_sample_frames=False``);
its ``input_ids``, ``mm_token_type_ids``, ``pixel_values_videos`` and ``video_grid_thw`` (and the
image outputs) equal `mmpipe.encode_row`'s with ``pixels="float32"``.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.families import GLM4V

from helpers import all_frames, make_video

pytestmark = pytest.mark.needs_env("vllm")
av = pytest.importorskip("av", reason="PyAV is a test extra")
BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}
CLIPS = [(20, 10.0, 64, 80, None), (31, 29.97, 112, 84, 1.5), (40, 25.0, 20, 60, 4.0), (9, 2.0, 100, 70, None)]


def _stock():
    import transformers

    from mmpipe.offline.glm4v import GLM4V_CHAT_TEMPLATE, build_image_processor, build_tokenizer

    video = transformers.Glm4vVideoProcessor(
        size={"shortest_edge": BOUNDS["min_pixels"], "longest_edge": BOUNDS["max_pixels"]},
        patch_size=GLM4V.patch_size, temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
        image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std))
    return transformers.Glm4vProcessor(image_processor=build_image_processor(), tokenizer=build_tokenizer(),
                                       video_processor=video, chat_template=GLM4V_CHAT_TEMPLATE)


def _check(got, out):
    assert got.input_ids.tolist() == out["input_ids"][0].tolist()
    assert got.mm_token_type_ids.tolist() == out["mm_token_type_ids"][0].tolist()
    assert got.video_grid_thw.tolist() == out["video_grid_thw"].tolist()
    assert np.array_equal(got.pixel_values_videos, out["pixel_values_videos"])
    if "image_grid_thw" in out:
        assert got.image_grid_thw.tolist() == out["image_grid_thw"].tolist()
        assert np.array_equal(got.pixel_values, out["pixel_values"])


@pytest.mark.parametrize("clip", CLIPS)
def test_container_videos_equal_the_stock_processor(clip, tmp_path):
    n, fps, h, w, want = clip
    data = make_video(n, fps, h, w, seed=n)
    frames = all_frames(data)
    image = testing.tiny_image(40, 56, seed=3)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Describe"}, {"type": "image"}]},
            {"role": "assistant", "content": "A bar."}]
    opts = {**BOUNDS, **({"fps": want} if want else {})}
    got = mmpipe.encode_row({"messages": msgs, "videos": [data], "images": [image]}, testing.build_processor("glm4v"),
                            video_options=opts, pixels="float32")
    proc = _stock()
    text = proc.apply_chat_template(msgs, tokenize=False)
    meta = {"total_num_frames": n, "fps": fps, "duration": n / fps, "frames_indices": list(range(n))}
    out = proc(text=[text], videos=[np.stack(frames)], video_metadata=[meta], images=[image], do_sample_frames=True,
               return_tensors="np", **({"fps": want} if want else {}))
    _check(got, out)


def test_frame_lists_equal_the_stock_processor():
    frames = all_frames(make_video(7, 3.0, 56, 84, seed=1))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    got = mmpipe.encode_row({"messages": msgs, "videos": [{"frames": [Image.fromarray(f) for f in frames], "fps": 3.0}]},
                            testing.build_processor("glm4v"), video_options=BOUNDS, pixels="float32", labels=False)
    proc = _stock()
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # labels=False: a prompt
    meta = {"total_num_frames": 7, "fps": 3.0, "duration": 7 / 3.0, "frames_indices": list(range(7))}
    out = proc(text=[text], videos=[np.stack(frames)], video_metadata=[meta], do_sample_frames=False,
               return_tensors="np")
    _check(got, out)
