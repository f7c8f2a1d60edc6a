"""Audio rows on the generic path (issue 31): Qwen3-Omni-MoE's thinker processor (the real class, its
feature extractor as published, a tiny real MoE thinker built offline, `mmpipe.offline.qwen3_omni`),
rows with 0..2 clips (files at other rates, arrays with rates, integer PCM) and 0..1 photos.

Qwen3-Omni's processor pads each call's clips to the LONGEST of them (``padding=True``), not to a
fixed 30 s window as Qwen2.5-Omni's does, and cuts nothing (``truncation=False``); so rows hold
features of different frame counts and a batch pads them. Checked:

- encode == the processor's flat call on the row's conversation and clips (ids, input features,
  feature attention masks, pixels, grids: bit for bit) and == its own chat path
  (``apply_chat_template(tokenize=True)``, which loads the files itself); audio token counts ==
  the processor's own ``_get_num_multimodal_tokens``;
- labels are the replies (multi-turn, a clip in the second user turn);
- the invariant harness: ``unbatch(collate(rows)) == rows``, Arrow round trip through ``ds.map``,
  and batched logits (left and right padding) == the thinker on each row's own processor call:
  its audio encoder selects the frames of ``feature_attention_mask`` before convolving, so the
  batch's padded frames never reach it, and its TMRoPE positions are its own ``get_rope_index``;
- the processor's own multi-row call is NOT each row's call (a clip's last frame differs), which
  is why the references are the rows' own calls;
- a 31 s clip (31 encoder chunks) is taken whole; generation with `TransformersEngine`."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.testing import invariants

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")


from audio_rows import (RATE, assert_rows_equal_calls, chat_text, clip, loaded, own_call,  # noqa: E402
                        sample_and_gaps, write_clips)
from helpers import photo_paths  # noqa: E402


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen3_omni import build_model, build_processor

    torch.manual_seed(0)
    return build_processor(), build_model()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return write_clips(tmp_path_factory.mktemp("clips"))


def _photo() -> str:
    return next(p for p in photo_paths() if p.endswith("grace_hopper.jpg"))  # a real-size RGB photo


def _pcm(seconds: float, rate: int, seed: int) -> np.ndarray:
    """int16 PCM samples (full scale 32768)."""
    return np.round(clip(seconds, rate, seed) * 32767).astype(np.int16)


def _raws(clips) -> list[dict]:
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return [
        {"messages": [user({"type": "audio"}, text("What is this sound?")),
                      {"role": "assistant", "content": "A tone."}], "audios": [clips["a.wav"]]},
        {"messages": [user({"type": "image"}, {"type": "audio"}, text("Does the sound fit the picture?")),
                      {"role": "assistant", "content": "No."}],
         "images": [_photo()], "audios": [{"array": clip(1.2, 24000, 7), "sampling_rate": 24000}]},
        {"messages": [user(text("Say hi.")), {"role": "assistant", "content": "Hi!"}]},
        {"messages": [user({"type": "audio"}, text("first")), {"role": "assistant", "content": "one"},
                      user({"type": "audio"}, text("and this?")), {"role": "assistant", "content": "two"}],
         "audios": [clips["b.flac"], {"path": clips["c.ogg"], "bytes": None}]},
        {"messages": [user(text("Compare"), {"type": "audio"}, {"type": "image"}, {"type": "audio"}),
                      {"role": "assistant", "content": "Two tones and a woman."}],
         "images": [_photo()], "audios": [(_pcm(0.7, 8000, 3), 8000), clips["a.wav"]]},
        {"messages": [user({"type": "image"}, text("Who is this?")), {"role": "assistant", "content": "Grace Hopper."}],
         "images": [_photo()]},
    ]


@pytest.fixture(scope="module")
def encoded(omni, clips):
    proc, _ = omni
    raws = _raws(clips)
    return raws, [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]


def test_encode_equals_the_processors_flat_call(omni, encoded):
    proc, _ = omni
    raws, rows = encoded
    assert [(len(r.get("audios", [])), len(r.get("images", []))) for r in raws] == [(1, 0), (1, 1), (0, 0), (2, 0),
                                                                                  (2, 1), (0, 1)]
    assert_rows_equal_calls(rows, [own_call(proc, raw) for raw in raws], dtypes=True)
    # each row's clips padded to the row's longest (hop 160), not to a 30 s window
    assert rows[0].vision["input_features"].shape == (1, 128, 160)
    assert rows[3].vision["input_features"].shape == (2, 128, 230)
    assert rows[3].vision["feature_attention_mask"].sum(1).tolist() == [90, 230]  # 0.9 s and 2.3 s
    assert rows[4].vision["feature_attention_mask"].sum(1).tolist() == [70, 160]
    # tokens per clip: the processor's own count (13 per 100 frames + the remainder's)
    for row in rows:
        if "feature_attention_mask" in row.vision:
            frames = row.vision["feature_attention_mask"].sum(1)
            want = proc._get_num_multimodal_tokens(audio_lengths=(frames * 160).tolist())["num_audio_tokens"]
            assert int((row.input_ids == proc.audio_token_id).sum()) == sum(want)
    assert int((rows[0].input_ids == proc.audio_token_id).sum()) == 21  # 160 frames: 13 + 8


def test_encode_equals_the_processors_chat_path(omni, clips):
    proc, _ = omni
    msgs = [{"role": "user", "content": [{"type": "audio", "path": clips["a.wav"]}, {"type": "image", "path": _photo()},
                                         {"type": "text", "text": "and"}, {"type": "audio", "path": clips["b.flac"]}]},
            {"role": "assistant", "content": [{"type": "text", "text": "two sounds"}]}]
    own = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    row = mmpipe.encode_row({"messages": msgs}, proc)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    assert set(row.vision) == {k for k in own if k not in ("input_ids", "attention_mask")}
    for k in row.vision:
        np.testing.assert_array_equal(row.vision[k], own[k], err_msg=k)
    assert row.vision["input_features"].shape == (2, 128, 160)


def test_no_default_system_turn(omni):
    """The checkpoint renders no system turn unless the row has one (transformers' integration test
    decodes ``user\\n...`` first), unlike Qwen2.5-Omni's default system prompt."""
    proc, _ = omni
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc, add_generation_prompt=True,
                            labels=False)
    assert proc.tokenizer.decode(row.input_ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_renders_the_published_output(omni):
    """The conversation of a public bug report on Qwen/Qwen3-Omni-30B-A3B-Thinking's template
    (sujitnoronha/audio_reasoning_interspeech, docs/QWEN3_OMNI_CHAT_TEMPLATE_BUG_REPORT.md) renders as
    the report's "actual output": a list system content, the audio span before the text, and the
    reply's <think> part rendered away after a list user content."""
    proc, _ = omni
    conv = [{"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
            {"role": "user", "content": [{"type": "audio", "audio": "/path/to/audio.wav"},
                                         {"type": "text", "text": "What sound is this?"}]},
            {"role": "assistant", "content": [{"type": "text",
                                               "text": "<think>\nI hear a bird chirping.\n</think>\n\nANSWER: Bird"}]}]
    assert proc.apply_chat_template(conv, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|audio_start|><|audio_pad|><|audio_end|>What sound is this?<|im_end|>\n"
        "<|im_start|>assistant\nANSWER: Bird<|im_end|>\n")


def test_labels_are_the_replies(omni, encoded):
    proc, _ = omni
    raws, rows = encoded
    tok = proc.tokenizer
    for raw, row in zip(raws, rows):
        replies = [m["content"] for m in raw["messages"] if m["role"] == "assistant"]
        marked = np.flatnonzero(row.labels != -100)
        runs = np.split(marked, np.flatnonzero(np.diff(marked) != 1) + 1)
        assert [tok.decode(row.input_ids[r]) for r in runs] == [f"{t}<|im_end|>" for t in replies]


def test_reasoning_in_replies_follows_the_template(omni, clips):
    """The Qwen3 rule the Omni template carries: a reply's ``<think>`` part is kept only after the
    last string user query. With a list (multimodal) user content it is rendered away (the published
    template's behavior reported for Qwen3-Omni fine-tuning), and the labels are the rendered reply;
    reasoning in an earlier reply of a string conversation is rendered away in the whole conversation
    (not in its prefix): each reply is labelled as the whole conversation renders it (this was a
    refusal before the replies holding reasoning were located by their answers)."""
    proc, _ = omni
    audio_turn = {"role": "user", "content": [{"type": "audio", "path": clips["a.wav"]}, {"type": "text", "text": "?"}]}
    row = mmpipe.encode_row({"messages": [audio_turn, {"role": "assistant", "content": "<think>hm</think>A tone."}]},
                            proc)
    own = proc.apply_chat_template([audio_turn, {"role": "assistant", "content": "<think>hm</think>A tone."}],
                                   tokenize=True, return_dict=True, return_tensors="np")
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    assert proc.tokenizer.decode(row.input_ids[row.labels != -100]) == "A tone.<|im_end|>"
    text_row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "yo"}]}, proc)
    assert proc.tokenizer.decode(text_row.input_ids[text_row.labels != -100]) == "<think>\n\n</think>\n\nyo<|im_end|>"
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>b"},
               {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    row = mmpipe.encode_row({"messages": history}, proc)
    own = proc.apply_chat_template(history, tokenize=True, return_dict=True, return_tensors="np")
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    marked = np.flatnonzero(row.labels != -100)
    runs = np.split(marked, np.flatnonzero(np.diff(marked) != 1) + 1)
    assert [proc.tokenizer.decode(row.input_ids[r]) for r in runs] == ["b<|im_end|>", "<think>\n\n</think>\n\nd<|im_end|>"]
    assert mmpipe.encode_row({"messages": history}, proc, labels=False).labels is None


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batch_equals_rows(omni, encoded, padding_side):
    """Rows whose clips differ in length (0.7 to 2.3 s: 70 to 230 frames) in one batch: the
    features are zero-padded to 230 frames, and the thinker's audio encoder drops the padded frames
    (``feature_attention_mask``), so every row's logits equal the row alone."""
    proc, model = omni
    raws, rows = encoded
    batch = invariants.assert_roundtrip(rows, padding_side=padding_side)
    kw = batch.model_inputs()
    assert "position_ids" not in kw  # TMRoPE: the thinker's own get_rope_index
    assert kw["input_features"].shape == (6, 128, 230) and kw["feature_attention_mask"].shape == (6, 230)
    assert kw["feature_attention_mask"].sum(1).tolist() == [160, 120, 90, 230, 70, 160]
    assert kw["image_grid_thw"].shape == (3, 3)
    refs = [own_call(proc, r) for r in raws]
    logits = invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5,
                                                    rtol=1e-5)
    with torch.no_grad():
        L, gap = logits.shape[1], 0.0
        for b, ref in enumerate(refs):
            alone = model(**ref).logits[0]
            cols = slice(0, len(alone)) if padding_side == "right" else slice(L - len(alone), L)
            gap = max(gap, float((logits[b, cols] - alone).abs().max()))
    print(f"\nqwen3-omni batched ({padding_side}) vs per-row logits: max gap {gap:.1e}")


def test_the_processors_batch_call_is_not_each_rows_call(omni, encoded):
    """The processor's own call on several rows pads every clip to the call's longest before
    Whisper's STFT: a clip that is the longest of its own row (reflect-padded at its end when alone)
    then sees zeros past its end, so its LAST valid frame differs from the row's own call. mmpipe's
    batch keeps each row's features (as encoded), so it equals the rows' own calls."""
    from PIL import Image

    proc, model = omni
    raws, rows = encoded
    images = [Image.open(p) for r in raws for p in r.get("images", [])]
    audios = [loaded(a) for r in raws for a in r.get("audios", [])]
    both = proc(text=[chat_text(proc, r) for r in raws], images=images, audio=audios, return_tensors="np", padding=True)
    own = [(row.vision["input_features"][j], row.vision["feature_attention_mask"][j])
           for row in rows if "input_features" in row.vision for j in range(len(row.vision["input_features"]))]
    assert len(own) == len(audios) == 6
    for j, (feat, mask) in enumerate(own):
        n = int(mask.sum())
        diff = np.abs(both["input_features"][j, :, :n] - feat[:, :n]).max(0)
        longest_of_its_row = n == feat.shape[1]
        padded_in_the_call = n < both["input_features"].shape[2]
        assert np.flatnonzero(diff).tolist() == ([n - 1] if longest_of_its_row and padded_in_the_call else []), j
    ref_gap = 0.0
    with torch.no_grad():
        batched = model(**{k: torch.as_tensor(v) for k, v in both.items()}).logits
        for b, raw in enumerate(raws):
            alone = model(**own_call(proc, raw)).logits[0]
            ref_gap = max(ref_gap, float((batched[b, -len(alone):] - alone).abs().max()))
    print(f"\nqwen3-omni processor's own 6-row call vs per-row calls: max logit gap {ref_gap:.1e}")


def test_a_long_clip_is_taken_whole(omni):
    """A 31 s clip (31 encoder chunks of 100 frames): no 30 s cut (``truncation=False``), encode ==
    the processor, 403 tokens (13 per second), and the thinker runs on it."""
    proc, model = omni
    wave = clip(31.0, RATE, 5)
    raw = {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]}],
           "audios": [{"array": wave, "sampling_rate": RATE}]}
    row = mmpipe.encode_row(raw, proc, add_generation_prompt=True, labels=False)
    text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=True)
    own = proc(text=[text], audio=[wave], return_tensors="np")
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    np.testing.assert_array_equal(row.vision["input_features"], own["input_features"])
    assert row.vision["input_features"].shape == (1, 128, 3100)
    assert int((row.input_ids == proc.audio_token_id).sum()) == 403
    with torch.no_grad():
        out = model(**mmpipe.collate([row]).model_inputs(labels=False)).logits
    assert torch.isfinite(out).all()


def test_a_clip_over_the_extractors_window_is_taken_whole(omni):
    proc, _ = omni
    wave = np.zeros(RATE * 301, np.float32)
    wave[::97] = 0.1
    raw = {"messages": [{"role": "user", "content": [{"type": "audio"}]}],
           "audios": [{"array": wave, "sampling_rate": RATE}]}
    row = mmpipe.encode_row(raw, proc)
    assert int((row.input_ids == proc.audio_token_id).sum()) == 3913


def test_arrow_round_trip_through_datasets_map(omni, clips):
    proc, _ = omni
    raws = _raws(clips)

    def items(content):  # one Arrow type for every message: a list of {type, text} items
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        return [{"type": c["type"], "text": c.get("text")} for c in content]

    plain = [{"messages": [{"role": m["role"], "content": items(m["content"])} for m in r["messages"]],
              "images": r.get("images", []),
              "audios": [a if isinstance(a, str) else a.get("path") for a in r.get("audios", [])]}
             for r in raws if all(isinstance(a, str) or (isinstance(a, dict) and a.get("path"))
                                  for a in r.get("audios", []))]
    assert len(plain) == 4  # rows 0, 2, 3, 5: clips as paths
    ds = datasets.Dataset.from_list(plain)
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    direct = [mmpipe.encode_row(r, proc) for r in plain]
    stored = invariants.assert_rows_from_arrow(out.data.table, direct)
    assert [r.vision["input_features"].shape[2] for r in stored if "input_features" in r.vision] == [160, 230]


def test_audio_source_storage_is_exact(omni, encoded):
    """``audio="source"`` stores each clip's file; collate recomputes the features with the
    processor's own call on the row's clips together (Qwen3-Omni pads per call, so a clip's features
    depend on the clips beside it): the batch equals the feature-stored rows' batch bit for bit, and
    batched logits equal each row alone. Qwen3-Omni's features are only as long as the clip
    (128 x 100 frames x 4 B = 51.2 kB a second), so the saving is smaller than Qwen2.5-Omni's."""
    proc, model = omni
    raws, feature_rows = encoded
    rows = [mmpipe.encode_row(r, proc, idx=i, audio="source") for i, r in enumerate(raws)]
    for f, s in zip(feature_rows, rows):
        assert "input_features" not in s.vision and bool(s.audio_sources) == ("input_features" in f.vision)
        np.testing.assert_array_equal(s.input_ids, f.input_ids)
    stored = sum(len(b) for r in rows for b in (r.audio_sources or ()))
    features = sum(f.vision["input_features"].nbytes + f.vision["feature_attention_mask"].nbytes
                   for f in feature_rows if "input_features" in f.vision)
    print(f"\nqwen3-omni audio storage: {stored:,} B as sources vs {features:,} B as float32 features "
          f"({features / stored:.2f}x)")
    want = mmpipe.collate(feature_rows, processor=proc).model_inputs()
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side="left")
    got = batch.model_inputs()
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch,
                                           references=[own_call(proc, r) for r in raws])


def test_packing_is_refused(omni, encoded):
    proc, model = omni
    _, rows = encoded
    with pytest.raises(mmpipe.errors.PackingUnsupportedError, match="generic path"):
        mmpipe.pack(rows, processor=proc, model=model)


def test_generation_from_audio_prompts(omni, clips):
    """TransformersEngine on audio prompts at temperature 1.0 (64 new tokens, 4 samples each): the
    processor's media tokens (audio, image, video pads and their borders) are banned, and the
    thinker's teacher-forced logprobs of prompt + completion equal the sampled ones."""
    proc, model = omni
    raws = [{"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is it?"}]}],
             "audios": [clips["a.wav"]]},
            {"messages": [{"role": "user", "content": "Say something."}]},
            {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "audio"},
                                                       {"type": "text", "text": "Same?"}]}],
             "audios": [clips["b.flac"], clips["c.ogg"]]}]
    eng, gens, gaps = sample_and_gaps(proc, model, raws)
    assert set(eng.vision_tokens.names) == {"<|audio_pad|>", "<|audio_start|>", "<|audio_end|>", "<|image_pad|>",
                                            "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"}
    banned = set(eng.vision_tokens.ids)
    assert not any(banned & set(c.token_ids) for g in gens for c in g.completions)
    n_tokens = sum(len(c.token_ids) for g in gens for c in g.completions)
    print(f"\nqwen3-omni generation: {n_tokens} sampled tokens, rollout/training logprob gap {max(gaps):.2e}")
    assert n_tokens > 300 and max(gaps) < 1e-3


def test_generation_from_image_and_audio_prompts(omni, clips):
    proc, model = omni
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "audio"},
                                                     {"type": "text", "text": "Who?"}]}],
           "images": [_photo()], "audios": [clips["a.wav"]]}
    _, _, gaps = sample_and_gaps(proc, model, [raw], n=2, max_new_tokens=16, seed=1)
    assert max(gaps) < 1e-3
