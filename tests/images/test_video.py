"""mmpipe.images.video: sampling against qwen-vl-utils' own code, pixels against transformers.

Oracles:
- frame counts, sizes and pixel budgets: qwen-vl-utils 0.0.14's ``vision_process.py`` (the
  published Qwen rule), its functions executed from the registry wheel (it imports torchvision
  at module top, which the main environment must not have, so the functions are taken out of
  the file with ``ast`` and run as written);
- pixel values: the torchvision rule, since transformers' Qwen video processors exist only as
  torchvision implementations (whatever the image backend, `VisionSpec.for_videos`). The
  stock video processor needs torchvision, which the main environment must not have, so the
  oracle here is mmpipe's torchvision-backend image path on the same sampled frames with the
  video's bounds (`helpers.image_processor_video`); that path equals transformers'
  torchvision image processor, and mmpipe's videos the stock video processors, bit for bit in
  the vLLM env (tests/images/test_backends.py, tests/rollout/test_video_pixel_oracle.py). Per
  frame the video processor runs the same resize, rescale and normalise as the image
  processor; its patch layout puts the T frames of a temporal patch where the image
  processor puts the T copies of a still image, so frame pairs are assembled from per-frame output.
Test videos are made here with PyAV (h264, else mpeg4).
"""

from __future__ import annotations

import ast
import glob
import io
import logging
import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from mmpipe.errors import VideoError
from mmpipe.images import video as V
from mmpipe.images.video_container import Container
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, encode_video, frame_bounds, sample_count, sample_indices, video_layout

from helpers import all_frames, image_processor_video, make_video

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".envs-cache" / "qwen-vl-utils"
SMALL = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)


# ---------------------------------------------------------------- qwen-vl-utils, run as written
def _qwen_vl_utils_source() -> str:
    wheels = glob.glob(str(CACHE / "qwen_vl_utils-0.0.14-*.whl"))
    if not wheels:
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "qwen-vl-utils==0.0.14",
                            "-d", str(CACHE)], capture_output=True, text=True)
        wheels = glob.glob(str(CACHE / "qwen_vl_utils-0.0.14-*.whl"))
        assert wheels, f"cannot download qwen-vl-utils==0.0.14 (the sampling oracle): {r.stderr[-500:]}"
    import zipfile

    with zipfile.ZipFile(wheels[0]) as z:
        return z.read("qwen_vl_utils/vision_process.py").decode()


@pytest.fixture(scope="module")
def qvu():
    """qwen-vl-utils' constants and pure functions, executed from its file."""
    src = _qwen_vl_utils_source()
    tree = ast.parse(src)
    keep = {"round_by_factor", "ceil_by_factor", "floor_by_factor", "smart_resize", "smart_nframes"}
    body = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in keep)
            or (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))]
    from typing import Any, Dict, Optional, Tuple, Union

    ns = dict(math=math, os=os, logger=logging.getLogger("qvu"), Optional=Optional, Tuple=Tuple, Dict=Dict,
              Any=Any, Union=Union)
    for node in body:  # constants that name reader functions (VIDEO_READER_BACKENDS) are left out
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), "vision_process.py", "exec"), ns)
        except NameError:
            assert isinstance(node, ast.Assign)
    fetch = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fetch_video")
    lines = ast.get_source_segment(src, fetch).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("min_pixels = ele.get"))
    end = next(i for i, ln in enumerate(lines) if ln.strip() == "max_pixels = min(max_pixels_supposed, max_pixels)")
    ns["bounds_src"] = "\n".join(ln.strip() for ln in lines[start:end + 1] if not ln.strip().startswith(("if ", "logger")))
    ns["src"] = src
    return ns


def qvu_bounds(qvu, ele: dict, nframes: int, factor: int) -> tuple:
    env = dict(qvu, ele=ele, nframes=nframes, VIDEO_FRAME_MIN_PIXELS=qvu["VIDEO_MIN_TOKEN_NUM"] * factor**2,
               VIDEO_FRAME_MAX_PIXELS=qvu["VIDEO_MAX_TOKEN_NUM"] * factor**2, image_factor=factor)
    exec(qvu["bounds_src"], env)
    return env["min_pixels"], env["max_pixels"]


def ele_of(opts: VideoOptions) -> dict:
    keys = ("fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels")
    return {k: getattr(opts, k) for k in keys if getattr(opts, k) is not None}


@pytest.mark.parametrize("total,fps", [(1, 30), (3, 30), (7, 24), (30, 10), (31, 29.97), (250, 25.0),
                                       (1000, 30), (6000, 60), (100, 0.5)])
@pytest.mark.parametrize("opts", [VideoOptions(), VideoOptions(fps=1.0, min_frames=3, max_frames=9),
                                  VideoOptions(nframes=5), VideoOptions(nframes=2), VideoOptions(fps=4.0)])
def test_sample_count_and_bounds_match_qwen_vl_utils(qvu, total, fps, opts):
    try:
        want = qvu["smart_nframes"](ele_of(opts), total_frames=total, video_fps=fps)
    except ValueError:
        with pytest.raises(VideoError, match="cannot sample"):
            sample_count(total, fps, opts)
        return
    n = sample_count(total, fps, opts)
    assert n == want
    # which frames: the rule every qwen-vl-utils reader uses
    assert src_has(qvu, "torch.linspace(0, total_frames - 1, nframes).round().long()")
    assert sample_indices(total, n).tolist() == torch.linspace(0, total - 1, want).round().long().tolist()
    for family in ("qwen2_vl", "qwen3_vl"):
        spec = VisionSpec.from_family(_fam(family))
        assert frame_bounds(n, spec, opts) == qvu_bounds(qvu, ele_of(opts), n, spec.factor)


def _fam(name):
    from mmpipe.families import get_family

    return get_family(name)


def src_has(qvu, text: str) -> bool:
    return text in qvu["src"]


# ---------------------------------------------------------------- test videos
CASES = [(9, 10.0, 48, 64, VideoOptions(**SMALL)), (40, 25.0, 56, 40, VideoOptions(fps=1.0, **SMALL)),
         (31, 29.97, 30, 90, VideoOptions(nframes=7, **SMALL)), (12, 2.0, 64, 64, VideoOptions(max_frames=4, **SMALL))]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_video_pixels_equal_image_processor_on_sampled_frames(qvu, family, case):
    n, fps, h, w, opts = CASES[case]
    data = make_video(n, fps, h, w, seed=case)
    spec = VisionSpec.from_family(_fam(family))
    got = encode_video(data, spec, opts)
    frames = all_frames(data)
    total = len(frames)
    k = qvu["smart_nframes"](ele_of(opts), total_frames=total, video_fps=fps)
    idx = torch.linspace(0, total - 1, k).round().long().tolist()
    idx += [idx[-1]] * (-k % spec.temporal_patch_size)
    assert got.frame_indices.tolist() == idx
    min_px, max_px = frame_bounds(k, spec, opts)
    assert qvu["smart_resize"](h, w, spec.factor, min_px, max_px) == got.size
    ref, grid = image_processor_video(family, [frames[i] for i in idx], min_px, max_px)
    assert list(got.grid) == grid
    pv = u8_video_to_pixel_values(got.patches, spec.for_videos().lut())
    assert pv.dtype == np.float32 and np.array_equal(pv, ref)
    sample_fps = k / total * fps
    assert got.second_per_grid_ts == spec.temporal_patch_size / sample_fps
    lay = video_layout(data, spec, opts)
    assert lay.grid == got.grid and lay.frame_indices.tolist() == idx and lay.patches is None
    assert lay.second_per_grid_ts == got.second_per_grid_ts


def test_frame_list_uses_every_frame_and_pads_to_frame_factor():
    from PIL import Image

    data = make_video(5, 10.0, 40, 52, seed=3)
    frames = all_frames(data)
    spec = VisionSpec.from_family(_fam("qwen2_5_vl"))
    opts = VideoOptions(frames_fps=4.0, **SMALL)
    got = encode_video([Image.fromarray(f) for f in frames[:3]] + frames[3:], spec, opts)
    assert got.frame_indices.tolist() == [0, 1, 2, 3, 4, 4]
    min_px, max_px = frame_bounds(6, spec, opts)
    ref, grid = image_processor_video("qwen2_5_vl", frames + [frames[-1]], min_px, max_px)
    assert list(got.grid) == grid and np.array_equal(u8_video_to_pixel_values(got.patches, spec.for_videos().lut()), ref)
    assert got.second_per_grid_ts == 2 / 4.0
    assert video_layout(frames, spec, opts).grid == got.grid


def test_videos_follow_the_torchvision_rule_whatever_the_image_backend():
    """Videos: torchvision's resize and table for both image backends (images differ)."""
    data = make_video(6, 6.0, 50, 70, seed=5)
    pil, tv = (VisionSpec.from_family(_fam("qwen2_vl"), backend=b) for b in ("pil", "torchvision"))
    assert pil.for_videos() == tv and pil.for_videos() is pil.for_videos() and tv.for_videos() is tv
    assert not np.array_equal(pil.lut(), tv.lut()) and pil.for_videos().lut() is tv.lut()
    with pytest.raises(ValueError):
        tv.lut()[0, 0] = 0.0  # the cached table is shared: read-only
    a, b = encode_video(data, pil, VideoOptions(**SMALL)), encode_video(data, tv, VideoOptions(**SMALL))
    assert np.array_equal(a.patches, b.patches) and a.grid == b.grid


@pytest.mark.parametrize("fmt, first_frames", [("mp4", 0), ("matroska", 1)])
def test_layout_decodes_the_first_frame_only(monkeypatch, fmt, first_frames):
    """The layout reads the header and, where the container's header does not give the display
    rotation (PyAV shows it on decoded frames only; an MP4's is read from its boxes), the first
    frame, never the frames it samples."""
    data = make_video(20, 10.0, 48, 64, fmt=fmt)
    spec = VisionSpec.from_family(_fam("qwen2_vl"))
    full = encode_video(data, spec, VideoOptions(**SMALL))
    decoded = []
    next_frame = Container._next_frame

    def counted(self):
        frame = next_frame(self)
        decoded.append(frame)
        return frame

    def no_decode(self):
        raise AssertionError("video_layout decoded the sampled frames")

    monkeypatch.setattr(Container, "frames", no_decode)
    monkeypatch.setattr(Container, "_next_frame", counted)
    lay = video_layout(data, spec, VideoOptions(**SMALL))
    assert lay.grid == full.grid and lay.size == full.size
    assert len(decoded) == first_frames


def test_path_and_datasets_dict_inputs(tmp_path):
    data = make_video(8, 8.0, 32, 32)
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    spec = VisionSpec.from_family(_fam("qwen2_vl"))
    a = encode_video(str(path), spec, VideoOptions(**SMALL))
    b = encode_video({"path": None, "bytes": data}, spec, VideoOptions(**SMALL))
    c = encode_video({"path": f"file://{path}", "bytes": None}, spec, VideoOptions(**SMALL))
    assert np.array_equal(a.patches, b.patches) and np.array_equal(a.patches, c.patches)


def test_memory_bounded_on_long_low_res_video():
    """10 minutes at 5 fps, 64x48: the whole clip decoded would be 3000 x 9 KB = 27.6 MB of
    RGB; sampling 8 frames while decoding keeps the peak of Python-tracked allocations (numpy
    arrays included) under 2 MB."""
    data = make_video(3000, 5.0, 48, 64)
    spec = VisionSpec.from_family(_fam("qwen2_vl"))
    opts = VideoOptions(max_frames=8, **SMALL)
    tracemalloc.start()
    try:
        got = encode_video(data, spec, opts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.frame_indices.tolist() == torch.linspace(0, 2999, 8).round().long().tolist()
    assert peak < 2 * 2**20, peak


# ---------------------------------------------------------------- bad videos
def test_bad_videos_raise_typed_errors(tmp_path, monkeypatch):
    spec = VisionSpec.from_family(_fam("qwen2_vl"))
    good = make_video(10, 10.0, 32, 32)
    cases = {
        "corrupt container": b"\x00\x00\x00\x18ftypmp42" + os.urandom(2000),
        "random bytes": os.urandom(4096),
        "truncated": good[: len(good) // 3],
        "empty bytes": b"",
        "missing path": str(tmp_path / "nope.mp4"),
        "directory": str(tmp_path),
        "url": "https://example.com/v.mp4",
        "no frames": [],
    }
    for name, value in cases.items():
        with pytest.raises(VideoError) as e:
            encode_video(value, spec, VideoOptions(**SMALL), where=f"row 3, video 0 ({name})")
        assert e.value.stage == "image" and "row 3, video 0" in str(e.value), name
    # zero frames: a container with a video stream and no packets
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.height, s.width, s.pix_fmt = 32, 32, "yuv420p"
    with pytest.raises(VideoError, match="no frames|cannot be opened|no video stream"):
        encode_video(buf.getvalue(), spec, VideoOptions(**SMALL))
    # unreadable codec: the h264/mpeg4 sample entry renamed to a fourcc no decoder knows
    for tag in (b"avc1", b"mp4v"):
        if tag in good:
            bad = good.replace(tag, b"zzzz")
            with pytest.raises(VideoError, match="decoder|codec|cannot be"):
                encode_video(bad, spec, VideoOptions(**SMALL))
    # too short for the requested frame count
    with pytest.raises(VideoError, match="cannot sample"):
        encode_video(good, spec, VideoOptions(nframes=20, **SMALL))
    # huge dimensions (the limit lowered so the test video is "huge")
    monkeypatch.setattr(V, "MAX_FRAME_PIXELS", 500)
    with pytest.raises(VideoError, match="too large"):
        encode_video(good, spec, VideoOptions(**SMALL))
    with pytest.raises(VideoError, match="too large"):
        video_layout(good, spec, VideoOptions(**SMALL))
