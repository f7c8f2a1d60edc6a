"""Audio rows as users bring them (second hunt): what mmpipe got wrong, and the invariants that held.

Fixed here (each test failed on the old code):
- integer PCM that reached mmpipe as floats (a ``datasets`` column whose float rows turn its int16
  rows into float32; ``int16_array.astype(np.float32)``) was encoded unscaled, silently: Whisper's
  features differed from the scaled clip's by 2.26; now an `AudioError` naming the fix;
- Gemma 3n: a 385-512 sample clip passed the window check (512) but its extractor unfolds
  frame_length + 1 samples a frame: 0 feature frames under 16 audio tokens; now refused;
- ``use_audio_in_video``: a video whose sound track is under one analysis window was encoded by
  Qwen2.5-Omni with no audio token (silently) and crashed Qwen3-Omni's extractor (an `InputError`
  blaming the row's image items); now the clip's `AudioError`, naming the video;
- a missing clip (None, an all-null ``{"path", "bytes"}``) now says so instead of "must be a path...";
- ``datasets.map(Encoder, num_proc=2)`` hung forever once the parent had encoded an audio row (a first
  look at one row): Whisper's torch STFT deadlocks in a forked child of a process that ran one.

Held (kept as regression checks): clip forms (int PCM, stereo either layout, 8 / 44.1 / 48 kHz,
30.0 s at 44.1 kHz, silence) equal the processor's chat path bit for bit; ``audio="source"``
through ``datasets.map(num_proc=2)`` + save/load + Collator equals features storage; a batch mixing
audio, image and text rows unbatches to its rows and gives each row's logits; the CLI's
``--on-error skip`` counts and names bad clips.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

import mmpipe  # noqa: E402
from mmpipe.errors import AudioError  # noqa: E402

RATE = 16000


def _tone(n: int, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """float32 [channels, n]: a tone with a little noise."""
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * (300 + 40 * seed) * t) + 0.05 * np.random.default_rng(seed).uniform(-1, 1, n)
    return np.stack([x, -0.5 * x][:channels]).astype(np.float32)


def _msgs(n_audio: int = 1, n_image: int = 0) -> list:
    content = [{"type": "audio"}] * n_audio + [{"type": "image"}] * n_image + [{"type": "text", "text": "what?"}]
    return [{"role": "user", "content": content}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]


def _wav(x: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, x, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen_omni import build_processor

    return build_processor()


# ---- fixed ------------------------------------------------------------------------------------
def test_int_pcm_that_arrived_as_floats_is_refused(omni):
    """A ``datasets`` column holding a float clip and an int16 clip stores both as float32: the int16
    samples came back as floats up to 32767 and were encoded unscaled (features off by 2.26)."""
    datasets = pytest.importorskip("datasets")
    t = np.arange(RATE) / RATE
    i16 = np.round(0.2 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    ds = datasets.Dataset.from_list([{"messages": _msgs(), "audios": [{"array": _tone(RATE, RATE)[0], "sampling_rate": RATE}]},
                                     {"messages": _msgs(), "audios": [{"array": i16, "sampling_rate": RATE}]}])
    mmpipe.encode_row(ds[0], omni, idx=0)
    with pytest.raises(AudioError, match="integer PCM not scaled") as e:
        mmpipe.encode_row(ds[1], omni, idx=1)
    assert e.value.row == 1 and e.value.column == "audios" and "np.int16" in e.value.fix
    with pytest.raises(AudioError, match="peak at 6553"):
        mmpipe.audio.load_audio((i16.astype(np.float32), RATE), RATE)
    # the int16 samples themselves are scaled as soundfile reads them; float peaks past 1.0 (headroom) load
    np.testing.assert_array_equal(mmpipe.audio.load_audio((i16, RATE), RATE), i16.astype(np.float32) / 32768)
    hot = 3.0 * _tone(RATE, RATE)[0]
    np.testing.assert_array_equal(mmpipe.audio.load_audio({"array": hot, "sampling_rate": RATE}, RATE), hot)
    nan = hot.copy()
    nan[3] = np.inf  # non-finite samples keep their own message
    with pytest.raises(AudioError, match="NaN or infinite"):
        mmpipe.audio.load_audio((nan, RATE), RATE)


def test_gemma3n_clip_of_one_frame_length_is_refused():
    """Gemma 3n's extractor unfolds frame_length + 1 = 513 samples a frame: a 512-sample clip passed the
    old check (512) and gave 0 feature frames under its 16 audio tokens."""
    from mmpipe.audio.clips import clip_window
    from mmpipe.offline.gemma3n import build_processor

    proc = build_processor()
    assert clip_window(proc.feature_extractor) == 513
    row = lambda n: {"messages": _msgs(), "audios": [{"array": np.full(n, 0.1, np.float32), "sampling_rate": RATE}]}  # noqa: E731
    with pytest.raises(AudioError, match="shorter than one analysis window of Gemma3nAudioFeatureExtractor") as e:
        mmpipe.encode_row(row(512), proc, idx=2)
    assert e.value.row == 2 and e.value.expected.startswith("at least 513 samples")
    assert mmpipe.encode_row(row(513), proc).vision["input_features"].shape[1] == 1


def _video_with_short_sound(n: int) -> bytes:
    """A 2 s mkv (4 fps) whose PCM sound track holds only ``n`` samples at 16 kHz."""
    from fractions import Fraction

    av = pytest.importorskip("av")
    from mmpipe.audio.samples import _sound_stream, _write_sound, tone

    buf = io.BytesIO()
    base = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    with av.open(buf, "w", format="matroska") as c:
        v = c.add_stream("mpeg4", rate=Fraction(4))
        v.height, v.width, v.pix_fmt = 48, 64, "yuv420p"
        a = _sound_stream(c, "pcm_s16le", RATE, 1)
        for i in range(8):
            for p in v.encode(av.VideoFrame.from_ndarray(np.roll(base, 3 * i, 1), format="rgb24")):
                c.mux(p)
        for p in v.encode():
            c.mux(p)
        _write_sound(c, a, tone(n, RATE), RATE)
    return buf.getvalue()


def test_video_sound_track_under_one_window_is_refused(omni):
    """``use_audio_in_video`` loads each video's sound as a clip is loaded: one shorter than an analysis
    window (here 160 samples, 10 ms) is the video's `AudioError` (the old code let Qwen2.5-Omni encode
    it with no audio token and Qwen3-Omni's extractor crash)."""
    from mmpipe.encoding.video_sound import load_video_sounds
    from mmpipe.images.video import VideoOptions

    enc = SimpleNamespace(processor=omni, video_opts=VideoOptions(fps=4.0), videos_column="clips")
    with pytest.raises(AudioError, match="the video's sound track is 10.0 ms, shorter than one analysis window") as e:
        load_video_sounds(enc, [_video_with_short_sound(160)], "row 5")
    assert e.value.column == "clips" and "use_audio_in_video=False" in e.value.fix and "video 0" in str(e.value)
    frames, waves = load_video_sounds(enc, [_video_with_short_sound(400)], "row 5")
    assert len(frames) == 1 and waves[0].shape == (400,)


@pytest.mark.needs_env("vision")
@pytest.mark.parametrize("builder", ["qwen_omni", "qwen3_omni"])
def test_video_sound_track_under_one_window_through_the_encoder(builder):
    """The same through ``Encoder(use_audio_in_video=True)`` with the thinkers' video processors."""
    import importlib

    proc = importlib.import_module(f"mmpipe.offline.{builder}").build_processor(videos=True)
    enc = mmpipe.Encoder(proc, use_audio_in_video=True, video_options={"fps": 4.0})
    row = lambda n: {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]},  # noqa: E731
                                  {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
                     "videos": [_video_with_short_sound(n)]}
    with pytest.raises(AudioError, match="shorter than one analysis window") as e:
        enc.encode_row(row(160), idx=5)
    assert e.value.row == 5 and e.value.column == "videos"
    aid = proc.tokenizer.convert_tokens_to_ids(proc.audio_token)
    assert (enc.encode_row(row(400)).input_ids == aid).sum() == 1


FORKED_MAP = """
import numpy as np, datasets, mmpipe
from mmpipe.offline.qwen_omni import build_processor
proc = build_processor()
m = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
rows = [{"messages": m, "audios": [{"array": (0.1 * np.sin(np.arange(16000 + 999 * i) / 7)).astype(np.float32),
                                    "sampling_rate": 16000}]} for i in range(4)]
mmpipe.encode_row(rows[0], proc)  # a first look at one row: Whisper's torch STFT runs in the parent
ds = datasets.Dataset.from_list(rows)
out = ds.map(mmpipe.Encoder(proc), with_indices=True, num_proc=2, remove_columns=ds.column_names)
print("mapped", len(out))
"""


def test_forked_map_after_a_clip_in_the_parent_does_not_hang():
    """Encoding one audio row in the parent, then ``datasets.map(Encoder, num_proc=2)``: the forked
    workers' first torch STFT (Whisper's extractor) deadlocked, forever (run in a child process here so
    that the old code fails instead of hanging the suite)."""
    import subprocess
    import sys

    pytest.importorskip("datasets")
    try:
        done = subprocess.run([sys.executable, "-c", FORKED_MAP], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("datasets.map(num_proc=2) hung after an audio row was encoded in the parent")
    assert done.returncode == 0 and "mapped 4" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("clip", [None, {"path": None, "bytes": None}])
def test_a_missing_clip_says_so(omni, clip):
    with pytest.raises(AudioError, match="the audio clip is missing") as e:
        mmpipe.encode_row({"messages": _msgs(), "audios": [clip]}, omni, idx=4)
    assert e.value.row == 4 and "drop its audio item" in e.value.fix


# ---- held: regression checks ----------------------------------------------------------------
def _chat_path_equal(proc, clip, file_samples: np.ndarray, file_rate: int, subtype: str, tmp_path) -> None:
    """mmpipe's row of ``clip`` == the processor's chat path given the same samples as a file (what
    transformers loads), bit for bit: ids and every audio output."""
    path = tmp_path / f"clip_{len(list(tmp_path.iterdir()))}.wav"
    soundfile.write(str(path), file_samples, file_rate, subtype=subtype)
    item = {"type": "audio", "path": str(path)}
    own = proc.apply_chat_template([{**_msgs()[0], "content": [item, _msgs()[0]["content"][1]]}, _msgs()[1]],
                                   tokenize=True, return_dict=True, return_tensors="np")
    row = mmpipe.encode_row({"messages": _msgs(), "audios": [clip]}, proc)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    for k in ("input_features", "feature_attention_mask"):
        np.testing.assert_array_equal(row.vision[k], own[k], err_msg=k)


def test_clip_forms_equal_the_chat_path(omni, tmp_path):
    for rate in (8000, 44100, 48000):
        x = _tone(2 * rate + 7, rate)[0]
        _chat_path_equal(omni, {"array": x, "sampling_rate": rate}, x, rate, "FLOAT", tmp_path)
    st = _tone(RATE, 44100, channels=2)
    _chat_path_equal(omni, {"array": st, "sampling_rate": 44100}, st.T, 44100, "FLOAT", tmp_path)  # [2, n]
    i16 = np.round(st * 32767).astype(np.int16).T  # [n, 2]
    _chat_path_equal(omni, (i16, 44100), i16, 44100, "PCM_16", tmp_path)
    i32 = (_tone(RATE, RATE)[0].astype(np.float64) * 2**31).astype(np.int32)
    _chat_path_equal(omni, {"array": i32, "sampling_rate": RATE}, i32, RATE, "PCM_32", tmp_path)
    edge = _tone(30 * 44100, 44100)[0]  # 30.0 s: 480000 samples at 16 kHz, the most Whisper's call takes
    _chat_path_equal(omni, {"array": edge, "sampling_rate": 44100}, edge, 44100, "FLOAT", tmp_path)
    with pytest.raises(AudioError, match="would cut the rest"):
        mmpipe.encode_row({"messages": _msgs(), "audios": [(_tone(30 * 44100 + 441, 44100)[0], 44100)]}, omni)
    silence = np.zeros(RATE, np.float32)
    _chat_path_equal(omni, {"array": silence, "sampling_rate": RATE}, silence, RATE, "FLOAT", tmp_path)


SOURCE_ROUND_TRIP = """
import io, sys, numpy as np, soundfile, datasets, mmpipe
from mmpipe.offline.qwen_omni import build_processor
proc, tmp = build_processor(), sys.argv[1]
def wav(n, seed):
    t = np.arange(n) / 22050
    x = (0.3 * np.sin(2 * np.pi * (300 + 40 * seed) * t)).astype(np.float32)
    buf = io.BytesIO(); soundfile.write(buf, x, 22050, format="WAV", subtype="PCM_16"); return buf.getvalue()
def msgs(n):
    return [{"role": "user", "content": [{"type": "audio"}] * n + [{"type": "text", "text": "what?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
rows = [{"messages": msgs(i % 3), "audios": [{"bytes": wav(8000 + 3000 * k + 500 * i, i + k), "path": None}
                                              for k in range(i % 3)]} for i in range(4)]
ds = datasets.Dataset.from_list(rows).cast_column("audios", datasets.List(datasets.Audio(decode=False)))
got = {}
for mode in ("features", "source"):
    enc = ds.map(mmpipe.Encoder(proc, audio=mode), with_indices=True, num_proc=2, remove_columns=ds.column_names)
    enc.save_to_disk(f"{tmp}/{mode}")
    enc = datasets.load_from_disk(f"{tmp}/{mode}")
    got[mode] = mmpipe.Collator(proc)([enc[i] for i in range(len(enc))]).model_inputs()
assert sorted(got["features"]) == sorted(got["source"])
assert all(bool((v == got["source"][k]).all()) for k, v in got["features"].items())
print("equal", sorted(got["source"]))
"""


def test_source_storage_through_datasets_equals_features(tmp_path):
    """``audio="source"`` through ``datasets.map(num_proc=2)`` + save_to_disk + load_from_disk + Collator
    == the processor's features stored (a fresh process: see the report on forked workers hanging)."""
    import subprocess
    import sys

    pytest.importorskip("datasets")
    try:
        done = subprocess.run([sys.executable, "-c", SOURCE_ROUND_TRIP, str(tmp_path)], capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("datasets.map(num_proc=2) hung")
    assert done.returncode == 0 and "equal" in done.stdout, done.stderr[-2000:]


def test_mixed_audio_image_text_batch_is_each_row():
    from PIL import Image

    from mmpipe.offline.qwen_omni import build_model, build_processor
    from mmpipe.testing import invariants

    proc, model = build_processor(), build_model()
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), np.uint8))
    raws = [{"messages": _msgs(1), "audios": [(_tone(RATE, RATE)[0], RATE)]}, {"messages": _msgs(0)},
            {"messages": _msgs(0, 1), "images": [img]},
            {"messages": _msgs(1, 1), "audios": [(_tone(35000, RATE, seed=2)[0], RATE)], "images": [img]}]
    rows = [mmpipe.encode_row(r, proc, idx=i, audio="source") for i, r in enumerate(raws)]
    batch = mmpipe.Collator(proc, padding_side="left")(rows)
    invariants.assert_roundtrip(rows, batch=batch)
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)


def test_cli_skip_counts_and_names_bad_clips(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    from mmpipe.cli.main import main

    (tmp_path / "media").mkdir()
    good = _tone(RATE, RATE)[0]
    soundfile.write(str(tmp_path / "media" / "good.wav"), good, RATE)
    bad = good.copy()
    bad[3] = np.nan
    soundfile.write(str(tmp_path / "media" / "nan.wav"), bad, RATE, subtype="FLOAT")
    data = (tmp_path / "media" / "good.wav").read_bytes()
    (tmp_path / "media" / "cut.wav").write_bytes(data[: len(data) // 2])
    names = ["good", "nan", "cut", "missing"]
    with open(tmp_path / "rows.jsonl", "w") as f:
        for n in names:
            f.write(json.dumps({"messages": _msgs(), "audios": [f"media/{n}.wav"]}) + "\n")
    cwd = os.getcwd()
    os.chdir(tempfile.gettempdir())  # relative clip paths are the input file's
    try:
        status = main(["encode", str(tmp_path / "rows.jsonl"), "--processor", "testing:qwen2_5_omni", "--out",
                       str(tmp_path / "enc"), "--on-error", "skip"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    assert status == 0, out
    assert "encoded 1 of 4 rows" in out.out + out.err and "audio: 3" in out.out + out.err
    assert len(datasets.load_from_disk(str(tmp_path / "enc"))) == 1
    from mmpipe.cli.encode import REPORT_FILE

    errors = json.loads((tmp_path / "enc" / REPORT_FILE).read_text())["errors"]
    assert [(e["row"], e["stage"], e["column"]) for e in errors] == [(1, "audio", "audios"), (2, "audio", "audios"),
                                                                      (3, "audio", "audios")]
    assert "NaN" in errors[0]["reason"] and "truncated" in errors[1]["reason"] and "missing.wav" in errors[2]["reason"]
