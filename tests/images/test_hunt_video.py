"""Video edge cases found by a defect hunt: options a row's JSON carries as strings, booleans or
infinities, and frame lists of mixed sizes on the layout-only path (``pixels="none"``).

Oracles: `mmpipe.images.video.encode_video` on the same frames (layout-only must refuse what the
full path refuses); qwen-vl-utils' options are numbers, and a rate must be finite for
``second_per_grid_ts = T / sample_fps`` and the frame times to mean anything."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmpipe.encoding.videos import resolve_video, video_options
from mmpipe.errors import ArgumentError, VideoError
from mmpipe.families import get_family
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, encode_video, video_layout

SPEC = VisionSpec.from_family(get_family("qwen2_5_vl"))
SMALL = VideoOptions(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)


def _frames(n: int, h: int = 56, w: int = 64) -> list[np.ndarray]:
    return list(np.random.default_rng(n).integers(0, 256, (n, h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("item", [{"max_frames": "4"}, {"min_pixels": "3136"}, {"nframes": "4"},
                                  {"total_pixels": [1]}, {"nframes": True}, {"fps": float("inf")}])
def test_bad_per_video_option_values_are_the_rows_video_errors(item):
    # before: max_frames "4" and min_pixels "3136" were bare TypeErrors in sampling / sizing,
    # nframes True sampled round(1/2)*2 = 0 frames
    with pytest.raises(VideoError, match="must be a finite number") as e:
        resolve_video({"video": b"unused", **item}, SMALL, "row 3, video 0")
    assert "row 3" in str(e.value)


@pytest.mark.parametrize("fps", [float("inf"), np.float64("inf")])
def test_infinite_frame_rate_is_refused_not_zero_seconds(fps):
    # before: a frame list at fps=inf encoded with second_per_grid_ts 0.0 and every time 0.0
    with pytest.raises(VideoError, match="finite"):
        resolve_video({"frames": _frames(4), "fps": fps}, SMALL, "row 0")
    with pytest.raises(ArgumentError, match="finite"):
        video_options({"frames_fps": fps})
    with pytest.raises(ArgumentError, match="finite"):
        VideoOptions(fps=fps)


def test_numpy_numbers_are_still_options():
    opts = video_options({"fps": np.float32(1.0), "max_frames": np.int64(8), "min_pixels": np.int64(28 * 28 * 2)})
    out = encode_video(_frames(3), SPEC, opts)
    assert out.grid[0] == 2 and out.second_per_grid_ts == 1.0


@pytest.mark.parametrize("pil", [False, True])
def test_layout_refuses_mixed_frame_sizes_as_the_encode_does(pil):
    frames = _frames(3) + _frames(1, 60, 64)
    if pil:
        frames = [Image.fromarray(f) for f in frames]
    with pytest.raises(VideoError, match="differ in size"):
        encode_video(frames, SPEC, SMALL)
    with pytest.raises(VideoError, match="differ in size"):  # before: the first frame's grid, silently
        video_layout(frames, SPEC, SMALL)


def test_layout_of_a_one_size_list_equals_the_encode():
    frames = _frames(3)
    full, lay = encode_video(frames, SPEC, SMALL), video_layout(frames, SPEC, SMALL)
    assert (full.grid, full.size, full.second_per_grid_ts, full.timestamps) == \
        (lay.grid, lay.size, lay.second_per_grid_ts, lay.timestamps)
    assert full.frame_indices.tolist() == lay.frame_indices.tolist() == [0, 1, 2, 2]
