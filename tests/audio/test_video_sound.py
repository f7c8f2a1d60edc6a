"""`mmpipe.audio.load_video_audio`: a video's sound track as transformers 5.24's Omni processors
load it with ``load_audio_from_video`` / ``use_audio_in_video`` (torchcodec's
``AudioDecoder(sample_rate=rate, num_channels=1)``: libavcodec + libswresample to mono at the
extractor's rate). torchcodec itself cannot load here (its 0.17 wheel links CUDA libraries), so
the checks are against what the file holds: PCM tracks at the target rate come back exactly
(mono as written; stereo as libswresample's mono downmix ``(L + R) * float32(1/sqrt(2))``, not
the average the soundfile path takes), resampled tracks have the converter's length and stay
close to soxr's resampling of the written samples; a video without sound is an `AudioError`
naming the row, the ``videos`` column and the fix."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("av")
soxr = pytest.importorskip("soxr")

from mmpipe.audio import has_audio_stream, load_video_audio  # noqa: E402
from mmpipe.audio.samples import video_with_sound  # noqa: E402
from mmpipe.errors import AudioError  # noqa: E402

RATE = 16000
SQRT1_2 = np.float32(math.sqrt(0.5))


@pytest.mark.parametrize("fmt", ["mkv", "mov", "avi"])
@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_tracks_at_the_rate_come_back_exactly(fmt, channels, tmp_path):
    data, written = video_with_sound(1.5, fmt=fmt, rate=RATE, channels=channels, seed=channels)
    want = written[0] if channels == 1 else written[0] * SQRT1_2 + written[1] * SQRT1_2
    path = tmp_path / f"clip.{fmt}"
    path.write_bytes(data)
    for value in (str(path), path, data, {"path": None, "bytes": data}, {"path": str(path), "bytes": None}):
        got = load_video_audio(value, RATE)
        assert got.dtype == np.float32 and got.ndim == 1 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    if channels == 2:  # not the channel mean (transformers' soundfile path, vLLM's PyAV path)
        assert np.abs(got - written.mean(0)).max() > 1e-2
    assert has_audio_stream(data)


@pytest.mark.parametrize("fmt, rate, channels", [("mkv", 22050, 1), ("mkv", 44100, 2), ("mp4", 44100, 2),
                                                 ("webm", 48000, 2), ("mkv", 8000, 1)])
def test_resampled_tracks(fmt, rate, channels):
    data, written = video_with_sound(1.5, fmt=fmt, rate=rate, channels=channels)
    got = load_video_audio(data, RATE)
    assert got.dtype == np.float32 and got.ndim == 1
    mono = written[0] if channels == 1 else written[0] * SQRT1_2 + written[1] * SQRT1_2
    ref = soxr.resample(mono, rate, RATE, quality="soxr_hq")
    if fmt == "mkv":  # PCM: the converter's output length is the exact rate change
        assert got.shape == (math.ceil(written.shape[1] * RATE / rate),)
    else:  # lossy codecs decode whole frames (priming / padding): a little longer
        assert len(ref) <= got.shape[0] <= len(ref) + RATE // 10
    if fmt == "mp4":  # AAC's encoder delay shifts the track: compare its loudness only
        np.testing.assert_allclose(np.sqrt(np.mean(got ** 2)), np.sqrt(np.mean(ref ** 2)), rtol=0.05)
        return
    n = min(len(ref), len(got))
    tol = 0.03 if rate == 8000 else 0.02  # two resampling filters (libswresample's, soxr's)
    assert np.abs(got[:n] - ref[:n])[200:-200].max() < (0.05 if fmt == "webm" else tol)
    assert np.corrcoef(got[200:n - 200], ref[200:n - 200])[0, 1] > 0.99


def test_the_rate_the_extractor_asks_for():
    data, written = video_with_sound(1.0, fmt="mkv", rate=RATE)
    at24 = load_video_audio(data, 24000)
    assert at24.shape == (24000,)
    np.testing.assert_array_equal(load_video_audio(data, RATE), written[0])


def test_a_video_without_sound(tmp_path):
    data, written = video_with_sound(1.0, fmt="mp4", sound=False)
    assert written is None and not has_audio_stream(data)
    with pytest.raises(AudioError) as e:
        load_video_audio(data, RATE, where="row 7")
    text = str(e.value)
    assert "no audio stream" in text and "row 7" in text and "'videos'" in text
    assert "use_audio_in_video=False" in e.value.fix
    assert e.value.found == "streams: video"
    # what the processor does with it: no audio for that video (its plain placeholder)
    assert load_video_audio(data, RATE, missing="none") is None


@pytest.mark.parametrize("value, words", [
    ("/no/such/video.mp4", "does not exist"),
    (b"\x00\x00\x00\x18ftypisom" + b"\x00" * 40, "cannot be opened"),
    (np.zeros((4, 8, 8, 3), np.uint8), "read from its file"),
])
def test_bad_videos_are_typed(value, words):
    with pytest.raises(AudioError) as e:
        load_video_audio(value, RATE, where="row 2", column="videos")
    text = str(e.value)
    assert words in text and "row 2" in text and "videos" in text and e.value.fix


def test_too_long_for_the_extractor():
    data, _ = video_with_sound(2.0, fmt="mkv", rate=RATE)
    assert load_video_audio(data, RATE, max_samples=2 * RATE).shape == (2 * RATE,)
    with pytest.raises(AudioError, match="would cut the rest"):
        load_video_audio(data, RATE, max_samples=RATE)
