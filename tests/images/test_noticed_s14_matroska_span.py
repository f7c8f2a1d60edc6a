"""One rule for "a Matroska / WebM file cut short" (`mmpipe.images.matroska_span.matroska_shortfall`),
asked by both media routes that had their own copy: video frames (`Container._check_declared_span`:
the packets' end, slack 1.5 frames or 0.25 s, a `VideoError`) and a sound track
(`mmpipe.audio.video._check_declared`: the decoded sound's end, one stream only, 0.25 s, an
`AudioError`). Guards: each route's refusal says what the rule measured; complete files, other
formats and a shortfall within the slack pass. The routes' own messages are held by
tests/images/test_hunt_damaged_videos.py and tests/audio/test_hunt_damaged_audio.py."""

from __future__ import annotations

import io

import pytest

from mmpipe.errors import AudioError, VideoError
from mmpipe.families import get_family
from mmpipe.images.matroska_span import matroska_shortfall
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, encode_video

from helpers import video_file

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
SPEC = VisionSpec.from_family(get_family("qwen2_5_vl"))
SMALL = VideoOptions(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)
RATE = 16000


def _packet_end(data: bytes) -> tuple:
    """(the container's shortfall with no slack, the end of its last packet in seconds)."""
    with av.open(io.BytesIO(data)) as c:
        end = max(float((p.pts + (p.duration or 0)) * p.time_base) for p in c.demux() if p.pts is not None)
        return matroska_shortfall(c, end, 0.0), end


def _sound_clip(seconds: float = 4.0) -> bytes:
    if "aac" not in av.codecs_available:
        pytest.skip("PyAV here has no aac encoder")
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as c:
        a = c.add_stream("aac", rate=RATE)
        a.layout = "mono"
        t = np.arange(int(seconds * RATE)) / RATE
        frame = av.AudioFrame.from_ndarray((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None],
                                           format="fltp", layout="mono")
        frame.sample_rate, frame.pts = RATE, 0
        for p in [*a.encode(frame), *a.encode()]:
            c.mux(p)
    return buf.getvalue()


def test_the_rule_on_whole_cut_and_other_files():
    if "libx264" not in av.codecs_available:
        pytest.skip("PyAV here has no libx264 encoder")
    full = video_file(100, 48, 64, "matroska")
    assert _packet_end(full)[0] is None  # complete: what it declares, it holds
    short, end = _packet_end(full[: int(len(full) * 0.3)])
    declared, held = short
    assert declared == pytest.approx(10.0, abs=0.05) and held == pytest.approx(end) and held < 4.0
    with av.open(io.BytesIO(full[: int(len(full) * 0.3)])) as c:  # within the slack: not short
        assert matroska_shortfall(c, end, declared - held + 0.01) is None
    mp4 = video_file(20, 48, 64, "mp4")
    with av.open(io.BytesIO(mp4)) as c:  # not Matroska: not this rule's to say
        assert matroska_shortfall(c, 0.0, 0.0) is None


def test_the_video_route_refuses_with_what_the_rule_measured():
    if "libx264" not in av.codecs_available:
        pytest.skip("PyAV here has no libx264 encoder")
    cut = video_file(100, 48, 64, "matroska")
    cut = cut[: int(len(cut) * 0.7)]
    (declared, held), _ = _packet_end(cut)
    with pytest.raises(VideoError, match="truncated") as e:
        encode_video(cut, SPEC, SMALL, where="row 1, video 0")
    assert e.value.expected.startswith(f"{declared:.2f} s") and e.value.found.startswith(f"{held:.2f} s of packets")


def test_the_sound_route_refuses_with_what_the_rule_measured():
    from mmpipe.audio.load import load_audio

    full = _sound_clip()
    assert abs(load_audio(full, RATE).size / RATE - 4.0) < 0.1
    cut = full[: len(full) // 2]
    with av.open(io.BytesIO(cut)) as c:
        end = max(f.time + f.samples / f.sample_rate for f in c.decode(c.streams.audio[0]))
        declared, held = matroska_shortfall(c, end, 0.25)
    with pytest.raises(AudioError, match="truncated") as e:
        load_audio(cut, RATE, where="row 2", column="audios")
    assert e.value.expected.startswith(f"{declared:.2f} s") and e.value.found == f"{held:.2f} s of sound"
