"""`mmpipe.encoding.videos.video_row_bytes` (the video part of `map_kwargs`' row bound) under
``sampling="processor"``: Qwen2/2.5-VL's video processor without ``fps`` keeps EVERY frame, so no
option bounds a row's bytes; the bound assumed qwen-vl-utils' ``max_frames`` frames. Measured
before the fix (not in this test: 1,200 frames): a 40 s 30 fps 448x448 clip stored 722.5 MB
against a 541.9 MB bound; with ``max_pixels=48*784`` the row held 101.6 MB, the bound said
86.7 MB, and ``map_kwargs`` put 3 rows (305 MB) in a writer batch of 256 MiB."""

from __future__ import annotations

import os
import tempfile

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.encoding.videos import video_row_bytes
from mmpipe.images.video import VideoOptions
from mmpipe.testing import build_processor

av = pytest.importorskip("av")


def _clip(n: int, side: int) -> str:
    fd, path = tempfile.mkstemp(suffix=".mp4")
    os.close(fd)
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(path, "w") as c:
        s = c.add_stream(codec, rate=8)
        s.width = s.height = side
        s.pix_fmt = "yuv420p"
        base = np.random.default_rng(0).integers(0, 255, (side, side, 3), np.uint8)
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(np.roll(base, i, 1), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def test_every_frame_sampling_is_not_bounded_by_max_frames():
    proc = build_processor("qwen2_5_vl")
    opts = VideoOptions(sampling="processor", max_frames=8)
    path = _clip(20, 784)
    try:
        row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}],
               "videos": [path]}
        lay = mmpipe.encode_row(row, proc, pixels="none", video_options=opts)
        t, h, w = (int(x) for x in lay.video_grid_thw[0])
        stored = t * h * w * 3 * 2 * 14 * 14  # uint8 patch rows of the 20 frames (T=2, patch 14)
        assert t == 10  # every frame (20) kept, not max_frames
        ds = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "q"}]], "videos": [[path]]})
        enc = mmpipe.Encoder(proc, video_options=opts)
        assert video_row_bytes(enc, ds) >= stored, (video_row_bytes(enc, ds), stored)
        assert mmpipe.map_kwargs(proc, ds, video_options=opts)["writer_batch_size"] == 1
        sampled = mmpipe.Encoder(proc, video_options=VideoOptions(max_frames=8))  # qwen-vl-utils: bounded
        assert video_row_bytes(sampled, ds) < 10**9
    finally:
        os.remove(path)
