"""Damaged and lying video files (damaged-media hunt): each one is a typed `VideoError` naming the
video, expected vs found and the fix, or encodes exactly as its decoded frames do; never sampled from
part of the clip as if it were the whole, never resized from frames of another size.

Files are made here with PyAV: Matroska / WebM cut at 30 % and 70 % (their header declares the whole
clip's duration but counts no frames), MPEG-TS clips joined into one stream whose frames change size,
a header-only file, an audio-only file, an odd-size (17x9) clip, a cut MP4 whose moov is complete."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile

from mmpipe.errors import VideoError
from mmpipe.families import get_family
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, encode_video, video_layout

from helpers import all_frames, make_video, video_file

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
SMALL = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)
SPEC = VisionSpec.from_family(get_family("qwen2_5_vl"))
ROUTES = (encode_video, video_layout)


def _codec(fmt: str) -> str:
    codec = "libvpx-vp9" if fmt == "webm" else "libx264"
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV here has no {codec} encoder")
    return codec


# ---------------------------------------------------------------- findings
@pytest.mark.parametrize("fmt", ["matroska", "webm"])
@pytest.mark.parametrize("kept", [0.3, 0.7])
def test_a_cut_matroska_file_is_refused_not_sampled_from_its_first_part(fmt, kept):
    """A 10 s Matroska / WebM clip cut at 30 % / 70 % (an interrupted download): its header still
    declares 10 s but counts no frames, so mmpipe counted the packets (29 / 69) and sampled them as
    if they were the whole clip: 2.9 s of frames, grid (2, 4, 4), on both routes, silently. Now a
    `VideoError` naming the declared and the held seconds. Before: both calls returned."""
    full = video_file(100, 48, 64, fmt, codec=_codec(fmt))
    cut = full[: int(len(full) * kept)]
    held = len(all_frames(cut))
    assert 0 < held < 100  # the decoder reads the first part and says nothing
    for fn in ROUTES:
        with pytest.raises(VideoError, match="truncated") as e:
            fn(cut, SPEC, VideoOptions(**SMALL), where="row 7, video 0")
        assert "row 7, video 0" in str(e.value)
        assert e.value.expected.startswith("10.00 s") and f"({held} video frames)" in e.value.found
        assert "re-download" in e.value.fix


def test_frames_that_change_size_mid_stream_are_refused():
    """Two MPEG-TS clips joined (48x64 then 96x128: concatenated captures, adaptive streams): the
    stream's size is the first clip's, and every later frame was resized to that grid without a
    word (a frame list of mixed sizes is refused). Now a `VideoError` naming the frame and both
    sizes. Before: encode_video returned grid (2, 4, 4)."""
    small, big = video_file(10, 48, 64, "mpegts"), video_file(10, 96, 128, "mpegts", seed=1)
    for joined, first, later in ((small + big, "48x64", "96x128"), (big + small, "96x128", "48x64")):
        assert {f.shape[:2] for f in all_frames(joined)} == {(48, 64), (96, 128)}
        with pytest.raises(VideoError, match="change size") as e:
            encode_video(joined, SPEC, VideoOptions(**SMALL), where="row 2, video 1")
        assert "row 2, video 1" in str(e.value) and first in e.value.expected
        assert e.value.found == f"frame 10 is {later}" and "scale" in e.value.fix


# ---------------------------------------------------------------- guards
def test_complete_matroska_files_are_not_taken_for_cut():
    """A sound track that outlasts the video, and variable frame rate with a gap: the header's
    duration is the longest track's, which the packets of every stream reach."""
    for data in (make_video(12, 10, 48, 64, fmt="matroska", audio=True),
                 make_video(14, 10, 48, 64, fmt="matroska", pts=[i * 100 for i in range(7)] + [2000 + i * 50 for i in range(7)]),
                 video_file(12, 48, 64, "webm", codec=_codec("webm"))):
        n = len(all_frames(data))
        got = encode_video(data, SPEC, VideoOptions(nframes=n - n % 2, **SMALL))
        assert len(got.frame_indices) == n - n % 2 and got.frame_indices[-1] == n - 1
        assert video_layout(data, SPEC, VideoOptions(**SMALL)).grid == encode_video(data, SPEC, VideoOptions(**SMALL)).grid


def test_cut_mp4_with_its_moov_first_is_refused_when_decoded():
    """faststart: the moov (100 frames) is whole, the samples are cut. The decode finds the stream
    short; the layout route reads headers only (it cannot know without reading every sample)."""
    full = video_file(100, 48, 64, "mp4", movflags="faststart")
    for kept in (0.3, 0.7):
        with pytest.raises(VideoError, match="ends early|cannot be decoded") as e:
            encode_video(full[: int(len(full) * kept)], SPEC, VideoOptions(**SMALL), where="row 0, video 0")
        assert e.value.fix


@pytest.mark.parametrize("case", ["header only", "audio only", "zero bytes", "moov missing"])
def test_files_without_video_frames_are_typed(case):
    mkv = video_file(100, 48, 64, "matroska")
    data = {"header only": mkv[:1500], "audio only": video_file(0, 0, 0, "matroska", audio_only=True),
            "zero bytes": b"", "moov missing": video_file(20, 48, 64, "mp4")[:2000]}[case]
    for fn in ROUTES:
        with pytest.raises(VideoError) as e:
            fn(data, SPEC, VideoOptions(**SMALL), where="row 5, video 0")
        assert "row 5, video 0" in str(e.value) and e.value.expected and e.value.fix


def test_odd_size_video_encodes_as_its_decoded_frames():
    """17x9 (4:4:4, so the size is kept): the frames are what PyAV decodes, sized as a frame list of them."""
    data = video_file(10, 9, 17, "mp4", pix="yuv444p")
    frames = all_frames(data)
    assert frames[0].shape == (9, 17, 3)
    got = encode_video(data, SPEC, VideoOptions(nframes=10, **SMALL))
    want = encode_video(frames, SPEC, VideoOptions(**SMALL))
    assert got.grid == want.grid and np.array_equal(got.patches, want.patches)


def test_damaged_videos_leave_pil_and_pyav_settings_alone():
    before = (ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS, av.logging.get_level())
    mkv = video_file(100, 48, 64, "matroska")
    for data in (mkv[: len(mkv) // 3], b"\x00" * 500, video_file(10, 48, 64, "mpegts") + video_file(10, 96, 128, "mpegts")):
        try:
            encode_video(data, SPEC, VideoOptions(**SMALL))
        except VideoError:
            pass
    assert (ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS, av.logging.get_level()) == before


def _forged_avi(frames: int) -> bytes:
    """A 20-frame MPEG-4 AVI whose headers (avih dwTotalFrames, strh dwLength) claim ``frames``."""
    if "mpeg4" not in av.codecs_available:
        pytest.skip("PyAV here has no mpeg4 encoder")
    data = bytearray(video_file(20, 48, 64, "avi", codec="mpeg4"))
    strh, avih = data.find(b"strh"), data.find(b"avih")
    data[strh + 40: strh + 44] = frames.to_bytes(4, "little")  # strh body: ... dwStart, dwLength
    data[avih + 24: avih + 28] = frames.to_bytes(4, "little")  # avih body: ..., dwTotalFrames
    return bytes(data)


def test_a_header_counting_more_frames_than_the_file_has_bytes_is_refused(tmp_path):
    """An AVI header claiming 2**31 - 1 frames for a 27 KB file: the layout route laid out 768
    frames over 6 days of clip (grid (384, 4, 4), second_per_grid_ts 559240) and the decode
    allocated a 16 GiB frame table (MemoryError here, or the machine's memory). Now both routes
    refuse it by its header, as a path or as bytes. Before: video_layout returned."""
    data = _forged_avi(2**31 - 1)
    with av.open(io.BytesIO(data)) as c:
        assert c.streams.video[0].frames == 2**31 - 1
    path = tmp_path / "forged.avi"
    path.write_bytes(data)
    for value in (data, str(path)):
        for fn in ROUTES:
            with pytest.raises(VideoError, match="more frames than the file could hold") as e:
                fn(value, SPEC, VideoOptions(**SMALL), where="row 3, video 0")
            assert e.value.found == "2147483647 frames in the header" and str(len(data)) in e.value.expected


def test_a_forged_frame_count_does_not_allocate_a_table_of_it(tmp_path):
    """The decode past the header check, in a child under a 6 GiB address-space limit (its own
    session, killed past the timeout): the stream ends early, a typed VideoError, never a
    MemoryError (before: np.bincount(idx, minlength=2**31) in decode_sampled)."""
    from helpers import run_child_group

    path = tmp_path / "forged.avi"
    path.write_bytes(_forged_avi(2**31 - 1))
    script = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))
from mmpipe.errors import VideoError
from mmpipe.families import get_family
from mmpipe.images.spec import VisionSpec
import mmpipe.images.video_container as vc
from mmpipe.images.video import VideoOptions, encode_video
vc.Container._check_header_count = lambda self, n: None  # the decode itself, past the header check
try:
    encode_video({str(path)!r}, VisionSpec.from_family(get_family("qwen2_5_vl")), VideoOptions(**{SMALL!r}))
except VideoError as e:
    print("done", e.detail)
"""
    out = run_child_group(script, 240, "decoding a forged AVI hung")
    assert "done the video stream ends early" in out
