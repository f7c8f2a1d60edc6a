"""`mmpipe.images.video_processor_plan.processor_options` on a video processor without a per-frame pixel
cap (transformers 4.57's Qwen2VLVideoProcessor / Qwen3VLVideoProcessor, GLM's video processors): their
chat path ignores ``cap_pixels_per_frame`` / ``max_video_tokens`` (checked on 4.57's stock Qwen2-VL: a
64-frame-token cap gives grid (3, 6, 10) from the processor, (3, 2, 4) from the capped rows), so asking
for the cap is refused; a video processor that has it (5.x's Qwen ones) keeps it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmpipe.errors import ArgumentError
from mmpipe.images.video_processor_plan import processor_options

SIZE = {"shortest_edge": 3136, "longest_edge": 12845056}


def _vp(**extra):
    return SimpleNamespace(fps=None, num_frames=None, min_frames=4, max_frames=768, do_sample_frames=False,
                           size=SIZE, **extra)


def test_the_cap_is_refused_where_the_video_processor_has_none():
    """Before: rows capped to max_video_tokens where the processor's outputs are not (DID NOT RAISE)."""
    with pytest.raises(ArgumentError, match="no per-frame pixel cap.*leave cap_pixels_per_frame unset"):
        processor_options(SimpleNamespace(video_processor=_vp()), cap_pixels_per_frame=True, max_video_tokens=8)
    opts = processor_options(SimpleNamespace(video_processor=_vp()), fps=2.0)  # no cap asked: as before
    assert opts.cap_pixels_per_frame is None and opts.fps == 2.0


def test_the_cap_is_kept_where_the_video_processor_has_it():
    vp = _vp(cap_pixels_per_frame=None, max_video_tokens=128000)
    opts = processor_options(SimpleNamespace(video_processor=vp), cap_pixels_per_frame=True, max_video_tokens=8)
    assert (opts.cap_pixels_per_frame, opts.max_video_tokens) == (True, 8)
    vp.cap_pixels_per_frame = True  # the checkpoint's own setting, read from the processor
    assert processor_options(SimpleNamespace(video_processor=vp)).cap_pixels_per_frame is True
