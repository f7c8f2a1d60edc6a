"""Peak memory of a video given as a frame list (hunt): frames are decoded one at a time. The
whole list was decoded to full-size uint8 arrays before the first was resized (32 JPEG frames
of 1080p: peak RSS +387 MB measured, +286 MB decoded one at a time; 8 frames: +137 MB, +66 MB).
Counted, not timed: the decoded full-size frames alive when each frame is resized."""

from __future__ import annotations

import weakref

import numpy as np

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
