"""Damaged and lying audio files (damaged-media hunt): a float WAV whose samples are not at full
scale 1.0 is refused as the same samples given as an array are; cut, lying, empty, non-finite and
wrong-kind files stay typed `AudioError`s naming the row and column; 8-bit, 24-bit and 6-channel WAVs
load as soundfile reads them (channels averaged)."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

import mmpipe
from mmpipe.audio import load_audio
from mmpipe.errors import AudioError

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

RATE = 16000


def _wav(x: np.ndarray, subtype: str = "PCM_16", fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, x, RATE, format=fmt, subtype=subtype)
    return buf.getvalue()


def _tone(n: int = RATE, peak: float = 0.4) -> np.ndarray:
    return (peak * np.sin(np.arange(n) * 2 * np.pi * 440 / RATE)).astype(np.float32)


# ---------------------------------------------------------------- finding
@pytest.mark.parametrize("subtype", ["FLOAT", "DOUBLE"])
def test_a_float_wav_of_unscaled_int16_values_is_refused_as_the_array_is(subtype):
    """int16 values saved as floats (peaks in the thousands): soundfile reads a float WAV as written,
    and the clip went to the feature extractor at 13,000x full scale, while the same samples as an
    array are refused. Before: load_audio returned them (peak 13107)."""
    values = np.round(_tone() * 32767)
    with pytest.raises(AudioError, match="not scaled to full scale") as e:
        load_audio((values, RATE), RATE, where="row 4")  # the array route's refusal, as it was
    with pytest.raises(AudioError, match="not scaled to full scale") as e:
        load_audio(_wav(values, subtype), RATE, where="row 4", column="audios")
    assert "row 4" in str(e.value) and e.value.column == "audios"
    assert f"{subtype} samples of the audio" in e.value.found and "13107" in e.value.found
    assert "re-export" in e.value.fix


def test_float_wavs_at_full_scale_and_lossy_overshoot_load():
    """Guard: float samples up to the overshoot a lossy decoder or a hot master gives load as they are."""
    for peak in (1.0, 1.5):
        x = _tone(peak=peak)
        got = load_audio(_wav(x, "FLOAT"), RATE)
        assert np.array_equal(got, x)


# ---------------------------------------------------------------- guards
@pytest.mark.parametrize("subtype,channels", [("PCM_U8", 1), ("PCM_24", 1), ("PCM_16", 6), ("DOUBLE", 2)])
def test_widths_and_channel_counts_load_as_soundfile_reads_them(subtype, channels):
    x = np.stack([_tone() * (1 - 0.1 * c) for c in range(channels)], 1) if channels > 1 else _tone()
    data = _wav(x, subtype)
    ref, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert np.array_equal(load_audio(data, RATE), ref.T.mean(axis=0) if channels > 1 else ref[:, 0])


def _damaged() -> dict:
    good = _wav(_tone())
    lying = bytearray(good)
    lying[40:44] = struct.pack("<I", 4 * RATE * 2)  # the data chunk claims 4 s; 1 s follows
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    return {"cut mid-frame": (good[: len(good) // 2 + 1], "truncated"),
            "24-bit cut mid-frame": (_wav(_tone(), "PCM_24")[: 44 + 3 * 5000 + 2], "truncated"),
            "header claims more samples": (bytes(lying), "truncated"),
            "zero samples": (_wav(np.zeros(0, np.float32)), "no samples"),
            "NaN samples": (_wav(np.where(np.arange(RATE) % 2, np.nan, 0.1).astype(np.float32), "FLOAT"), "NaN"),
            "inf samples": (_wav(np.where(np.arange(RATE) % 2, np.inf, 0.1).astype(np.float32), "FLOAT"), "infinite"),
            "flac cut": (_wav(_tone(), fmt="FLAC")[:3000], "cannot be decoded"),
            "a PNG named .wav": (png.getvalue(), "no audio stream")}


@pytest.mark.parametrize("case", list(_damaged()))
def test_damaged_files_are_typed_errors_naming_the_row(case):
    data, words = _damaged()[case]
    with pytest.raises(AudioError, match=words) as e:
        load_audio(data, RATE, where="row 9", column="audios")
    assert "row 9" in str(e.value) and e.value.column == "audios" and e.value.fix


def test_damaged_clips_are_skipped_and_counted_through_datasets_map():
    """ds.map(mmpipe.encode, batched=True, on_error='skip', num_proc=2): each damaged clip's row is left
    out and reported with its index, stage and column; the good rows are kept."""
    import datasets

    from mmpipe.offline.qwen_omni import build_processor

    proc = build_processor()
    good = _wav(_tone())
    bad = [_wav(np.round(_tone() * 32767), "FLOAT"), _damaged()["header claims more samples"][0]]
    msgs = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A tone."}]}]
    clips = [good, bad[0], good, bad[1]]
    ds = datasets.Dataset.from_list([{"messages": msgs, "audios": [c]} for c in clips])
    enc = ds.map(mmpipe.encode, batched=True, with_indices=True, remove_columns=ds.column_names, num_proc=2,
                 batch_size=2, fn_kwargs={"processor": proc, "on_error": "skip"})
    kept, errors = mmpipe.drop_failed(enc)
    assert len(kept) == 2
    assert [(e["row"], e["stage"], e["column"]) for e in errors] == [(1, "audio", "audios"), (3, "audio", "audios")]
    assert "full scale" in errors[0]["reason"] and "truncated" in errors[1]["reason"]


def _ffmpeg_clip(fmt: str, codec: str, seconds: float = 4.0) -> bytes:
    """A mono tone in a container libsndfile does not read (decoded by FFmpeg, as the chat path's
    torchcodec decodes it)."""
    av = pytest.importorskip("av")
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV here has no {codec} encoder")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        a = c.add_stream(codec, rate=RATE if codec == "aac" else 48000)
        a.layout = "mono"
        samples = _tone(int(seconds * a.rate))[None]
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = a.rate, 0
        for p in [*a.encode(frame), *a.encode()]:
            c.mux(p)
    return buf.getvalue()


@pytest.mark.parametrize("fmt,codec", [("matroska", "aac"), ("webm", "libopus")])
def test_a_cut_matroska_audio_file_is_refused_not_read_in_part(fmt, codec):
    """An .mka / .webm clip cut in half: FFmpeg decodes the first half and says nothing, while the header
    still declares the whole clip. Before: load_audio returned 1.92 s of the 4 s clip."""
    full = _ffmpeg_clip(fmt, codec)
    assert abs(load_audio(full, RATE).size / RATE - 4.0) < 0.1  # the whole file loads
    with pytest.raises(AudioError, match="truncated") as e:
        load_audio(full[: len(full) // 2], RATE, where="row 6", column="audios")
    assert e.value.expected.startswith("4.0") and "s of sound" in e.value.found and "re-download" in e.value.fix
    assert "row 6" in str(e.value)


def test_a_fifo_or_device_path_is_refused_not_waited_on(tmp_path):
    """A clip path that is a FIFO with no writer: libsndfile's open blocked forever (the encode, a
    map worker, a DataLoader hung); /dev/zero never ends. Now the row's AudioError naming what the
    path is, for a clip and for a video's sound track, in a child killed with its group past the
    timeout. Before: the child hung (killed at 60 s)."""
    import os

    from helpers import run_child_group

    fifo = tmp_path / "clip.wav"
    os.mkfifo(fifo)
    script = f"""
from mmpipe.audio.load import load_audio
from mmpipe.audio.video import load_video_audio
from mmpipe.errors import AudioError
for path, kind in (({str(fifo)!r}, "a FIFO"), ("/dev/zero", "a character device"), ({str(tmp_path)!r}, "a directory")):
    for load in (load_audio, load_video_audio):
        try:
            load(path, 16000, where="row 2")
        except AudioError as e:
            assert e.found.startswith(kind) and "a regular" in e.expected and "row 2" in str(e), e
        else:
            raise SystemExit(f"{{path}} loaded")
print("done")
"""
    assert "done" in run_child_group(script, 60, "loading a clip from a FIFO hung")
