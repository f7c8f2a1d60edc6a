"""Rows whose videos carry their sound (``Encoder(use_audio_in_video=True)``) on the generic path, for
the tiny Qwen2.5-Omni and Qwen3-Omni-MoE thinkers built offline (vision environment: its video processor needs
torchvision):

- encode == the processor's flat call given the same frames (sampled as qwen-vl-utils samples them,
  2 a second), each video's sound decoded by `mmpipe.audio.load_video_audio` as ``audio=`` with
  ``audio_from_video_indices`` (slot order: the text's audio and video placeholders), ``fps=2.0``:
  ids, ``input_features``, ``feature_attention_mask``, ``pixel_values_videos``, ``video_grid_thw``,
  ``video_second_per_grid`` (and the photo's outputs); the processor's own decode of the sound needs
  torchcodec, which does not load here (`tests/audio/test_omni_video_sound.py`);
- labels are the replies; ``unbatch(collate(rows)) == rows``; the batch hands the model
  ``use_audio_in_video=True`` and its logits equal each row's own, and each row's equal the
  processor's flat call with the flag;
- a video without an audio stream, a frame list, a template without the video's placeholder: typed
  errors naming the row, the column and the fix; without the option a video row is refused saying
  what to pass."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.needs_env("vision")
av = pytest.importorskip("av")

import mmpipe  # noqa: E402
from mmpipe.audio import load_video_audio  # noqa: E402
from mmpipe.audio.samples import tone, video_with_sound  # noqa: E402
from mmpipe.errors import ArgumentError, AudioError, ParseError, VideoError  # noqa: E402
from mmpipe.testing import invariants  # noqa: E402
from audio_rows import assert_rows_equal_calls, sample_and_gaps, write_videos  # noqa: E402

RATE = 16000
KEYS = ("input_features", "feature_attention_mask", "pixel_values_videos", "video_grid_thw", "video_second_per_grid")


@pytest.fixture(scope="module", params=["qwen_omni", "qwen3_omni"])
def omni(request):
    import importlib

    mod = importlib.import_module(f"mmpipe.offline.{request.param}")
    torch.manual_seed(0)
    return mod.build_processor(videos=True), mod.build_model()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = write_videos(tmp_path_factory.mktemp("videos"), {"a.mkv": (3.0, 4, "mkv", RATE, 2, 1),
                                                           "b.mp4": (2.0, 4, "mp4", 44100, 1, 2),
                                                           "c.mkv": (5.0, 2, "mkv", 22050, 1, 3)})
    silent, _ = video_with_sound(2.0, fmt="mp4", sound=False)
    out["silent"] = silent
    return out


def _raws(files) -> list[dict]:
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    photo = mmpipe.testing.tiny_image(60, 80, seed=1)
    return [
        {"messages": [user({"type": "video"}, text("What happens?")), {"role": "assistant", "content": "It moves."}],
         "videos": [files["a.mkv"]]},
        {"messages": [user({"type": "audio"}, {"type": "video"}, {"type": "image"}, text("All three?")),
                      {"role": "assistant", "content": "Yes."}],
         "audios": [{"array": tone(RATE * 3 // 2, RATE, seed=5)[0], "sampling_rate": RATE}],
         "videos": [open(files["b.mp4"], "rb").read()], "images": [photo]},
        {"messages": [user(text("Say hi.")), {"role": "assistant", "content": "Hi!"}]},
        {"messages": [user({"type": "video"}, text("first")), {"role": "assistant", "content": "one"},
                      user({"type": "audio"}, {"type": "video"}, text("and these?")),
                      {"role": "assistant", "content": "two"}],
         "videos": [{"path": files["c.mkv"], "bytes": None}, files["a.mkv"]],
         "audios": [{"array": tone(RATE, RATE, seed=6)[0], "sampling_rate": RATE}]},
    ]


def _frames(path_or_bytes, rate: float = 2.0) -> np.ndarray:
    """The frames qwen-vl-utils samples at ``rate`` fps (min 4, an even count): round(linspace(0, n - 1, k))."""
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with av.open(src) as c:
        s = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
        fps = float(s.average_rate)
    n = len(frames)
    k = int(min(max(n / fps * rate, 4), n) // 2 * 2)
    idx = torch.linspace(0, n - 1, k).round().long().tolist()
    return np.stack([frames[i] for i in idx])


def _video_value(v):
    return v["path"] if isinstance(v, dict) else v


def own_call(proc, raw, rate: float = 2.0) -> dict:
    """The processor's flat call on the row: its template's text, the frames, the clips and each video's
    sound in placeholder order."""
    text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=False)
    videos = [_video_value(v) for v in raw.get("videos", [])]
    clips = [a["array"] for a in raw.get("audios", [])]
    order = [k for m in raw["messages"] if isinstance(m["content"], list) for k in
             (c["type"] for c in m["content"]) if k in ("audio", "video")]
    kw = {}
    if videos:
        waves, c, v, audio, slots = [load_video_audio(x, RATE) for x in videos], iter(clips), 0, [], []
        for kind in order:
            if kind == "audio":
                audio.append(next(c))
                slots.append(None)
            else:
                audio.append(waves[v])
                slots.append(v)
                v += 1
        kw = dict(videos=[_frames(x, rate) for x in videos], audio=audio, audio_from_video_indices=slots,
                  load_audio_from_video=True, fps=rate, sampling_rate=RATE)
    elif clips:
        kw = dict(audio=clips, sampling_rate=RATE)
    return proc(text=[text], images=raw.get("images") or None, return_tensors="pt", **kw)


@pytest.fixture(scope="module")
def encoded(omni, files):
    proc, _ = omni
    enc = mmpipe.Encoder(proc, use_audio_in_video=True)
    raws = _raws(files)
    return enc, raws, [enc.encode_row(r, i) for i, r in enumerate(raws)]


def test_the_layout_names_the_video_outputs(encoded):
    enc, _, rows = encoded
    layout = enc.layout()
    names = {name for name, _, _ in layout.vision}
    assert set(KEYS) <= names and not layout.row_keys
    assert {k for k in layout.audio} == {"input_features", "feature_attention_mask"}


def test_encode_equals_the_processors_flat_call(omni, encoded):
    proc, _ = omni
    _, raws, rows = encoded
    assert_rows_equal_calls(rows, [own_call(proc, raw) for raw in raws])
    assert set(KEYS) <= set(rows[0].vision) and set(KEYS) <= set(rows[3].vision)
    assert rows[3].vision["video_grid_thw"].shape == (2, 3)
    # slot order: row 3 holds video c, then the clip, then video a: 5 s, 1 s, 3 s of features (hop 160)
    assert rows[3].vision["feature_attention_mask"].sum(1).tolist() == [500, 100, 300]
    audio_bos = proc.tokenizer.convert_tokens_to_ids(proc.audio_bos_token)
    assert int((rows[0].input_ids == audio_bos).sum()) == 1  # the video's sound opens its interleaved run


def test_the_sampling_rate_is_the_processors_fps(omni, files):
    """``video_options={"fps": 4.0}``: frames sampled at 4 a second, the processor told ``fps=4.0``
    (``video_second_per_grid`` = temporal patch / 4); encode == that flat call."""
    proc, _ = omni
    raw = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]},
                        {"role": "assistant", "content": "Fast."}], "videos": [files["a.mkv"]]}
    row = mmpipe.Encoder(proc, use_audio_in_video=True, video_options={"fps": 4.0}).encode_row(raw, 0)
    own = own_call(proc, raw, rate=4.0)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0].numpy())
    for k in KEYS:
        np.testing.assert_array_equal(row.vision[k], np.asarray(own[k]), err_msg=k)
    assert row.vision["video_grid_thw"][0, 0] == 6 and row.vision["video_second_per_grid"].tolist() == [0.5]


def test_labels_are_the_replies(omni, encoded):
    proc, _ = omni
    _, raws, rows = encoded
    for raw, row in zip(raws, rows):
        replies = [m["content"] for m in raw["messages"] if m["role"] == "assistant"]
        marked = np.flatnonzero(row.labels != -100)
        runs = np.split(marked, np.flatnonzero(np.diff(marked) != 1) + 1)
        assert [proc.tokenizer.decode(row.input_ids[r]) for r in runs] == [f"{t}<|im_end|>" for t in replies]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batch_equals_rows(omni, encoded, padding_side):
    proc, model = omni
    _, raws, rows = encoded
    batch = invariants.assert_roundtrip(rows, padding_side=padding_side)
    kw = batch.model_inputs()
    assert bool(kw["use_audio_in_video"]) and "position_ids" not in kw
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    # each row alone == the processor's flat call with the flag; without the flag the video rows differ
    with torch.no_grad():
        for i, raw in enumerate(raws):
            own = own_call(proc, raw)
            alone = mmpipe.collate([rows[i]]).model_inputs()
            got = model(**alone).logits
            torch.testing.assert_close(got, model(**own, use_audio_in_video=True).logits, atol=1e-5, rtol=1e-5)
            if "video_grid_thw" in own:
                assert bool(alone["use_audio_in_video"])
                if i == 0:  # the flag matters (with clips too, the model's rope fails without it)
                    assert (got - model(**own).logits).abs().max() > 1e-4
            else:
                assert "use_audio_in_video" not in alone


def test_arrow_round_trip_through_datasets_map(omni, files):
    """Rows of video paths and plain text items through ``ds.map(Encoder(...))`` (the encoder pickled by
    datasets) store and read back as the rows encoded directly."""
    import datasets

    proc, _ = omni
    items = lambda *xs: [{"type": t, "text": x} for t, x in xs]  # noqa: E731
    plain = [{"messages": [{"role": "user", "content": items(("video", None), ("text", "What?"))},
                           {"role": "assistant", "content": items(("text", "It moves."))}],
              "videos": [files["a.mkv"]]},
             {"messages": [{"role": "user", "content": items(("text", "first"), ("video", None), ("video", None))},
                           {"role": "assistant", "content": items(("text", "two"))}],
              "videos": [files["b.mp4"], files["c.mkv"]]},
             {"messages": [{"role": "user", "content": items(("text", "Hi"))},
                           {"role": "assistant", "content": items(("text", "Hi!"))}], "videos": []}]
    ds = datasets.Dataset.from_list(plain)
    enc = mmpipe.Encoder(proc, use_audio_in_video=True)
    out = ds.map(enc, remove_columns=ds.column_names)
    direct = [mmpipe.Encoder(proc, use_audio_in_video=True).encode_row(r, i) for i, r in enumerate(plain)]
    assert direct[1].vision["video_grid_thw"].shape == (2, 3)
    invariants.assert_rows_from_arrow(out.data.table, direct)
    from mmpipe.media.processor_view import table_counts

    assert table_counts(out.data.table, ["generic"] * 3)["videos"] == 3  # `mmpipe inspect` counts them


def test_a_video_without_sound_is_the_rows_audio_error(omni, files):
    proc, _ = omni
    enc = mmpipe.Encoder(proc, use_audio_in_video=True)
    row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]}],
           "videos": [files["silent"]]}
    with pytest.raises(AudioError, match="no audio stream") as e:
        enc.encode_row(row, 7)
    assert e.value.row == 7 and e.value.column == "videos" and "use_audio_in_video=False" in e.value.fix
    frames = {"messages": row["messages"], "videos": [list(_frames(files["silent"]))]}
    with pytest.raises((AudioError, VideoError)) as e:
        enc.encode_row(frames, 3)
    assert e.value.row == 3 and e.value.column == "videos" and e.value.fix
    limit = int(proc.feature_extractor.n_samples) if proc.audio_kwargs.get("truncation", True) else 0
    if limit:  # Qwen2.5-Omni's call cuts sound past 30 s: refused as a clip is (Qwen3-Omni takes it whole)
        long, _ = video_with_sound(limit / RATE + 1, fps=1, size=(16, 16))
        with pytest.raises(AudioError) as e:
            enc.encode_row({"messages": row["messages"], "videos": [long]}, 4)
        assert e.value.row == 4 and e.value.column == "videos"
    inline = {"messages": [{"role": "user", "content": [{"type": "video", "video": files["a.mkv"], "fps": 1.0}]}]}
    with pytest.raises(VideoError, match="per-video options") as e:
        enc.encode_row(inline, 5)
    assert e.value.row == 5 and e.value.column == "videos" and "video_options" in e.value.fix
    inline["messages"][0]["content"][0].pop("fps")
    assert "video_grid_thw" in enc.encode_row(inline, 5).vision  # an inline video without options: encoded
    skip = mmpipe.Encoder(proc, use_audio_in_video=True, on_error="skip")
    assert skip.encode_one(row, 0) is not None and skip.stats.failed


def test_without_the_option_a_video_row_is_refused_saying_what_to_pass(omni, files):
    proc, _ = omni
    row = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]}],
           "videos": [files["a.mkv"]]}
    with pytest.raises(ParseError) as e:
        mmpipe.Encoder(proc).encode_row(row, 2)
    assert e.value.row == 2 and "use_audio_in_video=True" in e.value.fix


def test_the_option_is_refused_where_it_means_nothing(omni):
    from mmpipe.offline.qwen_omni import build_processor
    from mmpipe.offline.builders import build_processor as build_native

    with pytest.raises(ArgumentError, match="video processor"):
        mmpipe.Encoder(build_processor(), use_audio_in_video=True)
    with pytest.raises(ArgumentError, match="use_audio_in_video=True is not available"):
        mmpipe.Encoder(build_native(), use_audio_in_video=True)
    with pytest.raises(ArgumentError, match="audio='source'"):
        mmpipe.Encoder(omni[0], use_audio_in_video=True, audio="source")
    for bad in ({"max_pixels": 4096}, {"nframes": 8}):
        with pytest.raises(ArgumentError, match=next(iter(bad))):
            mmpipe.Encoder(omni[0], use_audio_in_video=True, video_options=bad)
    with pytest.raises(ArgumentError, match="True or False"):
        mmpipe.Encoder(omni[0], use_audio_in_video="yes")


def test_generation_from_video_with_sound_prompts(omni, files):
    """TransformersEngine on prompts holding videos with their sound at temperature 1.0 (the flag reaches
    the prefill through ``model_inputs()``): the media tokens are banned and the teacher-forced logprobs of
    prompt + completion equal the sampled ones."""
    proc, model = omni
    raws = [{"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}],
             "videos": [files["a.mkv"]]},
            {"messages": [{"role": "user", "content": "Say something."}]}]
    enc = mmpipe.Encoder(proc, use_audio_in_video=True, add_generation_prompt=True, labels=False)
    eng, gens, gaps = sample_and_gaps(proc, model, raws, n=2, max_new_tokens=32, seed=3, encoder=enc)
    banned = set(eng.vision_tokens.ids)
    assert all(not banned & set(c.token_ids) for g in gens for c in g.completions)
    assert sum(len(c.token_ids) for g in gens for c in g.completions) > 60 and max(gaps) < 1e-3
