"""Audio on the generic path for Gemma 3n, Phi-4-multimodal (issue 31) and Gemma 4, in the "vision"
environment (their processors need torchvision, Gemma 3n's tower timm): the real processor classes with the
published chat templates (Gemma 4's: its structure, `mmpipe.offline.gemma4`) and tiny real models
(`mmpipe.offline.vision_env_vlms`), rows of 0..2 clips.

- encode == the processor's flat call (ids, every audio output) and its chat path;
- Phi-4-multimodal leaves ``audio_attention_mask`` out of a one-clip call: the probe finds it
  (`ProcessorLayout.single_masks`), collate fills it in for such rows and unbatch takes it out
  again (``unbatch(collate(rows)) == rows``);
- batched logits == each row alone when the batch's clips have one length; with clips of other
  lengths Gemma 3n's and Phi-4-multimodal's audio encoders convolve over the padding, so the batch
  differs from each row alone exactly as the processor's own batch does (both gaps measured; collate
  warns once); Gemma 4's masks the padded frames: each row's own logits, no warning;
- labels are the replies."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.testing import invariants

pytestmark = pytest.mark.needs_env("vision")
soundfile = pytest.importorskip("soundfile")
RATE = 16000
NAMES = ("gemma3n", "phi4_multimodal", "gemma4")


def _clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.2 * np.sin(2 * np.pi * (200 + 40 * seed) * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def _row(n_clips: int, seconds, seed: int, reply: str) -> dict:
    content = [{"type": "audio"}] * n_clips + [{"type": "text", "text": "What do you hear?"}]
    return {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": reply}],
            "audios": [{"array": _clip(s, seed + k), "sampling_rate": RATE} for k, s in enumerate(seconds[:n_clips])]}


@pytest.fixture(scope="module", params=NAMES)
def line(request):
    from mmpipe.offline.vision_env_vlms import build_vision_env_model, build_vision_env_processor

    torch.manual_seed(0)
    return request.param, build_vision_env_processor(request.param), build_vision_env_model(request.param)


def _own_call(proc, raw: dict) -> dict:
    msgs = [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m["content"], str) else m
            for m in raw["messages"]]
    text = proc.apply_chat_template(msgs, tokenize=False)
    audios = [a["array"] for a in raw.get("audios", [])]
    kw = {"audio": audios, "sampling_rate": RATE} if audios else {}
    bos = getattr(proc.tokenizer, "bos_token", None)
    special = not (bos and text.startswith(bos))
    return dict(proc(text=[text], return_tensors="pt", add_special_tokens=special, **kw))


def test_encode_equals_the_processor_and_labels_are_the_replies(line):
    name, proc, _ = line
    raws = [_row(1, [1.0], 0, "A tone."), _row(0, [], 1, "Nothing."), _row(2, [0.6, 1.4], 2, "Two tones.")]
    for i, raw in enumerate(raws):
        row = mmpipe.encode_row(raw, proc, idx=i)
        own = _own_call(proc, raw)
        np.testing.assert_array_equal(row.input_ids, own["input_ids"][0].numpy())
        keys = {k for k in own if k not in ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")}
        assert set(row.vision) == keys, (name, i, sorted(row.vision), sorted(keys))
        for k in set(own) & {"token_type_ids", "mm_token_type_ids"}:  # sequence keys (Gemma 4: mm_token_type_ids)
            np.testing.assert_array_equal(row.sequence[k], own[k][0].numpy(), err_msg=f"{name} row {i}: {k}")
        for k in keys:
            np.testing.assert_array_equal(row.vision[k], own[k].numpy(), err_msg=f"{name} row {i}: {k}")
        marked = row.input_ids[row.labels != -100]
        assert proc.tokenizer.decode(marked).startswith(raw["messages"][1]["content"])
    layout = mmpipe.encode_row(raws[0], proc).layout
    if name == "phi4_multimodal":
        assert layout.single_masks == (("audio_attention_mask", "audio_input_features"),)
        assert "audio_attention_mask" not in mmpipe.encode_row(raws[0], proc).vision  # as the processor returns it
    assert set(layout.audio) >= {k for k in _own_call(proc, raws[2]) if "audio" in k or "input_features" in k}


def test_chat_path(line, tmp_path):
    name, proc, _ = line
    path = tmp_path / "clip.wav"
    soundfile.write(str(path), _clip(1.2, 5), RATE)
    msgs = [{"role": "user", "content": [{"type": "audio", "path": str(path)}, {"type": "text", "text": "hm?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "yes"}]}]
    own = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    row = mmpipe.encode_row({"messages": msgs}, proc)
    np.testing.assert_array_equal(row.input_ids, own["input_ids"][0])
    for k in row.vision:
        np.testing.assert_array_equal(row.vision[k], own[k])


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_equal_length_clips_batch_exactly(line, padding_side):
    name, proc, model = line
    raws = [_row(1, [1.0], 0, "A tone."), _row(0, [], 1, "Nothing."), _row(2, [1.0, 1.0], 2, "Two tones."),
            _row(1, [1.0], 7, "Again.")]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    batch = invariants.assert_roundtrip(rows, padding_side=padding_side)
    refs = [_own_call(proc, r) for r in raws]
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-4, rtol=1e-4,
                                           padding_side=padding_side)


def test_clips_of_other_lengths_differ_as_the_processors_own_batch(line, caplog):
    """Measured, not hidden: collate warns, and the gap to each row alone is the processor's own batch's;
    an encoder that masks the padded frames (Gemma 4's, `MASKED_AUDIO`) gives each row its own logits, and
    collate does not warn."""
    from mmpipe.audio import clips
    from mmpipe.families import MASKED_AUDIO

    name, proc, model = line
    raws = [_row(1, [1.0], 0, "A tone."), _row(1, [1.4], 3, "Longer.")]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    masked = rows[0].processor_class in MASKED_AUDIO
    clips.AUDIO_PADDING_WARNED.discard(rows[0].processor_class)
    with caplog.at_level(logging.WARNING, logger="mmpipe"):
        batch = invariants.assert_roundtrip(rows, padding_side="right")
    assert any("padded to the largest" in r.message for r in caplog.records) != masked
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in raws]
    bos = getattr(proc.tokenizer, "bos_token", None)
    own = proc(text=texts, audio=[r["audios"][0]["array"] for r in raws], sampling_rate=RATE, padding=True,
               return_tensors="pt", add_special_tokens=not (bos and texts[0].startswith(bos)))
    with torch.no_grad():
        ours = model(**batch.model_inputs()).logits
        theirs = model(**own).logits
        alone = model(**_own_call(proc, raws[0])).logits[0]
    n = len(rows[0])
    gap_ours = float((ours[0, :n] - alone).abs().max())
    gap_theirs = float((theirs[0, own["attention_mask"][0].bool()] - alone).abs().max())
    print(f"\n{name}: clips of 1.0 s and 1.4 s in one batch: gap to the row alone {gap_ours:.2e} "
          f"(the processor's own batch: {gap_theirs:.2e})")
    if masked:
        assert gap_ours < 1e-4 and gap_theirs < 1e-4
        alone_call = _own_call(proc, raws[0])  # and the clip counts: silencing it moves the row's logits
        with torch.no_grad():
            silent = model(**dict(alone_call, input_features=torch.zeros_like(alone_call["input_features"]))).logits[0]
        assert float((silent - alone).abs().max()) > 1e-3
        return
    assert gap_theirs > 1e-4  # the model's property: the processor's own batch shows it too
