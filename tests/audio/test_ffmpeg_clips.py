"""Audio files libsndfile does not read (M4A / AAC, ADTS AAC, WebM / Opus, Matroska PCM): users bring
them (phone recordings, YouTube audio), and the chat path's ``load_audio`` decodes them with torchcodec
(FFmpeg: the first audio stream decoded, converted to mono at the extractor's rate by libswresample in
one step). mmpipe decodes them the same way with PyAV (the ``video`` extra) where soundfile does not
recognise the file; it refused them before. Without PyAV the refusal names the extra; a file over the
processor's limit by its header is refused before it is decoded."""

from __future__ import annotations

import base64

import numpy as np
import pytest

import mmpipe
from mmpipe.audio import load_audio, load_video_audio
from mmpipe.errors import AudioError
from mmpipe.testing import invariants

av = pytest.importorskip("av")
pytest.importorskip("soundfile")
pytest.importorskip("soxr")

from mmpipe.audio.samples import sound_file, tone, video_with_sound  # noqa: E402

RATE = 16000


def _ffmpeg_reference(data: bytes, rate: int) -> np.ndarray:
    """torchcodec's ``AudioDecoder(source, sample_rate=rate, num_channels=1).get_all_samples()``,
    written out with PyAV: every frame of the first audio stream through one libswresample
    converter (mono float at ``rate``, FFmpeg's defaults), its buffered tail flushed."""
    import io

    out = []
    with av.open(io.BytesIO(data)) as c:
        conv = av.AudioResampler(format="fltp", layout="mono", rate=rate)
        for frame in c.decode(c.streams.audio[0]):
            out += [f.to_ndarray()[0] for f in conv.resample(frame)]
        out += [f.to_ndarray()[0] for f in conv.resample(None)]
    return np.concatenate(out)


@pytest.mark.parametrize("fmt, rate, channels", [("m4a", 44100, 2), ("aac", 22050, 1), ("webm", 48000, 2),
                                                 ("mka", 8000, 2)])
def test_ffmpeg_formats_load_as_torchcodec_decodes_them(tmp_path, fmt, rate, channels):
    """Each format, given as a path, bytes, a ``{"path", "bytes"}`` dict and a ``data:`` URI, loads as
    FFmpeg decodes and converts it (bit for bit), and still sounds like what was written (correlation
    with the source tone at its best lag: the lossy codecs' priming shifts ADTS AAC)."""
    src = tone(2 * rate, rate, channels, seed=1)
    data = sound_file(src, rate, fmt)
    path = tmp_path / f"clip.{fmt}"
    path.write_bytes(data)
    want = _ffmpeg_reference(data, RATE)
    uri = f"data:audio/{fmt};base64," + base64.b64encode(data).decode()
    for value in (str(path), data, {"path": str(path), "bytes": None}, {"bytes": data, "path": None}, uri):
        np.testing.assert_array_equal(load_audio(value, RATE), want)
    assert abs(len(want) - 2 * RATE) < 0.1 * RATE  # the codec's priming / padding at most
    from mmpipe.audio.load import _resampled

    ref = _resampled(src.mean(axis=0), rate, RATE)
    n = min(len(ref), len(want)) - 2000
    best = max(np.corrcoef(want[lag:lag + n], ref[:n])[0, 1] for lag in range(0, 1500, 1))
    assert best > 0.98, best


def test_lossless_mono_at_the_rate_is_exact():
    """Matroska PCM, mono at the extractor's rate: no conversion, the samples as written."""
    x = np.round(tone(RATE, RATE, 1, seed=2) * 32767).astype(np.int16).astype(np.float32) / 32768
    np.testing.assert_array_equal(load_audio(sound_file(x, RATE, "mka"), RATE), x[0])


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen_omni import build_processor

    return build_processor()


def _row(clip) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is it?"}]},
                         {"role": "assistant", "content": "A tone."}], "audios": [clip]}


def test_rows_of_m4a_clips_encode_as_the_processor_call(omni):
    """A row with an M4A clip == the processor's flat call on the clip FFmpeg decodes; stored as its file
    (``audio="source"``), collate computes the same features, and unbatch gives the row back, its file
    included."""
    from audio_rows import chat_text

    data = sound_file(tone(int(1.5 * 44100), 44100, 2, seed=3), 44100, "m4a")
    row = mmpipe.encode_row(_row(data), omni, idx=0)
    own = omni(text=[chat_text(omni, _row(data))], audio=[_ffmpeg_reference(data, RATE)], return_tensors="pt")
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0].numpy())
    for k in ("input_features", "feature_attention_mask"):
        np.testing.assert_array_equal(row.vision[k], own[k].numpy(), err_msg=k)
    src = mmpipe.encode_row(_row(data), omni, idx=0, audio="source")
    assert src.audio_sources == [data]
    batch = invariants.assert_roundtrip([src], processor=omni)  # unbatch gives the row its file back
    np.testing.assert_array_equal(batch.vision["input_features"][0], own["input_features"][0].numpy())


def test_without_pyav_the_refusal_names_the_extra(monkeypatch):
    import sys

    data = sound_file(tone(RATE, RATE, 1), RATE, "m4a")
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(AudioError, match="PyAV") as e:
        load_audio(data, RATE, where="row 6, audio 0")
    assert "row 6" in str(e.value) and e.value.column == "audios" and "mmpipe[video]" in e.value.fix


def test_damaged_ffmpeg_files_are_typed():
    data = sound_file(tone(2 * 44100, 44100, 2), 44100, "m4a")
    png = __import__("io").BytesIO()
    __import__("PIL.Image").Image.new("RGB", (8, 8)).save(png, "PNG")
    for bad, words in ((data[: len(data) // 2], "cannot be decoded"), (png.getvalue(), "no audio stream")):
        with pytest.raises(AudioError, match=words) as e:
            load_audio(bad, RATE, where="row 2, audio 1")
        assert "row 2" in str(e.value) and e.value.column == "audios" and e.value.fix


@pytest.mark.parametrize("kind", ["m4a", "video"])
def test_a_long_track_is_refused_by_its_header(monkeypatch, kind):
    """An M4A clip and a video's sound over the processor's limit by their headers are refused before
    a sample is decoded (the converter is never built); within the limit they decode."""
    if kind == "m4a":
        data = sound_file(tone(3 * RATE, RATE, 1), RATE, "m4a")
        load = load_audio
    else:
        data, _ = video_with_sound(3.0, fmt="mkv")
        load = load_video_audio
    built = []
    real = av.AudioResampler
    monkeypatch.setattr(av, "AudioResampler", lambda *a, **k: built.append(1) or real(*a, **k))
    with pytest.raises(AudioError, match="the clip is 3.00 s; the processor takes at most 1.00 s") as e:
        load(data, RATE, where="row 1, audio 0", max_samples=RATE)
    assert "row 1" in str(e.value) and built == []
    assert load(data, RATE, max_samples=4 * RATE).size > 2.9 * RATE and built == [1]
