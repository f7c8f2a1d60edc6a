"""Real video files and frame lists as users bring them, through `mmpipe.images.video`.

Files are made here with PyAV in the forms users have: H.264 in mp4 and mkv, MPEG-4 Part 2 in
avi, MJPEG in mkv, VP9 in webm, an audio track before the video, variable frame rate (pts gaps),
portrait phone clips (landscape frames plus a display matrix), 2- and 3-frame clips, damaged files.

Oracles:
- which frames: qwen-vl-utils' rule (``round(linspace(0, total - 1, n))``, `sample_count`) on the
  frames PyAV decodes from the file (`helpers.all_frames`), the count the decoder gives;
- pixels: mmpipe's frame-list path on exactly those decoded frames (a frame list is used whole and
  resized with the same per-frame bounds for the same frame count), checked bit for bit against
  the real video processors in tests/rollout/test_video_pixel_oracle.py;
- orientation: the display matrix as PyAV reports it (``frame.rotation``, degrees counter-clockwise),
  applied in quarter turns as FFmpeg's CLI and torchcodec >= 0.11 (what transformers' processor
  chat path and qwen-vl-utils decode with) apply it: ``np.rot90(frame, rotation // 90)``;
- frame conversion: transformers' ``video_utils.convert_to_rgb`` and qwen-vl-utils' ``to_rgb``
  composite transparent frames onto white.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError, VideoError
from mmpipe.families import get_family
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import (VideoOptions, encode_video, sample_count, sample_indices, sampled_frames,
                                 video_layout)

from helpers import all_frames, make_video

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
SMALL = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)
SPEC = VisionSpec.from_family(get_family("qwen2_5_vl"))


def _frame(i: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    a = np.roll(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), i * 3, axis=1)
    a[: h // 3, : w // 4] = 250  # a bright block in the top-left corner: shows the orientation
    return a


def write_video(n: int, fps, h: int, w: int, *, codec: str = "libx264", **kwargs) -> bytes:
    """n of the frames above, encoded (`helpers.make_video`: ``fmt``, ``pix``, ``rotation``, ``pts``,
    ``audio``, ``movflags``, ``gop``)."""
    return make_video(n, fps, h, w, codec=codec, frame=lambda i: _frame(i, h, w), **kwargs)


def _coded_rotation(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return next(c.decode(video=0)).rotation


def _expected(data: bytes, opts: VideoOptions, quarter_turns: int = 0):
    """(frame indices, the frame-list encoding of the decoded frames at those indices, upright)."""
    frames = [np.ascontiguousarray(np.rot90(f, quarter_turns)) for f in all_frames(data)]
    with av.open(io.BytesIO(data)) as c:
        fps = float(c.streams.video[0].average_rate)
    idx = sample_indices(len(frames), sample_count(len(frames), fps, opts)).tolist()
    return idx, encode_video([frames[i] for i in idx], SPEC, opts)


# ---------------------------------------------------------------- containers and codecs
FILES = {
    "h264 mp4, odd size 4:4:4": dict(n=12, fps=10, h=45, w=61, pix="yuv444p"),
    "h264 mkv (no frame count in the header)": dict(n=12, fps=10, h=48, w=64, fmt="matroska"),
    "mpeg4 avi": dict(n=12, fps=10, h=48, w=64, codec="mpeg4", fmt="avi"),
    "mjpeg mkv": dict(n=12, fps=10, h=48, w=64, codec="mjpeg", fmt="matroska", pix="yuvj420p"),
    "vp9 webm": dict(n=12, fps=10, h=48, w=64, codec="libvpx-vp9", fmt="webm"),
    "audio track first": dict(n=12, fps=10, h=48, w=64, audio=True),
    "variable frame rate": dict(n=14, fps=10, h=48, w=64,
                                pts=[i * 100 for i in range(7)] + [2000 + i * 50 for i in range(7)]),
    "ntsc rate": dict(n=13, fps=Fraction(30000, 1001), h=48, w=64),
    "fragmented mp4, empty moov": dict(n=30, fps=10, h=48, w=64, movflags="frag_keyframe+empty_moov", gop=10),
    "2 frames": dict(n=2, fps=30, h=48, w=64),
    "3 frames": dict(n=3, fps=30, h=48, w=64),
}


@pytest.mark.parametrize("name", list(FILES))
def test_video_files_sample_and_pixels_as_decoded(name):
    kw = dict(FILES[name])
    codec = kw.get("codec", "libx264")
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV here has no {codec} encoder")
    data = write_video(kw.pop("n"), kw.pop("fps"), kw.pop("h"), kw.pop("w"), **kw)
    opts = VideoOptions(**SMALL)
    idx, want = _expected(data, opts)
    got = encode_video(data, SPEC, opts)
    assert got.frame_indices.tolist() == idx + [idx[-1]] * (len(idx) % 2)
    assert got.grid == want.grid and got.size == want.size
    assert np.array_equal(got.patches, want.patches)
    lay = video_layout(data, SPEC, opts)
    assert lay.grid == got.grid and lay.frame_indices.tolist() == got.frame_indices.tolist()
    assert lay.second_per_grid_ts == got.second_per_grid_ts


def test_fragmented_mp4_counts_the_frames_of_every_fragment():
    """movflags=frag_keyframe: the moov lists the first fragment's 10 samples (PyAV's stream.frames),
    the file holds 40 (4 s). Sampling spans the 40, as decoders that scan count them (torchcodec's
    exact mode: transformers' processors, qwen-vl-utils); before, indices [0, 3, 6, 9]: the first second."""
    data = write_video(40, 10, 48, 64, movflags="frag_keyframe", gop=10)
    with av.open(io.BytesIO(data)) as c:
        assert c.streams.video[0].frames == 10  # the header's partial count
    opts = VideoOptions(**SMALL)
    idx, want = _expected(data, opts)
    assert idx == [0, 6, 11, 17, 22, 28, 33, 39]
    got = encode_video(data, SPEC, opts)
    assert got.frame_indices.tolist() == idx and np.array_equal(got.patches, want.patches)
    assert video_layout(data, SPEC, opts).frame_indices.tolist() == idx


# ---------------------------------------------------------------- portrait phone videos
@pytest.mark.parametrize("rotation", [90, -90, 180])
def test_portrait_phone_video_is_decoded_upright(rotation):
    """Coded 48x96 landscape frames with a display matrix: the frames, grid and layout are the
    upright ones (96x48 for a quarter turn), as torchcodec and FFmpeg show them. Before: the coded
    frames, grid (2, 4, 6) instead of (2, 6, 4) for +-90, upside down for 180."""
    data = write_video(8, 10, 48, 96, rotation=rotation)
    assert _coded_rotation(data) % 360 == rotation % 360  # PyAV reports it on every decoded frame (180: -180)
    k = rotation // 90 % 4
    opts = VideoOptions(**SMALL)
    idx, want = _expected(data, opts, quarter_turns=k)
    got = encode_video(data, SPEC, opts)
    assert got.frame_indices.tolist() == idx
    assert got.size == want.size and got.grid == want.grid and np.array_equal(got.patches, want.patches)
    if k % 2:
        assert got.size[0] > got.size[1]  # portrait
    lay = video_layout(data, SPEC, opts)
    assert lay.grid == got.grid and lay.size == got.size


def test_rotated_video_keeps_every_frame_once():
    """The first frame is decoded to read the rotation and then used, not decoded again or lost:
    sampling all 6 frames gives the 6 decoded frames in order."""
    data = write_video(6, 10, 48, 64, rotation=90, fmt="mp4")
    frames = [np.ascontiguousarray(np.rot90(f)) for f in all_frames(data)]
    got = encode_video(data, SPEC, VideoOptions(nframes=6, **SMALL))
    assert got.frame_indices.tolist() == list(range(6))
    assert np.array_equal(got.patches, encode_video(frames, SPEC, VideoOptions(**SMALL)).patches)
    # the frames at the file's own size (processors that size frames themselves: the Omni thinkers)
    assert np.array_equal(sampled_frames(data, VideoOptions(nframes=6)), np.stack(frames))


def test_portrait_video_row_ids_and_positions_match_layout():
    processor = testing.build_processor("qwen2_5_vl")
    row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                        {"role": "assistant", "content": "A clip."}],
           "videos": [write_video(8, 10, 48, 96, rotation=-90)]}
    full = mmpipe.encode_row(row, processor, video_options=SMALL)
    lay = mmpipe.encode_row(row, processor, video_options=SMALL, pixels="none")
    assert full.video_grid_thw.tolist() == [[2, 6, 4]]  # upright: taller than wide
    assert np.array_equal(full.input_ids, lay.input_ids) and np.array_equal(full.position_ids, lay.position_ids)


# ---------------------------------------------------------------- frame lists
def _png(img: Image.Image) -> bytes:
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


def test_transparent_frames_composite_onto_white():
    """transformers' video ``convert_to_rgb`` and qwen-vl-utils' ``to_rgb`` put transparent pixels
    on white; before, the alpha band was dropped and the colour under it kept (10, 20, 30)."""
    rgba = np.zeros((56, 56, 4), np.uint8)
    rgba[..., :3] = (10, 20, 30)
    rgba[:28, :, 3] = 255  # top half opaque, bottom half fully transparent
    white = rgba[..., :3].copy()
    white[28:] = 255
    want = encode_video([white, white], SPEC, VideoOptions(**SMALL))
    for frames in ([rgba, rgba], [Image.fromarray(rgba, "RGBA")] * 2, [_png(Image.fromarray(rgba, "RGBA"))] * 2):
        got = encode_video(frames, SPEC, VideoOptions(**SMALL))
        assert np.array_equal(got.patches, want.patches)


def test_bad_frames_raise_located_image_errors():
    png = _png(Image.fromarray(_frame(0, 56, 56)))
    with pytest.raises(ImageError, match="truncated") as e:  # before: PIL's OSError
        encode_video([png, png[: len(png) // 2]], SPEC, VideoOptions(**SMALL), where="row 4, video 0")
    assert "row 4, video 0, frame 1" in str(e.value)
    deep = Image.fromarray((_frame(0, 56, 56)[..., 0].astype(np.uint16) * 257))  # mode I;16
    with pytest.raises(ImageError, match="clips") as e:  # before: silently clipped to white
        encode_video([deep, deep], SPEC, VideoOptions(**SMALL), where="row 4, video 0")
    assert "frame 0" in str(e.value)
    row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}],
           "videos": [[png, png[:100]]]}
    with pytest.raises(VideoError) as e:
        mmpipe.encode_row(row, testing.build_processor("qwen2_vl"), video_options=SMALL)
    assert e.value.column == "videos" and "frame 1" in str(e.value)


def test_torch_frame_stack_is_a_frame_list():
    torch = pytest.importorskip("torch")
    frames = np.stack([_frame(i, 48, 64) for i in range(3)])
    processor = testing.build_processor("qwen2_vl")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    a = mmpipe.encode_row({"messages": msgs, "videos": [frames]}, processor, video_options=SMALL)
    b = mmpipe.encode_row({"messages": msgs, "videos": [torch.from_numpy(frames)]}, processor, video_options=SMALL)
    assert np.array_equal(a.pixel_values_videos_u8, b.pixel_values_videos_u8)
    assert np.array_equal(a.input_ids, b.input_ids)


# ---------------------------------------------------------------- damaged files
def test_still_image_given_as_video_says_so(tmp_path):
    """A JPEG named .mp4 opens as a one-frame video: the error says so and how to pass it."""
    b = io.BytesIO()
    Image.fromarray(_frame(0, 48, 64)).save(b, "JPEG")
    path = tmp_path / "clip.mp4"
    path.write_bytes(b.getvalue())
    for value in (str(path), b.getvalue()):
        for fn in (encode_video, video_layout):
            with pytest.raises(VideoError, match="cannot sample") as e:
                fn(value, SPEC, VideoOptions(**SMALL), where="row 1, video 0")
            assert "still image" in e.value.found and "image item" in e.value.fix


def test_damaged_videos_are_counted_under_skip():
    import datasets

    good = write_video(12, 10, 48, 64)
    mkv = write_video(12, 10, 48, 64, fmt="matroska")
    jpg = io.BytesIO()
    Image.fromarray(_frame(0, 48, 64)).save(jpg, "JPEG")
    png = _png(Image.fromarray(_frame(0, 48, 64)))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A clip."}]}]
    videos = [[good], [good[: len(good) // 2]], [b""], [b"\x00garbage" * 300], [jpg.getvalue()], [mkv[: len(mkv) // 2]]]
    ds = datasets.Dataset.from_list([{"messages": msgs, "videos": v} for v in videos])
    enc, report = mmpipe.encode_dataset(ds, testing.build_processor("qwen2_vl"), video_options=SMALL, on_error="skip")
    # a matroska file cut in half: its header's duration (1.2 s) is more than its packets hold (0.5 s),
    # refused as truncated (before: kept, sampled from its first half as if it were the whole clip)
    assert report.rows_out == 1 and [e["row"] for e in report.errors] == [1, 2, 3, 4, 5]
    assert "truncated" in report.errors[4]["reason"]
    assert {e["column"] for e in report.errors} == {"videos"} and {e["stage"] for e in report.errors} == {"image"}
    frames = datasets.Dataset.from_list([{"messages": msgs, "videos": [[png, png]]},
                                         {"messages": msgs, "videos": [[png, png[:100]]]}])
    enc, report = mmpipe.encode_dataset(frames, testing.build_processor("qwen2_vl"), video_options=SMALL,
                                        on_error="skip")
    assert report.rows_out == 1 and [e["row"] for e in report.errors] == [1]
    assert "frame 1" in report.errors[0]["reason"] and report.errors[0]["column"] == "videos"


# ---------------------------------------------------------------- video_start / video_end
def _qwen_vl_utils() -> dict:
    """qwen-vl-utils 0.0.14's ``calculate_video_frame_range`` and ``smart_nframes``, executed from
    the wheel tests/images/test_video.py caches (skipped without it: no download here)."""
    import ast
    import glob
    import logging
    import math
    import zipfile
    from pathlib import Path

    wheels = glob.glob(str(Path(__file__).resolve().parents[2] / ".envs-cache" / "qwen-vl-utils" / "*.whl"))
    if not wheels:
        pytest.skip("qwen-vl-utils 0.0.14's wheel is not cached (tests/images/test_video.py downloads it)")
    with zipfile.ZipFile(wheels[0]) as z:
        tree = ast.parse(z.read("qwen_vl_utils/vision_process.py").decode())
    keep = {"round_by_factor", "ceil_by_factor", "floor_by_factor", "smart_nframes", "calculate_video_frame_range"}
    from typing import Any, Dict, Tuple

    ns = dict(math=math, logger=logging.getLogger("qvu"), Dict=Dict, Any=Any, Tuple=Tuple)
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef) and node.name in keep) or (
                isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), "vision_process.py", "exec"), ns)
            except NameError:
                pass
    return ns


CLIPS = [dict(video_start=2.0, video_end=4.0), dict(video_start=1.05), dict(video_end=3.0),
         dict(video_start=0.0, video_end=100.0), dict(video_start=2.5, video_end=6.0, fps=4.0),
         dict(video_start=1.0, video_end=5.0, nframes=6)]


@pytest.mark.parametrize("clip", range(len(CLIPS)))
def test_clip_range_follows_qwen_vl_utils(clip):
    """qwen-vl-utils clips a video file to [video_start, video_end] seconds before sampling; mmpipe
    ignored both keys (the whole 10 s sampled) before."""
    import torch

    qvu = _qwen_vl_utils()
    ele = CLIPS[clip]
    data = write_video(60, 10, 32, 48)  # 6 s at 10 fps
    frames = all_frames(data)
    first, last, count = qvu["calculate_video_frame_range"](ele, len(frames), 10.0)
    n = qvu["smart_nframes"](ele, total_frames=count, video_fps=10.0)
    idx = torch.linspace(first, last, n).round().long().tolist()
    opts = VideoOptions(**SMALL, **ele)
    got = encode_video(data, SPEC, opts)
    assert got.frame_indices.tolist() == idx
    assert got.second_per_grid_ts == 2 / (n / count * 10.0)
    assert got.timestamps == tuple((idx[i] / 10.0 + idx[i + 1] / 10.0) / 2 for i in range(0, n, 2))  # Qwen3-VL
    want = encode_video([frames[i] for i in idx], SPEC, VideoOptions(**SMALL))
    assert got.grid == want.grid and np.array_equal(got.patches, want.patches)
    lay = video_layout(data, SPEC, opts)
    assert lay.frame_indices.tolist() == idx and lay.grid == got.grid


def test_clip_range_in_a_videos_value_and_refusals():
    data = write_video(60, 10, 32, 48)
    processor = testing.build_processor("qwen2_5_vl")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    row = {"messages": msgs, "videos": [{"video": data, "video_start": 2.0, "video_end": 4.0}]}
    r = mmpipe.encode_row(row, processor, video_options=SMALL)
    assert r.video_grid_thw[0, 0] == 2  # 4 frames of the 2 s clip, not 12 of the 6 s video
    assert r.second_per_grid_ts.tolist() == [np.float32(2 / (4 / 21 * 10))]
    bad = [({"video": data, "video_start": 4.0, "video_end": 2.0}, "no frame range"),
           ({"video": [_frame(0, 32, 48)] * 2, "video_start": 1.0}, "frame list"),
           ({"video": data, "resized_height": 56, "resized_width": 56}, "not supported")]
    for value, msg in bad:
        with pytest.raises(VideoError, match=msg) as e:
            mmpipe.encode_row({"messages": msgs, "videos": [value]}, processor, video_options=SMALL)
        assert e.value.column == "videos"
    with pytest.raises(VideoError, match="GLM.s video processors sample the whole video"):
        mmpipe.encode_row({"messages": msgs, "videos": [{"video": data, "video_start": 1.0}]},
                          testing.build_processor("glm4v"), video_options=SMALL)


def test_clip_range_in_an_inline_video_item():
    """The keys on a ``{"type": "video", "video": ..., "video_start": ...}`` item (qwen-vl-utils'
    form) reach the video options: the item's copy of them was cut to the older keys, so the clip
    range was dropped unseen and the whole video sampled."""
    data = write_video(60, 10, 32, 48)
    processor = testing.build_processor("qwen2_5_vl")

    def row(**item):
        return {"messages": [{"role": "user", "content": [{"type": "video", "video": data, **item},
                                                          {"type": "text", "text": "What?"}]}]}

    inline = mmpipe.encode_row(row(video_start=2.0, video_end=4.0), processor, video_options=SMALL)
    column = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "video"},
                                                                          {"type": "text", "text": "What?"}]}],
                                "videos": [{"video": data, "video_start": 2.0, "video_end": 4.0}]},
                               processor, video_options=SMALL)
    # 4 frames of the 2 s clip (t = 2), not 12 of the 6 s video (t = 6)
    assert inline.video_grid_thw.tolist() == column.video_grid_thw.tolist() == [[2, 2, 4]]
    assert np.array_equal(inline.input_ids, column.input_ids)
    assert inline.second_per_grid_ts.tolist() == column.second_per_grid_ts.tolist()
    with pytest.raises(VideoError, match="not supported") as e:
        mmpipe.encode_row(row(resized_height=56, resized_width=56), processor, video_options=SMALL)
    assert e.value.column == "videos"


def test_playlists_are_refused_not_followed(tmp_path):
    """An HLS playlist under image_root naming a video outside it: FFmpeg's hls demuxer would open
    that file (before: the row encoded the outside video). Refused before anything is opened."""
    outside = tmp_path / "outside.ts"
    outside.write_bytes(write_video(12, 10, 48, 64, fmt="mpegts"))
    root = tmp_path / "root"
    root.mkdir()
    playlist = f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{outside}\n#EXT-X-ENDLIST\n"
    (root / "clip.m3u8").write_text(playlist)
    (root / "clip.mp4").write_text(playlist)  # the same under a video's name
    (root / "list.txt").write_text(f"ffconcat version 1.0\nfile '{outside}'\n")
    processor = testing.build_processor("qwen2_vl")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    for value in (str(root / "clip.m3u8"), str(root / "clip.mp4"), str(root / "list.txt"), playlist.encode()):
        for pixels in ("uint8", "none"):
            with pytest.raises(VideoError, match="playlist") as e:
                mmpipe.encode_row({"messages": msgs, "videos": [value]}, processor, image_root=str(root),
                                  video_options=SMALL, pixels=pixels)
            assert e.value.column == "videos"


def test_bad_per_video_values_are_the_rows_video_errors():
    """A row's own values (a frame list's rate, a per-video min_pixels) fail as that row's
    VideoError in the videos column; before: ArgumentError / ValueError, and a 1e12 min_pixels
    asked torch for a 3 TB frame (RuntimeError, or the machine's memory)."""
    processor = testing.build_processor("qwen2_vl")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    frames = [_frame(i, 56, 56) for i in range(3)]
    data = write_video(12, 10, 48, 64)
    cases = [({"frames": frames, "fps": 0}, "frame rate"), ({"frames": frames, "fps": "fast"}, "frame rate"),
             ({"video": data, "min_pixels": 10**12}, "resized to"),
             ({"video": frames, "min_pixels": 10**12}, "resized to")]
    for value, msg in cases:
        with pytest.raises(VideoError, match=msg) as e:
            mmpipe.encode_row({"messages": msgs, "videos": [value]}, processor, video_options=SMALL)
        assert e.value.column == "videos"
