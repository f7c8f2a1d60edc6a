"""Video frame sampling as users compare it: ``VideoOptions(sampling="processor")`` against the
family's transformers video processor (``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor``
``sample_frames`` and ``resize``), and the default (qwen-vl-utils' ``fetch_video``) left as it was.

The main environment has no torchvision, so the video processor classes cannot be imported here:
the oracles are the values those classes give in transformers 5.25 (measured in the vision
environment, where tests/encoding/test_hunt_video_sampling_stock.py checks the processor's own
chat path live, pixels included):

- ``Qwen2VLVideoProcessor().sample_frames(VideoMetadata(total, fps), fps=2.0 / num_frames=8)``;
- ``Qwen3VLVideoProcessor(patch_size=16).sample_frames(VideoMetadata(total, fps))`` (fps 2 by
  default; ``num_frames=5`` with the class's fps set to None: with fps=2 beside it the class raises);
- both classes' default ``size`` on all-zero clips: ``video_grid_thw``.

Found: before, mmpipe had no way to sample as the processor does; its Qwen rule differs from the
processor's chat path in which frames (qwen-vl-utils rounds a linspace, Qwen2VLVideoProcessor
truncates an arange: [0, 18, 35, 53, 70, 88] vs [0, 14, 29, 44, 59, 74] for 89 frames at 24 fps),
how many (Qwen2/2.5-VL's processor takes EVERY frame unless told fps / num_frames; Qwen3-VL's does
not round the count to even: 7 vs 6) and how large (Qwen3-VL bounds the whole clip).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError, VideoError
from mmpipe.families import get_family
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, sampled_frames, video_layout
from mmpipe.images.video_processor_plan import processor_indices, processor_options, processor_plan, processor_size

from helpers import make_video

av = pytest.importorskip("av", reason="PyAV is a test extra")
Q2, Q3 = VisionSpec.from_family(get_family("qwen2_5_vl")), VisionSpec.from_family(get_family("qwen3_vl"))
P = VideoOptions(sampling="processor")

# (total, fps) -> the classes' sample_frames, transformers 5.25
SAMPLED = {
    (360, 30.0): {"q2 fps2": list(range(0, 360, 15)), "q2 n8": [0, 45, 90, 135, 180, 225, 270, 315],
                  "q3": [0, 16, 31, 47, 62, 78, 94, 109, 125, 140, 156, 172, 187, 203, 219, 234, 250, 265, 281, 297,
                         312, 328, 343, 359], "q3 n5": [0, 90, 180, 269, 359]},
    (89, 24.0): {"q2 fps2": [0, 14, 29, 44, 59, 74], "q2 n8": [0, 11, 22, 33, 44, 55, 66, 77],
                 "q3": [0, 15, 29, 44, 59, 73, 88], "q3 n5": [0, 22, 44, 66, 88]},
    (30, 30.0): {"q2 fps2": [0, 7, 15, 22], "q2 n8": [0, 3, 7, 11, 15, 18, 22, 26], "q3": [0, 10, 19, 29],
                 "q3 n5": [0, 7, 14, 22, 29]},
    (2, 2.0): {"q2 fps2": [0, 1], "q2 n8": None, "q3": [0, 1], "q3 n5": [0, 0, 0, 1, 1]},
    (300, 29.97): {"q2 fps2": list(range(0, 300, 15)), "q2 n8": [0, 37, 75, 112, 150, 187, 225, 262],
                   "q3": [0, 16, 31, 47, 63, 79, 94, 110, 126, 142, 157, 173, 189, 205, 220, 236, 252, 268, 283, 299],
                   "q3 n5": [0, 75, 150, 224, 299]},
    (7, 3.0): {"q2 fps2": [0, 1, 3, 5], "q2 n8": None, "q3": [0, 2, 4, 6], "q3 n5": [0, 2, 3, 4, 6]},
}
# (n, h, w) -> video_grid_thw of the classes with their default size (Qwen2: per frame, Qwen3: whole clip)
GRIDS = {"q2": {(24, 48, 64): (12, 20, 28), (7, 480, 640): (4, 34, 46), (2, 33, 130): (1, 12, 46),
                (40, 720, 1280): (20, 40, 72)},
         "q3": {(24, 48, 64): (12, 4, 6), (7, 480, 640): (4, 18, 24), (2, 33, 130): (1, 10, 32),
                (40, 720, 1280): (20, 6, 10)}}


def _layout(total, fps, spec, opts):
    return processor_indices(total, fps, opts, spec).tolist()


@pytest.mark.parametrize("meta", sorted(SAMPLED))
def test_processor_sampling_picks_the_video_processors_frames(meta):
    """sampling="processor" == the classes' sample_frames: Qwen2/2.5-VL by fps and num_frames (the
    chat path's fps= / num_frames=), every frame without them; Qwen3-VL at its fps 2, and num_frames."""
    total, fps = meta
    want = SAMPLED[meta]
    assert _layout(total, fps, Q2, VideoOptions(sampling="processor", fps=2.0)) == want["q2 fps2"]
    assert _layout(total, fps, Q2, P) == list(range(total))  # do_sample_frames=False: the class default
    if want["q2 n8"] is None:
        with pytest.raises(VideoError, match="cannot sample 8 frames"):
            _layout(total, fps, Q2, VideoOptions(sampling="processor", nframes=8))
    else:
        assert _layout(total, fps, Q2, VideoOptions(sampling="processor", nframes=8)) == want["q2 n8"]
    assert _layout(total, fps, Q3, P) == want["q3"]
    assert _layout(total, fps, Q3, VideoOptions(sampling="processor", nframes=5)) == want["q3 n5"]
    assert _layout(total, fps, Q3, VideoOptions(sampling="processor", do_sample_frames=False)) == list(range(total))


@pytest.mark.parametrize("rule,spec", [("q2", Q2), ("q3", Q3)])
def test_processor_sizing_equals_the_video_processors_grids(rule, spec):
    """The class-default ``size`` of each video processor: per frame (Qwen2/2.5-VL) or over the
    whole clip (Qwen3-VL), a 7-frame clip's last frame repeated into the 4th temporal patch."""
    for (n, h, w), grid in GRIDS[rule].items():
        th, tw = processor_size(n, h, w, spec, P)
        assert (-(-n // 2), th // spec.patch_size, tw // spec.patch_size) == grid


def _clip(path, n, fps, h=48, w=64):
    path.write_bytes(make_video(n, fps, h, w, seed=n))
    return str(path)


def _times(proc, ids) -> list[str]:
    return re.findall(r"<([0-9.]+) seconds>", proc.tokenizer.decode(ids))


def test_encode_row_samples_a_file_as_the_processor_chat_path(tmp_path):
    """A 3.7 s clip at 24 fps: Qwen2.5-VL told fps=2 takes frames [0, 14, 29, 44, 59, 74] (qwen-vl-utils:
    [0, 18, 35, 53, 70, 88]), second_per_grid_ts 2 / (6 / 89 * 24); untold, every one of the 89 frames;
    Qwen3-VL 7 frames at its fps 2 (qwen-vl-utils: 6), the 4 frame groups' times in the text."""
    clip = _clip(tmp_path / "a.mp4", 89, 24)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    row = {"messages": msgs, "videos": [clip]}
    proc = testing.build_processor("qwen2_5_vl")
    told = mmpipe.encode_row(row, proc, video_options={"sampling": "processor", "fps": 2.0})
    assert told.video_grid_thw.tolist() == [[3, 20, 28]]
    np.testing.assert_allclose(told.second_per_grid_ts, [2 / (6 / 89 * 24)], rtol=1e-6)
    lay = video_layout(clip, Q2, VideoOptions(sampling="processor", fps=2.0), plan=processor_plan)
    assert lay.frame_indices.tolist() == [0, 14, 29, 44, 59, 74]
    every = mmpipe.encode_row(row, proc, video_options={"sampling": "processor"}, pixels="none")
    assert every.video_grid_thw.tolist() == [[45, 20, 28]]  # 89 frames, the last repeated
    np.testing.assert_allclose(every.second_per_grid_ts, [2 / 24], rtol=1e-6)
    # a video item's own fps turns sampling on, as the chat path's fps= does
    inline = {"messages": [{"role": "user", "content": [{"type": "video", "video": clip, "fps": 2.0}]}]}
    assert mmpipe.encode_row(inline, proc, video_options={"sampling": "processor"},
                             pixels="none").video_grid_thw.tolist() == [[3, 20, 28]]

    proc3 = testing.build_processor("qwen3_vl")
    r3 = mmpipe.encode_row(row, proc3, video_options={"sampling": "processor"})
    assert r3.video_grid_thw.tolist() == [[4, 8, 10]]  # 7 frames; the whole clip at least 128 tokens' worth
    # groups (0, 15), (29, 44), (59, 73), (88, 88) at 24 fps
    assert _times(proc3, r3.input_ids.tolist()) == ["0.3", "1.5", "2.8", "3.7"]
    assert r3.pixel_values_videos_u8.shape[0] == 4 * 8 * 10


def test_default_sampling_is_still_qwen_vl_utils(tmp_path):
    """Guard: without sampling the rows keep qwen-vl-utils' frames, counts and sizes (verl / vLLM rows)."""
    clip = _clip(tmp_path / "b.mp4", 89, 24)
    assert video_layout(clip, Q2).frame_indices.tolist() == [0, 18, 35, 53, 70, 88]
    lay3 = video_layout(clip, Q3)
    assert lay3.frame_indices.tolist() == [0, 18, 35, 53, 70, 88] and lay3.grid == (3, 20, 28)


def test_one_frame_file_every_frame_as_the_qwen2_processor(tmp_path):
    """A 1-frame file: qwen-vl-utils' rule refuses it (2 frames at least); Qwen2/2.5-VL's processor
    takes its one frame (repeated into the temporal patch); Qwen3-VL's raises (t:1 < 2)."""
    clip = _clip(tmp_path / "c.mp4", 1, 24)
    with pytest.raises(VideoError, match="cannot sample 2 frames"):
        video_layout(clip, Q2)
    lay = video_layout(clip, Q2, P, plan=processor_plan)
    assert lay.frame_indices.tolist() == [0, 0] and lay.grid[0] == 1
    with pytest.raises(VideoError, match="at least 2 frames"):
        video_layout(clip, Q3, P, plan=processor_plan)


def _owner(**kw):
    base = dict(fps=2, num_frames=None, min_frames=4, max_frames=64, do_sample_frames=True, cap_pixels_per_frame=None,
                max_video_tokens=768, size={"shortest_edge": 4096, "longest_edge": 25165824})
    return SimpleNamespace(video_processor=SimpleNamespace(**{**base, **kw}))


def test_from_processor_reads_the_video_processor():
    """fps / num_frames / min-max frames / do_sample_frames / size / pixel cap come from the processor's
    video processor; fps= / num_frames= as the chat path takes them (turning sampling on)."""
    o = processor_options(_owner())
    assert (o.sampling, o.fps, o.nframes, o.max_frames, o.min_pixels, o.max_pixels, o.do_sample_frames) == \
        ("processor", 2.0, None, 64, 4096, 25165824, True)
    assert (processor_options(_owner(), num_frames=8).nframes, processor_options(
        _owner(), num_frames=8).fps) == (8, None)
    q2 = _owner(fps=None, do_sample_frames=False, size={"shortest_edge": 3136, "longest_edge": 12845056})
    o2 = processor_options(q2)
    assert (o2.fps, o2.nframes, o2.do_sample_frames) == (None, None, False)
    assert processor_options(q2, fps=1.0).do_sample_frames is True
    assert processor_options(SimpleNamespace(video_processor=None)) == P  # no video processor: classes'


def test_encoder_reads_the_processor_for_sampling_processor(tmp_path):
    """video_options={"sampling": "processor"}: the encoder fills what the options leave from its
    processor's video processor (here one that samples at 1 fps within 4..8 tokens' worth a frame)."""
    clip = _clip(tmp_path / "d.mp4", 89, 24)
    proc = testing.build_processor("qwen2_5_vl")
    vp = _owner(fps=1.0, do_sample_frames=True, size={"shortest_edge": 4 * 784, "longest_edge": 8 * 784})
    proc.video_processor = vp.video_processor  # the main environment's processor has none (no torchvision)
    try:
        row = {"messages": [{"role": "user", "content": [{"type": "video"}]}], "videos": [clip]}
        got = mmpipe.encode_row(row, proc, video_options={"sampling": "processor"}, pixels="none")
        same = mmpipe.encode_row(row, proc, video_options=processor_options(proc), pixels="none")
    finally:
        proc.video_processor = None
    assert got.video_grid_thw.tolist() == same.video_grid_thw.tolist() == [[2, 4, 4]]  # 4 frames at 1 fps, 56x56


@pytest.mark.parametrize("kw", [dict(do_sample_frames=True), dict(max_video_tokens=10),
                                dict(sampling="processor", total_pixels=1e6), dict(sampling="torchcodec"),
                                dict(sampling="processor", do_sample_frames="yes")])
def test_options_of_the_other_rule_are_refused(kw):
    """Options of one rule given with the other are refused, not ignored."""
    with pytest.raises(ArgumentError):
        VideoOptions(**kw)


def test_sampled_frames_refuses_processor_sampling(tmp_path):
    """The generic (Omni) path samples by qwen-vl-utils' rule and tells the processor the fps."""
    with pytest.raises(ArgumentError, match="sampling"):
        sampled_frames(_clip(tmp_path / "e.mp4", 8, 4), P)
