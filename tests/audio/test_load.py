"""`mmpipe.audio.load_audio`: every accepted form of a clip gives the waveform the processor's own chat
path loads (transformers' ``load_audio(..., backend="soundfile")``: soundfile, mono by averaging,
soxr_hq), bit for bit; every bad clip is an `AudioError` naming the row, the column and the fix."""

from __future__ import annotations

import io

import numpy as np
import pytest

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

from transformers.audio_utils import load_audio as hf_load_audio  # noqa: E402

from mmpipe.audio import load_audio  # noqa: E402
from mmpipe.errors import AudioError  # noqa: E402

RATE = 16000


def _tone(n: int, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)
    return np.stack([x, -x * 0.5], 1).astype(np.float32) if channels == 2 else x.astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    out = {}
    for name, rate, ch, fmt in (("mono16k.wav", 16000, 1, "WAV"), ("stereo22k.flac", 22050, 2, "FLAC"),
                                ("mono44k.ogg", 44100, 1, "OGG"), ("pcm8k.wav", 8000, 1, "WAV")):
        path = d / name
        subtype = "PCM_16" if name.startswith("pcm") else None
        soundfile.write(str(path), _tone(rate // 2 * 3, rate, ch), rate, format=fmt, subtype=subtype)
        out[name] = str(path)
    return out


@pytest.mark.parametrize("name", ["mono16k.wav", "stereo22k.flac", "mono44k.ogg", "pcm8k.wav"])
def test_files_load_as_the_processors_chat_path(files, name):
    path = files[name]
    want = hf_load_audio(path, RATE, backend="soundfile")
    data = open(path, "rb").read()
    for value in (path, data, {"path": None, "bytes": data}, {"path": path, "bytes": None}):
        got = load_audio(value, RATE)
        assert got.dtype == np.float32 and got.ndim == 1
        np.testing.assert_array_equal(got, want)


def test_arrays_with_their_rate(tmp_path):
    x = _tone(22050, 22050)
    via_file = io.BytesIO()
    soundfile.write(via_file, x, 22050, format="WAV", subtype="FLOAT")
    path = tmp_path / "float22k.wav"
    path.write_bytes(via_file.getvalue())
    want = hf_load_audio(str(path), RATE, backend="soundfile")  # the same samples, resampled by the chat path
    got_dict = load_audio({"array": x, "sampling_rate": 22050}, RATE)
    got_tuple = load_audio((x, 22050), RATE)
    np.testing.assert_array_equal(got_dict, want)
    np.testing.assert_array_equal(got_tuple, want)
    assert got_dict.shape == (16000,)  # ceil(22050 * 16000 / 22050)
    same = load_audio({"array": x[:RATE], "sampling_rate": RATE}, RATE)
    np.testing.assert_array_equal(same, x[:RATE])  # at the target rate: the samples as given
    pcm = (x[:RATE] * 32767).astype(np.int16)  # integer PCM: full scale 1.0, as soundfile reads it
    np.testing.assert_array_equal(load_audio((pcm, RATE), RATE), pcm.astype(np.float32) / 32768)
    stereo = np.stack([x[:RATE], x[:RATE] * 0.5])
    np.testing.assert_allclose(load_audio((stereo, RATE), RATE), x[:RATE] * 0.75, rtol=1e-6)


@pytest.mark.parametrize("value, words", [
    (np.zeros(100, np.float32), "sampling_rate"),  # a bare array: its rate is unknown
    ({"array": np.zeros(100, np.float32), "sampling_rate": None}, "without a sampling rate"),
    ({"array": np.zeros(0, np.float32), "sampling_rate": RATE}, "no samples"),
    ({"array": np.full(100, np.nan, np.float32), "sampling_rate": RATE}, "NaN"),
    ({"array": np.zeros((2, 3, 4), np.float32), "sampling_rate": RATE}, "1-D"),
    (b"RIFF\x00\x00\x00\x00WAVEnot really", "cannot be decoded"),
    ("/no/such/clip.wav", "does not exist"),
    (12, "must be a path"),
])
def test_bad_clips_are_typed(value, words):
    with pytest.raises(AudioError) as e:
        load_audio(value, RATE, where="row 3", column="audios")
    text = str(e.value)
    assert words in text and "row 3" in text and "audios" in text and e.value.fix


def test_truncated_file_is_typed(files):
    data = open(files["stereo22k.flac"], "rb").read()
    with pytest.raises(AudioError, match="cannot be decoded"):
        load_audio(data[: len(data) // 3], RATE)


def test_a_clip_longer_than_the_processor_takes_is_refused():
    x = np.zeros(RATE * 3, np.float32)
    assert load_audio((x, RATE), RATE, max_samples=RATE * 3).shape == (RATE * 3,)
    with pytest.raises(AudioError, match="would cut the rest") as e:
        load_audio((x, RATE), RATE, max_samples=RATE * 2)
    assert "split the clip" in e.value.fix
