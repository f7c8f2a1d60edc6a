"""Peak memory of a video given as a frame list (hunt): frames are decoded one at a time. The
whole list was decoded to full-size uint8 arrays before the first was resized (32 JPEG frames
of 1080p: peak RSS +387 MB measured, +286 MB decoded one at a time; 8 frames: +137 MB, +66 MB).
Counted, not timed: the decoded full-size frames alive when each frame is resized."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import mmpipe
from mmpipe.images import video
from mmpipe.testing import tiny_image

from conftest import processor_for


class Decoded(np.ndarray):
    """A decoded frame we can hold a weak reference to."""


def test_frame_list_holds_one_full_size_frame_at_a_time(monkeypatch):
    decoded, most = [], [0]
    real_rgb, real_resize = video._frame_rgb, video._resize

    def frame_rgb(value, where):
        arr = real_rgb(value, where).view(Decoded)
        decoded.append(weakref.ref(arr))
        return arr

    def resize(frame, th, tw, spec):
        most[0] = max(most[0], sum(r() is not None for r in decoded))
        return real_resize(np.asarray(frame), th, tw, spec)

    monkeypatch.setattr(video, "_frame_rgb", frame_rgb)
    monkeypatch.setattr(video, "_resize", resize)
    frames = [tiny_image(56, 84, seed=k) for k in range(6)]  # PIL frames: each decoded to an array
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}],
                             "videos": [frames]}, processor_for("qwen2_vl"))
    assert row.num_videos == 1 and len(decoded) == 6
    assert most[0] <= 2  # was 6: every frame decoded before the first resize


def _container(path) -> str:
    import av

    c = av.open(str(path), "w")
    s = c.add_stream("mpeg4", rate=30)
    s.width, s.height, s.pix_fmt = 320, 240, "yuv420p"
    base = np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    for i in range(240):  # 8 s: 16 frames sampled at 2 fps
        for p in s.encode(av.VideoFrame.from_ndarray(np.roll(base, 3 * i, 1), format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    return str(path)


@pytest.mark.parametrize("source", ["file", "frames"])
def test_sampled_frames_are_resized_into_one_array(tmp_path, source):
    """The resized frames go straight into the array that is patchified: at the peak two copies of
    the output (that array and the patches), where a list of resized frames, its np.stack and the
    patches made three (tracemalloc: 3.01x the output before, 2.01x now, for the file)."""
    import gc
    import tracemalloc

    proc = processor_for("qwen2_vl")
    video = _container(tmp_path / "v.mp4") if source == "file" else [
        tiny_image(240, 320, seed=k) for k in range(16)]
    row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}],
           "videos": [video]}
    mmpipe.encode_row(row, proc)  # first-use work (tables, templates) out of the measurement
    gc.collect()
    tracemalloc.start()
    try:
        out = mmpipe.encode_row(row, proc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = out.pixel_values_videos_u8.nbytes
    assert out.video_grid_thw.tolist()[0][0] == 8 and size > 4 << 20
    assert peak < 2.5 * size  # was 3x: list + stack + patches
