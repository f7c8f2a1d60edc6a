"""Audio rows on the generic path (issue 31): Qwen2.5-Omni's thinker processor (the real class, the
published chat template, a tiny real thinker built offline, `mmpipe.offline.qwen_omni`), rows with
0..2 clips and 0..1 photos.

- encode == the processor's flat call on the row's whole conversation and its clips (ids, input
  features, feature attention masks, pixels, grids: bit for bit), and == its own chat path
  (``apply_chat_template(tokenize=True)``, which loads the clip files itself);
- labels are the replies (multi-turn, a clip in the second user turn);
- the invariant harness: ``unbatch(collate(rows)) == rows``, Arrow round trip through ``ds.map``,
  and batched logits (left and right padding) == the thinker on each row's own processor call:
  its TMRoPE positions are its own ``get_rope_index`` (the generic path passes none);
- bad audio: typed errors naming the row and column, skip counted."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.errors import AudioError, ParseError
from mmpipe.testing import invariants

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")


from audio_rows import RATE, assert_rows_equal_calls, clip, own_call, sample_and_gaps, write_clips  # noqa: E402
from helpers import photo_paths  # noqa: E402


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen_omni import build_model, build_processor

    torch.manual_seed(0)
    return build_processor(), build_model()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return write_clips(tmp_path_factory.mktemp("clips"))


def _raws(clips) -> list[dict]:
    photo = next(p for p in photo_paths() if p.endswith("grace_hopper.jpg"))  # a real-size RGB photo
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return [
        {"messages": [user({"type": "audio"}, text("What is this sound?")),
                      {"role": "assistant", "content": "A tone."}], "audios": [clips["a.wav"]]},
        {"messages": [user({"type": "image"}, {"type": "audio"}, text("Does the sound fit the picture?")),
                      {"role": "assistant", "content": "No."}],
         "images": [photo], "audios": [{"array": clip(1.2, 24000, 7), "sampling_rate": 24000}]},
        {"messages": [user(text("Say hi.")), {"role": "assistant", "content": "Hi!"}]},
        {"messages": [user({"type": "audio"}, text("first")), {"role": "assistant", "content": "one"},
                      user({"type": "audio"}, text("and this?")), {"role": "assistant", "content": "two"}],
         "audios": [clips["b.flac"], {"path": clips["c.ogg"], "bytes": None}]},
    ]


@pytest.fixture(scope="module")
def encoded(omni, clips):
    proc, _ = omni
    raws = _raws(clips)
    return raws, [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]


def test_encode_equals_the_processors_flat_call(omni, encoded):
    proc, _ = omni
    raws, rows = encoded
    assert [len(r.get("audios", [])) for r in raws] == [1, 1, 0, 2]
    assert_rows_equal_calls(rows, [own_call(proc, raw) for raw in raws])
    assert rows[3].vision["input_features"].shape == (2, 128, 3000)
    assert rows[3].vision["feature_attention_mask"].sum(1).tolist() == [90, 230]  # 0.9 s and 2.3 s at hop 160


def test_encode_equals_the_processors_chat_path(omni, clips):
    proc, _ = omni
    msgs = [{"role": "user", "content": [{"type": "audio", "path": clips["a.wav"]}, {"type": "text", "text": "and"},
                                         {"type": "audio", "path": clips["b.flac"]}]},
            {"role": "assistant", "content": [{"type": "text", "text": "two sounds"}]}]
    own = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    row = mmpipe.encode_row({"messages": msgs}, proc)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    for k in ("input_features", "feature_attention_mask"):
        np.testing.assert_array_equal(row.vision[k], own[k])


def test_labels_are_the_replies(omni, encoded):
    proc, _ = omni
    raws, rows = encoded
    tok = proc.tokenizer
    for raw, row in zip(raws, rows):
        replies = [m["content"] for m in raw["messages"] if m["role"] == "assistant"]
        marked = np.flatnonzero(row.labels != -100)
        runs = np.split(marked, np.flatnonzero(np.diff(marked) != 1) + 1)
        assert [tok.decode(row.input_ids[r]) for r in runs] == [f"{t}<|im_end|>" for t in replies]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batch_equals_rows(omni, encoded, padding_side):
    proc, model = omni
    raws, rows = encoded
    batch = invariants.assert_roundtrip(rows, padding_side=padding_side)
    kw = batch.model_inputs()
    assert "position_ids" not in kw  # TMRoPE: the thinker's own get_rope_index
    assert kw["input_features"].shape == (4, 128, 3000) and kw["feature_attention_mask"].shape == (4, 3000)
    refs = [own_call(proc, r) for r in raws]
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5, rtol=1e-5)


def test_arrow_round_trip_through_datasets_map(omni, clips, tmp_path):
    proc, _ = omni
    raws = _raws(clips)
    def items(content):  # one Arrow type for every message: a list of {type, text} items
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        return [{"type": c["type"], "text": c.get("text")} for c in content]

    plain = [{"messages": [{"role": m["role"], "content": items(m["content"])} for m in r["messages"]],
              "images": r.get("images", []),
              "audios": [a if isinstance(a, str) else a.get("path") for a in r.get("audios", [])]}
             for r in raws if all(isinstance(a, str) or a.get("path") for a in r.get("audios", []))]
    assert len(plain) == 3
    ds = datasets.Dataset.from_list(plain)
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    direct = [mmpipe.encode_row(r, proc) for r in plain]
    invariants.assert_rows_from_arrow(out.data.table, direct)


def test_bad_audio_is_typed(omni, clips):
    proc, _ = omni
    user = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]}]
    long = {"array": np.zeros(RATE * 31, np.float32), "sampling_rate": RATE}
    with pytest.raises(AudioError) as e:  # the feature extractor would cut it at 30 s
        mmpipe.encode_row({"messages": user, "audios": [long]}, proc, idx=5)
    assert e.value.row == 5 and e.value.column == "audios" and "30.00 s" in str(e.value)
    with pytest.raises(AudioError, match="cannot be decoded"):
        mmpipe.encode_row({"messages": user, "audios": [b"not audio at all"]}, proc)
    with pytest.raises(AudioError, match="sampling rate"):
        mmpipe.encode_row({"messages": user, "audios": [np.zeros(100, np.float32)]}, proc)
    from mmpipe.errors import PlaceholderError
    with pytest.raises(PlaceholderError, match="audio"):  # two placeholders, one clip
        mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "audio"}] * 2}],
                           "audios": [clips["a.wav"]]}, proc)
    ds = datasets.Dataset.from_list([{"messages": user, "audios": [clips["a.wav"]]},
                                     {"messages": user, "audios": [clips["a.wav"] + ".missing"]}])
    enc, report = mmpipe.encode_dataset(ds, proc, on_error="skip")
    assert len(enc) == 1 and len(report.errors) == 1 and report.errors[0]["column"] == "audios"


def test_families_without_audio_refuse_it(clips):
    qwen = mmpipe.testing.build_processor("qwen2_vl")
    row = {"messages": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]}],
           "audios": [clips["a.wav"]]}
    with pytest.raises(ParseError) as e:
        mmpipe.encode_row(row, qwen, idx=2)
    assert e.value.column == "audios" and e.value.row == 2 and "Qwen2.5-Omni" in e.value.fix
    from mmpipe.offline.other_vlms import build_foreign_processor

    llava = build_foreign_processor("llava")  # the generic path, but no feature extractor
    with pytest.raises(ParseError, match="no audio feature extractor"):
        mmpipe.encode_row(row, llava)


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
    assert set(eng.vision_tokens.names) == {"<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|IMAGE|>", "<|VIDEO|>",
                                            "<|vision_bos|>", "<|vision_eos|>"}
    banned = set(eng.vision_tokens.ids)
    assert not any(banned & set(c.token_ids) for g in gens for c in g.completions)
    n_tokens = sum(len(c.token_ids) for g in gens for c in g.completions)
    print(f"\nomni generation: {n_tokens} sampled tokens, rollout/training logprob gap {max(gaps):.2e}")
    assert n_tokens > 300 and max(gaps) < 1e-3


def test_audio_source_storage_is_exact_and_small(omni, clips, encoded):
    """``audio="source"`` stores each clip's file (a float WAV for arrays) instead of the 1.5 MB of
    float32 features a Qwen2.5-Omni clip takes; collate computes the features with the processor's own
    call: the batch equals the feature-stored rows' batch bit for bit, and the rows come back out."""
    proc, _ = omni
    raws, feature_rows = encoded
    rows = [mmpipe.encode_row(r, proc, idx=i, audio="source") for i, r in enumerate(raws)]
    for f, s in zip(feature_rows, rows):
        # a row without clips stores none: [] (the column stays in every row, see the test below)
        assert "input_features" not in s.vision and bool(s.audio_sources) == ("input_features" in f.vision)
        np.testing.assert_array_equal(s.input_ids, f.input_ids)
    stored = [len(b) for r in rows for b in (r.audio_sources or ())]
    features = [f.vision["input_features"][k].nbytes + f.vision["feature_attention_mask"][k].nbytes
                for f in feature_rows if "input_features" in f.vision for k in range(len(f.vision["input_features"]))]
    print(f"\nqwen2.5-omni audio storage: {sum(stored):,} B as sources vs {sum(features):,} B as float32 features "
          f"({sum(features) / sum(stored):.1f}x) for {len(stored)} clips")
    assert sum(features) > 5 * sum(stored)
    want = mmpipe.collate(feature_rows, processor=proc).model_inputs()
    batch = invariants.assert_roundtrip(rows, processor=proc)
    got = batch.model_inputs()
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    dicts = [r.to_dict() for r in rows]
    ds = datasets.Dataset.from_list(dicts)
    invariants.assert_rows_from_arrow(ds.data.table, rows)
    with pytest.raises(mmpipe.errors.ArgumentError, match="audio='source'.*processor"):
        mmpipe.collate(rows)
    with pytest.raises(mmpipe.errors.ArgumentError, match="audio"):
        mmpipe.Encoder(mmpipe.testing.build_processor("qwen2_vl"), audio="source")


@pytest.mark.parametrize("batched", [False, True])
def test_audio_source_rows_keep_their_clips_after_a_row_without_any(omni, clips, batched):
    """``datasets`` takes a map's (and ``Dataset.from_list``'s) columns from the first rows: a first row
    without clips must still store ``audio_sources`` (as []), or every later row's clips are dropped
    (collate then hands the model audio tokens without features, silently)."""
    proc, _ = omni
    ask = lambda k: {"messages": [{"role": "user", "content": [{"type": "audio", "text": None}] * k  # noqa: E731
                                   + [{"type": "text", "text": "What?"}]},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A tone."}]}],
                     "audios": [clips["a.wav"]] * k}
    raw = datasets.Dataset.from_list([ask(0), ask(1), ask(2)])
    out = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "audio": "source"}, batched=batched, batch_size=2,
                  remove_columns=raw.column_names)
    rows = [mmpipe.encode_row(ask(k), proc, audio="source") for k in range(3)]
    assert [r.audio_sources is not None and len(r.audio_sources) for r in rows] == [0, 1, 2]
    for table in (out.data.table, datasets.Dataset.from_list([r.to_dict() for r in rows]).data.table):
        assert "audio_sources" in table.column_names
        invariants.assert_rows_from_arrow(table, rows)
    assert mmpipe.validate_dataset(out).ok
    got = mmpipe.Collator(proc)(mmpipe.ArrowRows(out).__getitems__([1, 2])).model_inputs()
    want = mmpipe.collate([mmpipe.encode_row(ask(k), proc) for k in (1, 2)], processor=proc).model_inputs()
    assert sorted(got) == sorted(want) and "input_features" in got
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


def test_packing_is_refused(omni, encoded):
    """Packing Omni rows would need TMRoPE restarted per row inside the model: the generic path does
    not know its model's attention or positions, so it refuses with a typed error."""
    proc, model = omni
    _, rows = encoded
    with pytest.raises(mmpipe.errors.PackingUnsupportedError, match="generic path"):
        mmpipe.pack(rows, processor=proc)
    with pytest.raises(mmpipe.errors.PackingUnsupportedError):
        mmpipe.pack(rows, processor=proc, model=model)
