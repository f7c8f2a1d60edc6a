"""``VideoOptions.from_processor`` rows against the STOCK processor's own chat path on video files:
``processor.apply_chat_template([{"type": "video", "path": file}, ...], tokenize=True, return_dict=True,
add_generation_prompt=True, fps= / num_frames=)``, which decodes the file and samples it with the
family's video processor (``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor`` / ``Glm4vVideoProcessor``),
in the "vision" environment (torchvision's Python transforms, scripts/envs/vision.sh).

The processor decodes with torchcodec; the registry's torchcodec is CUDA-linked (it does not load on
this CPU torch), so its ``fetch_videos`` is pointed at transformers' own PyAV reader
(``load_video(backend="pyav")``) for these tests. Video processor sizes as the checkpoints ship them
(Qwen2/2.5-VL: ``preprocessor_config.json``'s 3136..12845056 per frame; Qwen3-VL's
``video_preprocessor_config.json``: 4096..25165824 for the whole clip, fps 2).

Held equal: the sampled source frames, ``input_ids`` (Qwen3-VL's ``<t seconds>`` texts included),
``mm_token_type_ids``, ``video_grid_thw``, ``pixel_values_videos`` and Qwen2.5-VL's
``second_per_grid_ts``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import video_layout
from mmpipe.images.video_processor_plan import processor_options, processor_plan

from helpers import make_video, pyav_chat_path

pytestmark = pytest.mark.needs_env("vision")
av = pytest.importorskip("av", reason="PyAV is a test extra")

HUB = {"qwen2_vl": (3136, 12845056), "qwen2_5_vl": (3136, 12845056), "qwen3_vl": (4096, 25165824)}
# name, frames, fps, extra make_video arguments
CLIPS = [("3.7s@24", 89, 24, {}), ("1s@30", 30, 30, {}), ("2 frames", 2, 2, {}),
         ("vfr", 20, 10, {"pts": [i * 100 + (i % 3) * 40 for i in range(20)]})]


@pytest.fixture
def sampled(monkeypatch):
    """The chat path's decoder: transformers' PyAV reader; returns the source frames it sampled."""
    return pyav_chat_path(monkeypatch)


def _stock(family):
    from transformers.image_utils import SizeDict

    from mmpipe.offline.checkpoints import build_checkpoint_processor

    proc = build_checkpoint_processor(family)
    lo, hi = HUB[family]
    proc.video_processor.size = SizeDict(shortest_edge=lo, longest_edge=hi)
    return proc


def _chat(proc, path, **kw):
    msgs = [{"role": "user", "content": [{"type": "video", "path": path}, {"type": "text", "text": "What?"}]}]
    return proc.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True,
                                    return_tensors="np", **kw)


def _check(row, out, spec, float32=False):
    assert row.input_ids.tolist() == out["input_ids"][0].tolist()
    assert row.mm_token_type_ids.tolist() == out["mm_token_type_ids"][0].tolist()
    assert row.video_grid_thw.tolist() == out["video_grid_thw"].tolist()
    pv = row.pixel_values_videos if float32 else u8_video_to_pixel_values(row.pixel_values_videos_u8,
                                                                         spec.for_videos().lut())
    assert np.array_equal(pv, out["pixel_values_videos"])
    if "second_per_grid_ts" in out:
        np.testing.assert_allclose(row.second_per_grid_ts, out["second_per_grid_ts"], rtol=1e-6)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_from_processor_rows_equal_the_processor_chat_path(family, sampled, tmp_path):
    """Each clip untold (Qwen2/2.5-VL: every frame; Qwen3-VL: its fps 2), with fps=2, with num_frames=8
    (Qwen2/2.5-VL; Qwen3-VL's processor raises beside its own fps) and, for Qwen3-VL, with
    cap_pixels_per_frame=True: the rows equal the processor's chat path on the file."""
    proc = _stock(family)
    spec = VisionSpec.from_processor(proc)
    calls = [{}, {"fps": 2.0}] + ([{"num_frames": 8}] if family != "qwen3_vl" else [{"cap_pixels_per_frame": True}])
    checked = 0
    for name, n, fps, extra in CLIPS:
        path = tmp_path / f"{name}.mp4"
        path.write_bytes(make_video(n, fps, 48, 64, seed=n, **extra))
        row_msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
        for kw in calls:
            if kw.get("num_frames", 0) > n:
                continue
            sampled.clear()
            out = _chat(proc, str(path), **kw)
            opts = processor_options(proc, **kw)
            row = mmpipe.encode_row({"messages": row_msgs, "videos": [str(path)]}, proc, video_options=opts)
            _check(row, out, spec)
            lay = video_layout(str(path), spec, opts, plan=processor_plan).frame_indices.tolist()
            assert lay[:len(sampled[0])] == sampled[0], (name, kw)
            checked += 1
    assert checked == len(CLIPS) * len(calls) - (1 if family != "qwen3_vl" else 0)  # num_frames=8 of 2 frames


def test_glm4v_processor_options_read_from_the_processor(sampled, tmp_path):
    """GLM-4.1V samples by its processor's rule already; ``from_processor`` also takes the processor's
    ``size`` (mmpipe's own default is the class's 112*112 .. 28*28*2*30000)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_hunt_newest_video import _glm_stock

    stock, proc0 = _glm_stock(), testing.build_processor("glm4v")
    spec = VisionSpec.from_processor(proc0)
    for name, n, fps, extra in CLIPS[:2]:
        path = tmp_path / f"{name}.mp4"
        path.write_bytes(make_video(n, fps, 48, 64, seed=n, **extra))
        out = _chat(stock, str(path))
        msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
        row = mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc0, pixels="float32",
                                video_options=processor_options(stock))
        _check(row, out, spec, float32=True)


@pytest.mark.parametrize("family,kw", [("qwen2_5_vl", {}), ("qwen2_5_vl", {"fps": 2.0}), ("qwen3_vl", {})])
def test_processor_sampled_rows_give_back_their_vllm_prompts(family, kw, tmp_path):
    """A prompt row sampled as the processor does (every frame; an odd Qwen3-VL count of 7) -> its vLLM
    prompt -> the stock processor on that prompt rebuilds the row's ids, grids, pixels, second_per_grid_ts."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_hunt_newest_video import _processor_on_prompt

    from mmpipe.rollout import to_vllm_prompts

    proc = _stock(family)
    spec = VisionSpec.from_processor(proc)
    path = tmp_path / "a.mp4"
    path.write_bytes(make_video(89, 24, 48, 64, seed=89))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    row = mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc,
                            video_options=processor_options(proc, **kw))
    out = _processor_on_prompt(proc, proc.tokenizer, to_vllm_prompts([row], proc)[0])
    assert out["input_ids"][0].tolist() == row.input_ids.tolist()
    assert out["video_grid_thw"].tolist() == row.video_grid_thw.tolist()
    assert np.array_equal(out["pixel_values_videos"],
                          u8_video_to_pixel_values(row.pixel_values_videos_u8, spec.for_videos().lut()))
    if "second_per_grid_ts" in out:
        np.testing.assert_allclose(out["second_per_grid_ts"], row.second_per_grid_ts, rtol=1e-6)
