"""Qwen2.5-Omni's and Qwen3-Omni's thinkers on transformers 4.57 (scripts/envs/tf457.sh): the offline
builders (`mmpipe.offline.qwen_omni`, `mmpipe.offline.qwen3_omni`) build 4.57's own processor and
thinker classes, and rows with audio clips and a photo equal 4.57's processor:

- ``mmpipe.encode_row`` == the flat call ``proc(text=, images=, audio=)``: ids, ``input_features``,
  ``feature_attention_mask``, pixels, grids, bit for bit; == the chat path
  (``apply_chat_template(tokenize=True, return_dict=True)``, clips as arrays in the messages);
- batched logits (left and right padding) == the 4.57 thinker on each row's own processor call
  (TMRoPE positions from 4.57's own ``get_rope_index``).

Before: `mmpipe.model_rope` called Qwen3-Omni's rope 1-D on 4.57 (its thinker, the class with
``get_rope_index``, sits in no 4.57 auto mapping), so ``model_inputs()`` handed the thinker
``position_ids`` 0..n-1: logits off by ~0.17 at a photo row. Both builders failed on 4.57 (``transformers.Qwen2VLImageProcessorPil`` is a 5.x name; the
no-video processor class lacked 4.x's ``attributes`` list, and 4.57's placeholder expansion reads
``video_processor.merge_size`` on every call), so a 4.57 user's Omni rows had no offline check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.testing import invariants

pytestmark = pytest.mark.needs_env("tf457")

RATE = 16000
FAMILIES = ["qwen2_5_omni", "qwen3_omni_moe"]


def _clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.2 * np.sin(2 * np.pi * (300 + 60 * seed) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _raws() -> list[dict]:
    from mmpipe import testing

    photo = testing.tiny_image(60, 90, seed=1)
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    reply = lambda t: {"role": "assistant", "content": [text(t)]}  # noqa: E731
    audio = lambda s, k: {"array": _clip(s, k), "sampling_rate": RATE}  # noqa: E731
    return [
        {"messages": [user({"type": "audio"}, text("What is this sound?")), reply("A tone.")],
         "audios": [audio(1.3, 0)]},
        {"messages": [user({"type": "image"}, {"type": "audio"}, text("Does it fit?")), reply("No.")],
         "images": [photo], "audios": [audio(0.7, 1)]},
        {"messages": [user(text("Say hi.")), reply("Hi!")]},
    ]


def _own_call(proc, raw: dict) -> dict:
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    audios = [a["array"] for a in raw.get("audios", [])]
    return dict(proc(text=[text], images=raw.get("images") or None, audio=audios or None, return_tensors="pt"))


@pytest.fixture(scope="module", params=FAMILIES)
def omni(request):
    from mmpipe import testing

    return request.param, testing.build_processor(request.param), testing.build_model(request.param)


def test_the_line_is_4_57():
    import transformers

    assert transformers.__version__.startswith("4.57")


def test_builders_build_4_57s_own_classes(omni):
    import transformers

    family, proc, model = omni
    stock = {"qwen2_5_omni": (transformers.Qwen2_5OmniProcessor, transformers.Qwen2_5OmniThinkerForConditionalGeneration),
             "qwen3_omni_moe": (transformers.Qwen3OmniMoeProcessor,
                                transformers.Qwen3OmniMoeThinkerForConditionalGeneration)}[family]
    assert isinstance(proc, stock[0]) and isinstance(model, stock[1])


def test_the_thinkers_rope_is_multi_dimensional(omni):
    from mmpipe.model_rope import model_rope

    family, proc, _ = omni
    assert model_rope(type(proc).__mro__[1].__name__).kind == "multi"


def test_encode_equals_the_flat_call_and_the_chat_path(omni):
    family, proc, _ = omni
    raws = _raws()
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    for i, (raw, row) in enumerate(zip(raws, rows)):
        own = _own_call(proc, raw)
        np.testing.assert_array_equal(row.input_ids, own["input_ids"][0].numpy(), err_msg=f"row {i}")
        keys = {k for k in own if k not in ("input_ids", "attention_mask")}
        assert set(row.vision) == keys, (i, sorted(row.vision), sorted(keys))
        for k in keys:
            np.testing.assert_array_equal(row.vision[k], np.asarray(own[k]), err_msg=f"row {i}: {k}")
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": _clip(1.3, 0)}, {"type": "text", "text": "and"},
                                         {"type": "audio", "audio": _clip(0.7, 1)}]},
            {"role": "assistant", "content": [{"type": "text", "text": "two sounds"}]}]
    chat = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    raw = {"messages": [{"role": m["role"], "content": [{"type": p["type"], "text": p["text"]} if p["type"] == "text"
                                                        else {"type": "audio"} for p in m["content"]]} for m in msgs],
           "audios": [{"array": _clip(1.3, 0), "sampling_rate": RATE}, {"array": _clip(0.7, 1), "sampling_rate": RATE}]}
    row = mmpipe.encode_row(raw, proc)
    np.testing.assert_array_equal(row.input_ids, chat["input_ids"][0])
    for k in ("input_features", "feature_attention_mask"):
        np.testing.assert_array_equal(row.vision[k], chat[k])


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_logits_equal_the_thinker_on_each_rows_own_call(omni, padding_side):
    family, proc, model = omni
    raws = _raws()
    if family == "qwen3_omni_moe":
        # 4.57's Qwen3-Omni audio encoder attends across every clip of a forward (eager / sdpa get no
        # mask from cu_seqlens; only FlashAttention-2 reads it), so two rows' clips in one batch change
        # each other's logits on 4.57 itself: keep one clip per batch here (the photo row without its clip)
        raws[1] = {"messages": raws[1]["messages"], "images": raws[1]["images"]}
        raws[1]["messages"][0]["content"] = [p for p in raws[1]["messages"][0]["content"] if p["type"] != "audio"]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    batch = invariants.assert_roundtrip(rows, padding_side=padding_side)
    # TMRoPE: the thinker computes its own positions; 1-D ones (4.57's auto tables map the
    # Qwen3-Omni thinker nowhere) were wrong at every image and clip: logits off by ~0.17
    assert "position_ids" not in batch.model_inputs()
    refs = [_own_call(proc, r) for r in raws]
    logits = invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs,
                                                    atol=1e-5, rtol=1e-5)
    assert torch.isfinite(logits).all()


def test_labels_are_the_replies(omni):
    family, proc, _ = omni
    raws = _raws()
    for i, raw in enumerate(raws):
        row = mmpipe.encode_row(raw, proc, idx=i)
        marked = np.flatnonzero(row.labels != -100)
        replies = [m["content"][0]["text"] for m in raw["messages"] if m["role"] == "assistant"]
        assert proc.tokenizer.decode(row.input_ids[marked]) == "".join(f"{t}<|im_end|>" for t in replies)


def test_a_clip_4_57_would_cut_is_refused(omni):
    """4.57's Qwen3-Omni call cuts a clip at the extractor's 300 s (5.x's passes ``truncation=False``
    and takes it whole): mmpipe refuses it with a typed error instead of storing a silently cut clip."""
    from mmpipe.errors import AudioError

    family, proc, _ = omni
    if family != "qwen3_omni_moe":
        pytest.skip("Qwen2.5-Omni cuts at 30 s on both lines (tests/encoding/test_omni_audio.py)")
    wave = np.zeros(RATE * 301, np.float32)
    raw = {"messages": [{"role": "user", "content": [{"type": "audio"}]}], "audios": [{"array": wave, "sampling_rate": RATE}]}
    with pytest.raises(AudioError, match="at most 300"):
        mmpipe.encode_row(raw, proc)


@pytest.mark.parametrize("grid, second_per_grid, n_audio", [((2, 8, 8), 1.0, 30), ((4, 4, 6), 0.5, 80),
                                                           ((6, 8, 4), 2.0, 33), ((10, 4, 4), 0.4, 7)])
def test_video_with_sound_placeholder_equals_4_57s(omni, grid, second_per_grid, n_audio):
    """``use_audio_in_video``: `mmpipe.audio.omni_video.interleaved_placeholder` (Qwen2.5-Omni: 2 s
    chunks at 25 positions a second; Qwen3-Omni: merged by time position at 13) == 4.57's own
    ``replace_multimodal_special_tokens`` (no video processor needed: only its merge size is read)."""
    import inspect

    from mmpipe.audio.omni_video import interleaved_placeholder

    family, proc, _ = omni
    layout, per_second = {"qwen2_5_omni": ("chunks", 25), "qwen3_omni_moe": ("time", 13)}[family]
    vb, ve = proc.vision_bos_token, proc.vision_eos_token
    kw = dict(audio_lengths=iter([n_audio]), image_grid_thw=iter([]), video_grid_thw=iter([np.array(grid)]),
              video_second_per_grid=iter([second_per_grid]), use_audio_in_video=True,
              position_id_per_seconds=per_second, seconds_per_chunk=2.0)
    params = inspect.signature(proc.replace_multimodal_special_tokens).parameters
    theirs = proc.replace_multimodal_special_tokens([f"a{vb}{proc.video_token}{ve}b"],
                                                    **{k: v for k, v in kw.items() if k in params})[0]
    ours = interleaved_placeholder(grid, second_per_grid, n_audio, merge_size=2, video_token=proc.video_token,
                                   audio_token=proc.audio_token, audio_bos=proc.audio_bos_token,
                                   audio_eos=proc.audio_eos_token, position_id_per_seconds=per_second,
                                   layout=layout)
    assert theirs == f"a{vb}{ours}{ve}b"
