"""Clips users bring that `mmpipe.audio.load_audio` got wrong or crashed on:

- an AIFF, Sun AU, RF64 or Wave64 file cut short loaded its first part silently (only WAV was
  checked); complete files of every uncompressed layout still load as the chat path loads them;
- GSM 6.10 / G.721 / G.723 WAV and AU (telephony recordings) were refused as "corrupt": soundfile
  reads such non-seekable files only given their frame count;
- samples as a bfloat16 tensor leaked torch's TypeError; an empty ``[channels, 0]`` array was
  reported as NaN samples; a numpy float rate of 16000.7 was taken as 16000; a torchcodec
  ``AudioDecoder`` that fails to decode leaked its RuntimeError."""

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


def _tone(n: int, rate: int, channels: int = 1) -> np.ndarray:
    """float32 [n, channels]: a 440 Hz tone, each channel a little quieter."""
    x = 0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)
    return np.stack([x * (1 - 0.1 * c) for c in range(channels)], 1).astype(np.float32)


def _file(fmt: str, subtype: str, n: int = 16000, rate: int = 8000, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, _tone(n, rate, channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, subtype, name", [("AIFF", "PCM_16", "AIFF"), ("AIFF", "FLOAT", "AIFF"),
                                                ("AU", "PCM_24", "AU"), ("RF64", "PCM_16", "RF64"),
                                                ("W64", "FLOAT", "Wave64"), ("WAV", "PCM_16", "WAV")])
def test_cut_files_of_every_sized_container_are_refused(fmt, subtype, name):
    data = _file(fmt, subtype, channels=2)
    with pytest.raises(AudioError, match=f"the {name} .* is truncated: its header holds 2.00 s, the file 1.0"):
        load_audio(data[: len(data) // 2], RATE, where="row 3")


@pytest.mark.parametrize("fmt", ["AIFF", "AU", "RF64", "W64", "WAV"])
def test_complete_files_of_those_containers_load_as_the_chat_path(fmt, tmp_path):
    for subtype in sorted(soundfile.available_subtypes(fmt)):
        for channels, n in ((1, 4001), (6, 4000)):
            try:
                data = _file(fmt, subtype, n=n, channels=channels)
            except (RuntimeError, ValueError, soundfile.LibsndfileError):  # a layout this writer does not take
                continue
            path = tmp_path / f"{subtype}_{channels}.{fmt.lower()}"
            path.write_bytes(data)
            try:
                expected = hf_load_audio(str(path), RATE)
            except (RuntimeError, ValueError, TypeError, soundfile.LibsndfileError):  # GSM, DWVW...: not the chat path's
                continue
            np.testing.assert_array_equal(load_audio(str(path), RATE), expected, err_msg=f"{fmt} {subtype} {channels}")


@pytest.mark.parametrize("fmt, subtype", [("WAV", "GSM610"), ("WAV", "G721_32"), ("AU", "G723_24")])
def test_telephony_codecs_load(fmt, subtype):
    wave = load_audio(_file(fmt, subtype), RATE)
    ref = _tone(32000, RATE)[:, 0]
    assert wave.size >= ref.size and wave.size < ref.size + 2000  # the codec pads its last block
    assert np.corrcoef(wave[: ref.size], ref)[0, 1] > 0.9


def test_bfloat16_tensor_samples():
    torch = pytest.importorskip("torch")
    x = _tone(8000, RATE)[:, 0]
    t = torch.tensor(x).bfloat16()
    np.testing.assert_array_equal(load_audio((t, RATE), RATE), t.float().numpy())
    np.testing.assert_array_equal(load_audio({"array": t.reshape(1, -1).repeat(2, 1), "sampling_rate": RATE}, RATE),
                                  t.float().numpy())


@pytest.mark.parametrize("shape", [(2, 0), (0, 2), (6, 0), (0, 0)])
def test_empty_multichannel_arrays_are_empty_clips(shape):
    with pytest.raises(AudioError, match="no samples"):
        load_audio({"array": np.zeros(shape, np.float32), "sampling_rate": RATE}, RATE, where="row 1")


def test_fractional_numpy_and_torch_rates_are_refused():
    torch = pytest.importorskip("torch")
    x = _tone(8000, RATE)[:, 0]
    for rate in (np.float32(16000.7), torch.tensor(22050.5, dtype=torch.float64), np.float32(np.nan)):
        with pytest.raises(AudioError, match="without a sampling rate"):
            load_audio((x, rate), RATE)
    assert load_audio((x, np.float32(16000.0)), RATE).size == 8000
    assert load_audio((x, torch.tensor(8000)), RATE).size == 16000


def test_an_audio_decoder_that_fails_is_typed():
    class Decoder:  # torchcodec's AudioDecoder over a corrupt stream, as datasets decodes an Audio column
        def get_all_samples(self):
            raise RuntimeError("Could not decode frame: Invalid data found when processing input")

    with pytest.raises(AudioError, match="decoder of the clip failed") as e:
        load_audio(Decoder(), RATE, where="row 7")
    assert "row 7" in str(e.value) and "drop the row" in str(e.value)
