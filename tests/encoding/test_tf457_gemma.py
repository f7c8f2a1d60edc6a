"""Gemma 3 (pan-and-scan) and Gemma 3n (image + audio) rows on transformers 4.57
(scripts/envs/tf457.sh) against 4.57's own processors, built offline (`mmpipe.offline.gemma3`,
`mmpipe.offline.gemma3n`):

- Gemma 3 with pan-and-scan: ``mmpipe.encode_row`` == the flat call (ids, ``token_type_ids``,
  pixel values of every crop, bit for bit), over aspect ratios that give 0..4 crops;
- Gemma 3n: ``encode_row`` == the flat call and the chat path
  (``apply_chat_template(tokenize=True, return_dict=True)``, image and clip in the messages): ids,
  ``pixel_values``, ``input_features``, ``input_features_mask``, ``token_type_ids``; labels are the
  replies. (Its model needs timm, which this environment does not hold: no logits here.)
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing

pytestmark = pytest.mark.needs_env("tf457")

RATE = 16000
PAS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
# 4.57's processor misreads the channel axis of images 1 or 3 pixels high or wide (numpy's
# ambiguous-channel guess): those sizes are left out
SIZES = [(10, 11), (10, 13), (7, 40), (40, 7), (16, 100), (100, 16), (33, 97), (97, 33), (64, 200), (300, 31)]


def _chat(images: list, audio: bool = False) -> list[dict]:
    parts = [{"type": "image"}] * len(images) + ([{"type": "audio"}] if audio else [])
    return [{"role": "user", "content": parts + [{"type": "text", "text": "what is this?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a thing."}]}]


def _model_inputs(row, proc) -> dict:
    return {k: np.asarray(v) for k, v in mmpipe.collate([row], processor=proc).model_inputs().items()}


def test_gemma3_pan_and_scan_equals_4_57s_processor():
    from mmpipe.offline.gemma3 import build_gemma3_processor

    proc = build_gemma3_processor()
    rng = np.random.default_rng(5)
    crops = set()
    for h, w in SIZES:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        raw = {"messages": _chat([img]), "images": [img]}
        row = mmpipe.encode_row(raw, proc, images_kwargs=PAS)
        text = proc.apply_chat_template(raw["messages"], tokenize=False)
        flat = proc(text=[text], images=[img], return_tensors="np", **PAS)
        assert row.input_ids.tolist() == flat["input_ids"][0].tolist(), (h, w)
        got = _model_inputs(row, proc)
        for key in set(flat) - {"input_ids", "attention_mask"}:
            assert np.array_equal(got[key], flat[key]), (h, w, key)
        crops.add(len(flat["pixel_values"]))
    assert len(crops) >= 3  # several crop counts were exercised


def test_gemma3n_equals_4_57s_flat_call_and_chat_path():
    from mmpipe.offline.gemma3n import build_processor

    proc = build_processor()
    t = np.arange(int(1.2 * RATE)) / RATE
    clip = (0.2 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    img = testing.tiny_image(50, 70, seed=1)
    raw = {"messages": _chat([img], audio=True), "images": [img], "audios": [{"array": clip, "sampling_rate": RATE}]}
    row = mmpipe.encode_row(raw, proc)
    got = _model_inputs(row, proc)
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    flat = proc(text=[text], images=[img], audio=[clip], return_tensors="np")
    msgs = _chat([img], audio=True)
    msgs[0]["content"][0] = {"type": "image", "image": img}
    msgs[0]["content"][1] = {"type": "audio", "audio": clip}
    chat = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="np")
    for ref in (flat, chat):
        assert row.input_ids.tolist() == np.asarray(ref["input_ids"])[0].tolist()
        assert set(ref) - {"attention_mask"} <= set(got)
        for key in set(ref) - {"input_ids", "attention_mask"}:
            assert np.array_equal(got[key], np.asarray(ref[key])), key
    assert proc.tokenizer.decode(row.input_ids[row.labels != -100]) == "a thing.<end_of_turn>"


@pytest.mark.parametrize("name", ["gemma4", "kimi_k25", "step3p7", "glm5_next"])
def test_lines_4_57_lacks_name_the_missing_class_and_the_fix(name):
    """Before: "its image processor needs torchvision ... run scripts/envs/vision.sh", a fix that
    cannot help on 4.57 (the class itself is missing)."""
    from mmpipe.errors import ArgumentError
    from mmpipe.offline.vision_env_vlms import build_vision_env_model, build_vision_env_processor

    for build in (build_vision_env_processor, build_vision_env_model):
        with pytest.raises(ArgumentError, match=r"has no \w+Processor .*install transformers>=5"):
            build(name)


def test_gemma3n_clip_4_57_would_cut_is_refused():
    """4.57's Gemma 3n call cuts a clip at 30 s (480,000 samples: 2,997 feature frames for 31 s):
    mmpipe refuses it with a typed error instead of storing a silently cut clip."""
    from mmpipe.errors import AudioError
    from mmpipe.offline.gemma3n import build_processor

    proc = build_processor()
    wave = np.zeros(RATE * 31, np.float32)
    raw = {"messages": [{"role": "user", "content": [{"type": "audio"}]}], "audios": [{"array": wave, "sampling_rate": RATE}]}
    with pytest.raises(AudioError, match="at most 30.00 s"):
        mmpipe.encode_row(raw, proc)
