"""Audio clips as users bring them (real files and damaged ones) on the generic path.

- files of every common layout (WAV PCM_16 / PCM_24 / FLOAT / 8-bit, mono, stereo, 5.1, 8 kHz to
  48 kHz, FLAC, OGG Vorbis / Opus, MP3; a leading silence and a DC offset) load as the processor's
  chat path loads them (transformers' ``load_audio(backend="soundfile")``), bit for bit, given as a
  path, bytes or a ``{"path", "bytes"}`` dict;
- samples given with their rate in the layouts other readers return: ``soundfile.read``'s
  ``(data, rate)`` ([n, channels]), 8-bit WAV samples (uint8, offset binary), int16 samples read back
  from an Arrow column (Python ints: refused, their width is lost);
- damaged input (a cut WAV, zero bytes, garbage, a video without sound, odd arrays) is a typed
  `AudioError` naming the row, the column and the fix; ``on_error="skip"`` counts each row;
- a clip longer than the processor's call takes (Gemma 3n's and Gemma 4's extractors cut at 30 s, as
  Whisper's does for Qwen2.5-Omni) is refused, not cut;
- the tiny Qwen2.5-Omni thinker on a batch of such rows gives each row's own logits."""

from __future__ import annotations

import io
import struct
import types
import wave

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.audio import load_audio
from mmpipe.audio.clips import clip_limit, load_clips
from mmpipe.errors import AudioError
from mmpipe.testing import invariants

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

from transformers.audio_utils import load_audio as hf_load_audio  # noqa: E402

from audio_rows import own_call  # noqa: E402

RATE = 16000
# name -> (rate, channels, format, subtype)
FILES = {
    "pcm16_8k_stereo.wav": (8000, 2, "WAV", "PCM_16"),
    "pcm24_22k_51.wav": (22050, 6, "WAV", "PCM_24"),
    "float_44k.wav": (44100, 1, "WAV", "FLOAT"),
    "u8_48k_stereo.wav": (48000, 2, "WAV", "PCM_U8"),
    "pcm16_16k.wav": (16000, 1, "WAV", "PCM_16"),
    "stereo_48k.flac": (48000, 2, "FLAC", "PCM_16"),
    "vorbis_22k.ogg": (22050, 2, "OGG", "VORBIS"),
    "opus_48k.ogg": (48000, 1, "OGG", "OPUS"),
    "stereo_44k.mp3": (44100, 2, "MP3", "MPEG_LAYER_III"),
}


def _tone(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """float64 [n] or [n, channels]: a tone with noise, a DC offset of 0.1 and a leading 20 % of silence."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * (330 + 40 * seed) * t) + 0.05 * rng.standard_normal(n) + 0.1
    x[: n // 5] = 0.0
    return np.stack([x * (1 - 0.1 * c) for c in range(channels)], 1) if channels > 1 else x


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("user_audio")
    out = {}
    for i, (name, (rate, ch, fmt, sub)) in enumerate(FILES.items()):
        soundfile.write(str(d / name), _tone(0.7, rate, ch, i), rate, format=fmt, subtype=sub)
        out[name] = str(d / name)
    return out


def _wav(x: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, x, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(FILES))
def test_user_files_load_as_the_chat_path(files, name):
    path = files[name]
    want = hf_load_audio(path, RATE, backend="soundfile")
    data = open(path, "rb").read()
    for value in (path, data, {"path": None, "bytes": data}):
        got = load_audio(value, RATE)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["pcm16_8k_stereo.wav", "pcm24_22k_51.wav", "u8_48k_stereo.wav", "stereo_48k.flac"])
def test_soundfile_read_tuples_are_frames_by_channels(files, name):
    """``soundfile.read`` returns ``(data [n, channels], rate)``, the ``(array, rate)`` form: the channels
    are averaged as the chat path averages the file's (the old code averaged the frames: a stereo clip
    became 2 samples, silently)."""
    path = files[name]
    want = hf_load_audio(path, RATE, backend="soundfile")
    lossless = ("float32", "float64", "int32") + (("int16",) if FILES[name][3] in ("PCM_16", "PCM_U8") else ())
    for dtype in lossless:  # int16 of a 24-bit file drops its low bits
        data, rate = soundfile.read(path, dtype=dtype)
        assert data.ndim == 2 and data.shape[1] == FILES[name][1]
        got = load_audio((data, rate), RATE)
        np.testing.assert_array_equal(got, want, err_msg=dtype)
        got_cn = load_audio({"array": np.ascontiguousarray(data.T), "sampling_rate": rate}, RATE)  # [channels, n]
        np.testing.assert_array_equal(got_cn, want, err_msg=dtype)
    data, rate = soundfile.read(path, dtype="float32")
    np.testing.assert_array_equal(load_audio((torch.from_numpy(data), rate), RATE), want)  # a tensor, [n, channels]


def test_uint8_samples_are_offset_binary():
    """8-bit WAV samples are unsigned (128 is silence; ``scipy.io.wavfile.read`` returns them as uint8): the
    old code scaled them by 1/256 without the offset (a DC shift of +0.5)."""
    data = _wav(_tone(0.5, RATE), RATE, "PCM_U8")
    want = soundfile.read(io.BytesIO(data), dtype="float32")[0]
    raw = np.frombuffer(data[44:], np.uint8)
    assert raw.shape == want.shape
    got = load_audio((raw, RATE), RATE)
    np.testing.assert_array_equal(got, want)
    assert abs(float(got.mean()) - float(want.mean())) < 1e-6
    s8 = np.round(want * 128).astype(np.int8)  # signed 8-bit PCM: x / 128
    np.testing.assert_array_equal(load_audio((s8, RATE), RATE), s8.astype(np.float32) / 128)


def test_integer_samples_read_back_from_arrow_are_refused():
    """int16 samples in a ``datasets`` column come back as Python ints (int64): their full scale is
    unknown; the old code divided by 2**63 and the clip became silence (peak ~1e-15)."""
    import datasets

    pcm = (_tone(0.5, RATE) * 20000).astype(np.int16)
    ds = datasets.Dataset.from_list([{"audios": [{"array": pcm, "sampling_rate": RATE}]}])
    clip = ds[0]["audios"][0]
    assert isinstance(clip["array"], list)
    with pytest.raises(AudioError, match="wider than 32 bits") as e:
        load_audio(clip, RATE, where="row 6", column="audios")
    assert "row 6" in str(e.value) and e.value.column == "audios" and "np.int16" in e.value.fix
    typed = {"array": np.asarray(clip["array"], np.int16), "sampling_rate": RATE}  # the fix
    np.testing.assert_array_equal(load_audio(typed, RATE), pcm.astype(np.float32) / 32768)
    numpy_format = ds.with_format("numpy")[0]["audios"][0]["array"]  # datasets' numpy format: int64 as well
    assert numpy_format.dtype == np.int64
    with pytest.raises(AudioError, match="wider than 32 bits"):
        load_audio({"array": numpy_format, "sampling_rate": RATE}, RATE)


@pytest.mark.parametrize("value, words", [
    ({"array": [[0.0, 1.0], [0.0]], "sampling_rate": RATE}, "numeric array"),  # ragged channels
    ({"array": [0.0] * 10, "sampling_rate": float("inf")}, "sampling rate"),
    ({"array": [0.0] * 10, "sampling_rate": float("nan")}, "sampling rate"),
    ((RATE, np.zeros(100, np.float32)), "scipy.io.wavfile.read"),  # scipy's (rate, data) order
    ({"array": np.zeros((3, 3), np.float32), "sampling_rate": RATE}, "ambiguous"),
    ({"array": np.zeros((0, 2), np.float32), "sampling_rate": RATE}, "no samples"),  # an empty stereo read
    ({"array": np.zeros(100, np.int64), "sampling_rate": RATE}, "wider than 32 bits"),
])
def test_odd_arrays_are_typed(value, words):
    with pytest.raises(AudioError) as e:
        load_audio(value, RATE, where="row 3, audio 0", column="audios")
    assert words in str(e.value) and "row 3" in str(e.value) and e.value.column == "audios" and e.value.fix


def test_a_cut_wav_is_refused():
    """A WAV cut short (an interrupted copy) keeps its header's data size; libsndfile (and so the chat
    path) reads what is there without a word: the old code loaded half the clip."""
    data = _wav(_tone(1.3, 22050), 22050)
    assert load_audio(data, RATE).shape == (20800,)
    for cut in (len(data) // 2, 2000):
        with pytest.raises(AudioError, match="truncated") as e:
            load_audio(data[:cut], RATE, where="row 1, audio 0")
        assert e.value.expected == "28665 frames (the header's data size)" and "re-download" in e.value.fix


def test_wavs_of_other_writers_are_not_taken_for_cut(tmp_path):
    """No false alarm: Python's ``wave`` (odd 8-bit data, padded), a streamed header (size 0xFFFFFFFF),
    a LIST chunk after the data: each loads as the chat path loads it."""
    pcm = (_tone(0.5, RATE) * 12000).astype(np.int16)
    out = {}
    for name, width, x in (("wave16", 2, pcm.tobytes()), ("wave8_odd", 1, (pcm[:4001] // 256 + 128).astype(np.uint8).tobytes())):
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(width)
            w.setframerate(RATE)
            w.writeframes(x)
        out[name] = buf.getvalue()
    streamed = bytearray(out["wave16"])
    streamed[40:44] = struct.pack("<I", 0xFFFFFFFF)
    out["streamed"] = bytes(streamed)
    listed = bytearray(out["wave16"] + b"LIST" + struct.pack("<I", 9) + b"INFOabcde\0")
    listed[4:8] = struct.pack("<I", len(listed) - 8)
    out["list_after_data"] = bytes(listed)
    for name, data in out.items():
        path = tmp_path / f"{name}.wav"
        path.write_bytes(data)
        np.testing.assert_array_equal(load_audio(data, RATE), hf_load_audio(str(path), RATE, backend="soundfile"),
                                      err_msg=name)


def _stand_in(fe, audio_kwargs=None):
    """What `clip_limit` / `load_clips` read of a processor: its extractor and its call's audio keywords."""
    return types.SimpleNamespace(feature_extractor=fe, audio_kwargs=audio_kwargs)


@pytest.mark.parametrize("name", ["Gemma3nAudioFeatureExtractor", "Gemma4AudioFeatureExtractor"])
def test_extractors_that_cut_at_30_s_refuse_longer_clips(name):
    """Gemma 3n's and Gemma 4's extractors cut a clip at ``max_length=480000`` samples (30 s) by default and
    their processors' calls keep that: a 31 s clip gives the 30 s clip's features. The old `clip_limit`
    read only Whisper's ``n_samples`` and let such clips be cut silently."""
    import transformers

    fe = getattr(transformers, name)()
    x = (0.1 * np.random.default_rng(0).standard_normal(RATE * 31)).astype(np.float32)
    cut = fe([x[: RATE * 30]], return_tensors="np")["input_features"]
    whole = fe([x], return_tensors="np")["input_features"]
    np.testing.assert_array_equal(whole, cut)  # the extractor's own call drops the last second
    proc = _stand_in(fe)
    assert clip_limit(proc, fe) == RATE * 30
    assert load_clips(proc, [(x[: RATE * 30], RATE)], "row 0")[0].shape == (RATE * 30,)
    with pytest.raises(AudioError, match="would cut the rest") as e:
        load_clips(proc, [(x, RATE)], "row 4")
    assert "row 4" in str(e.value) and "30.00 s" in str(e.value)
    assert clip_limit(_stand_in(fe, {"truncation": False}), fe) == 0  # a call that keeps the clip whole


def test_clip_limits_of_the_other_audio_processors():
    import transformers

    from mmpipe.offline import qwen3_omni, qwen_omni

    q25, q3 = qwen_omni.build_processor(), qwen3_omni.build_processor()
    assert clip_limit(q25, q25.feature_extractor) == 480000  # Whisper's n_samples: the call truncates
    assert clip_limit(q3, q3.feature_extractor) == 0  # its call sets truncation=False
    phi = transformers.Phi4MultimodalFeatureExtractor()
    assert clip_limit(_stand_in(phi), phi) == 0  # its extractor does not truncate


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen_omni import build_model, build_processor

    torch.manual_seed(0)
    return build_processor(), build_model()


def _ask(n_clips: int, reply: str) -> list:
    return [{"role": "user", "content": [{"type": "audio"}] * n_clips + [{"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": reply}]}]


def test_damaged_rows_are_skipped_and_counted(omni, files):
    import datasets

    from mmpipe.audio.samples import video_with_sound

    proc, _ = omni
    good = open(files["pcm16_16k.wav"], "rb").read()
    silent_video, _ = video_with_sound(0.5, fmt="mp4", sound=False)
    empty = _wav(np.zeros(0), RATE)
    clips = [good, b"", np.random.default_rng(0).bytes(3000), good[:20], good[: len(good) // 2], silent_video, empty,
             open(files["stereo_44k.mp3"], "rb").read()]
    ds = datasets.Dataset.from_list([{"messages": _ask(1, "A tone."), "audios": [c]} for c in clips])
    enc, report = mmpipe.encode_dataset(ds, proc, on_error="skip")
    assert len(enc) == 2
    assert [(e["row"], e["stage"], e["column"]) for e in report.errors] == [(i, "audio", "audios") for i in range(1, 7)]
    assert "truncated" in report.errors[3]["reason"] and "no samples" in report.errors[5]["reason"]


def test_rows_of_user_clips_batch_as_each_row_alone(omni, files):
    """Rows whose clips come as files of other rates and layouts and as ``soundfile.read`` tuples: encode ==
    the processor's flat call on the clips the chat path loads, and the tiny thinker's batched logits
    (left padding) == each row's own call."""
    proc, model = omni
    stereo = soundfile.read(files["pcm16_8k_stereo.wav"], dtype="float32")
    raws = [
        {"messages": _ask(1, "A tone."), "audios": [files["pcm24_22k_51.wav"]]},
        {"messages": _ask(2, "Two."), "audios": [files["u8_48k_stereo.wav"], files["stereo_44k.mp3"]]},
        {"messages": _ask(1, "Stereo."), "audios": [stereo]},
        {"messages": _ask(1, "Ogg."), "audios": [{"path": files["vorbis_22k.ogg"], "bytes": None}]},
    ]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    refs = [own_call(proc, r) for r in raws]
    for i, (row, ref) in enumerate(zip(rows, refs)):
        np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0].numpy(), err_msg=f"row {i}")
        for k in ("input_features", "feature_attention_mask"):
            np.testing.assert_array_equal(row.vision[k], ref[k].numpy(), err_msg=f"row {i}: {k}")
    assert rows[2].vision["feature_attention_mask"].sum() == 70  # 0.7 s at hop 160, not 2 samples
    batch = invariants.assert_roundtrip(rows, padding_side="left")
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5, rtol=1e-5)


@pytest.mark.needs_env("vision")
@pytest.mark.parametrize("name", ["gemma3n", "gemma4"])
def test_gemma_processors_refuse_clips_they_would_cut(name):
    """The real Gemma 3n / Gemma 4 processors (vision environment): a 30 s clip encodes as the processor's
    own call; a 31 s clip, which that call cuts to its first 30 s, is an `AudioError` naming the row."""
    from mmpipe.offline.vision_env_vlms import build_vision_env_processor

    proc = build_vision_env_processor(name)
    x = (0.1 * np.random.default_rng(1).standard_normal(RATE * 31)).astype(np.float32)
    row = lambda n: {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]}],  # noqa: E731
                     "audios": [{"array": x[:n], "sampling_rate": RATE}]}
    got = mmpipe.encode_row(row(RATE * 30), proc, idx=0)
    own = proc(text=[proc.apply_chat_template(row(0)["messages"], tokenize=False, add_generation_prompt=True)],
               audio=[x[: RATE * 30]], sampling_rate=RATE, return_tensors="np", add_special_tokens=False)
    np.testing.assert_array_equal(got.vision["input_features"], own["input_features"])
    with pytest.raises(AudioError, match="would cut the rest") as e:
        mmpipe.encode_row(row(RATE * 31), proc, idx=9)
    assert e.value.row == 9 and e.value.column == "audios"


@pytest.mark.parametrize("builder", ["qwen_omni", "qwen3_omni"])
def test_clips_shorter_than_one_window_are_refused(builder):
    """A clip under one analysis window of the extractor (Whisper's n_fft: 400 samples, 25 ms): the
    processor's own call gives Qwen2.5-Omni's no audio token (the model never hears it) and crashes
    Qwen3-Omni's; the old code encoded the first silently and blamed the second on the row's messages."""
    import importlib

    proc = importlib.import_module(f"mmpipe.offline.{builder}").build_processor()
    aid = proc.tokenizer.convert_tokens_to_ids(proc.audio_token)
    ask = lambda n: {"messages": _ask(1, "ok")[:1],  # noqa: E731
                     "audios": [{"array": np.full(n, 0.1, np.float32), "sampling_rate": RATE}]}
    text = proc.apply_chat_template(ask(0)["messages"], tokenize=False, add_generation_prompt=True)
    try:
        own = proc(text=[text], audio=[np.full(150, 0.1, np.float32)], sampling_rate=RATE, return_tensors="np")
        assert (own["input_ids"] == aid).sum() == 0  # the clip is gone
    except RuntimeError:
        assert builder == "qwen3_omni"
    with pytest.raises(AudioError, match="analysis window") as e:
        mmpipe.encode_row(ask(399), proc, idx=7)
    assert e.value.row == 7 and e.value.column == "audios" and e.value.expected.startswith("at least 400 samples")
    assert (mmpipe.encode_row(ask(400), proc).input_ids == aid).sum() >= 1


def test_a_silent_video_in_the_call_keywords_names_its_row():
    """`mmpipe.audio.omni_video.call_kwargs` refusing a video without sound: once located (encode's
    ``locate(row=...)``) the message names the row (the old one held only "video 0")."""
    from mmpipe.audio.omni_video import call_kwargs

    with pytest.raises(AudioError) as e:
        call_kwargs(["audio", "video"], [np.zeros(400, np.float32)], [None])
    e.value.locate(row=3)
    assert str(e.value).startswith("row 3: use_audio_in_video: video 0 of this row has no sound")
    assert e.value.column == "videos" and e.value.fix


def _as_chat_path(proc, item: dict) -> list:
    """One user turn holding audio ``item`` and a reply: mmpipe's row equals the processor's chat path
    (ids and ``input_features``); -> the messages."""
    msgs = [{"role": "user", "content": [item, {"type": "text", "text": "?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    own = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    row = mmpipe.encode_row({"messages": msgs}, proc)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    np.testing.assert_array_equal(row.vision["input_features"], own["input_features"])
    return msgs


def test_data_uris_load_as_the_chat_path(omni, files):
    """A clip given as a ``data:audio/...;base64,`` URI (the chat path's ``load_audio`` decodes it; an
    OpenAI-style ``audio_url`` holds one): encoded as the chat path encodes it, stored by
    ``audio="source"`` as the file's bytes. The old code looked for a file of that name."""
    import base64

    proc, _ = omni
    data = open(files["stereo_44k.mp3"], "rb").read()
    uri = "data:audio/mpeg;base64," + base64.b64encode(data).decode()
    np.testing.assert_array_equal(load_audio(uri, RATE), load_audio(data, RATE))
    msgs = _as_chat_path(proc, {"type": "audio", "audio": uri})
    assert mmpipe.encode_row({"messages": msgs}, proc, audio="source").audio_sources == [data]
    for bad in ("data:audio/wav;base64,@@@@", "data:audio/wav,plain"):
        with pytest.raises(AudioError, match="not valid base64") as e:
            load_audio(bad, RATE, where="row 2, audio 0")
        assert "row 2" in str(e.value) and e.value.fix
    with pytest.raises(AudioError, match="does not exist") as e:
        load_audio("https://example.com/a.wav", RATE)
    assert e.value.found == "a URL (not fetched)" and "download" in e.value.fix


def test_audio_items_by_url_and_bad_base64(omni, files):
    """An item ``{"type": "audio", "url": path}`` (the chat path reads it) was taken for a bare
    placeholder (a PlaceholderError: 0 clips in 'audios'); ``input_audio`` data that is not base64
    raised a bare ``binascii.Error``."""
    proc, _ = omni
    path = str(files["stereo_44k.mp3"])
    _as_chat_path(proc, {"type": "audio", "url": path})
    bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "!!!not base64",
                                                                               "format": "wav"}},
                                        {"type": "text", "text": "?"}]}]
    with pytest.raises(AudioError, match="not base64") as e:
        mmpipe.encode_row({"messages": bad}, proc, idx=4)
    assert e.value.row == 4 and e.value.column == "audios" and e.value.fix


def test_a_long_file_is_refused_by_its_header(tmp_path, monkeypatch):
    """A file over the processor's limit by its header is refused before it is decoded (the old code
    decoded and resampled it whole first: an hour of 48 kHz stereo FLAC took 15 s and 2 GB of memory
    to refuse); one within 1 % of it is decoded and refused by its exact length."""
    path = tmp_path / "long.flac"
    soundfile.write(str(path), _tone(45, 8000), 8000)
    near = tmp_path / "near.flac"
    soundfile.write(str(near), _tone(30.2, 8000), 8000)
    reads = []
    real_read = soundfile.SoundFile.read
    monkeypatch.setattr(soundfile.SoundFile, "read", lambda self, *a, **k: reads.append(1) or real_read(self, *a, **k))
    for value in (str(path), path.read_bytes(), {"path": str(path), "bytes": None}):
        with pytest.raises(AudioError, match="the clip is 45.00 s; the processor takes at most 30.00 s") as e:
            load_audio(value, RATE, where="row 8, audio 0", max_samples=RATE * 30)
        assert "row 8" in str(e.value) and e.value.found == f"{RATE * 45} samples"
    assert reads == []
    with pytest.raises(AudioError, match="the clip is 30.20 s"):
        load_audio(str(near), RATE, max_samples=RATE * 30)
    assert reads == [1]
    assert load_audio(str(path), RATE).shape == (RATE * 45,)  # no limit: the whole clip


@pytest.mark.parametrize("rate", [16, 44.1, 22050.5, 10**12])
def test_a_rate_that_is_no_audio_rate_is_refused(rate):
    """A rate in kHz (16 for 16 kHz) made a 1 s clip a 1000 s one (Qwen3-Omni: 13000 audio tokens instead of
    13, silently); a fractional rate was cut to an integer; 1e12 Hz shrank the clip to one sample."""
    x = _tone(1.0, RATE).astype(np.float32)
    with pytest.raises(AudioError) as e:
        load_audio({"array": x, "sampling_rate": rate}, RATE, where="row 5, audio 0")
    assert "row 5" in str(e.value) and e.value.column == "audios" and e.value.fix
    for ok in (8000, 8000.0, np.int64(22050), np.float32(48000)):
        assert load_audio({"array": x, "sampling_rate": ok}, RATE).size == int(np.ceil(x.size * RATE / int(ok)))
