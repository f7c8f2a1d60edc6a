"""Gemma 3, InternVL, LLaVA-OneVision and GLM-4.1V on transformers 4.57 (scripts/envs/tf457.sh),
against 4.57's own processors and model classes built offline (`mmpipe.offline`):

- ``mmpipe.encode_row`` (uint8 pixels, and layout-only) == the processor's chat path
  (``apply_chat_template(tokenize=True, return_dict=True)`` with the images in the messages) ==
  its flat call (``proc(text=, images=)``): ids, pixel values bit for bit, the family's extra
  image columns; labels are the replies' own tokens (and the turn end the template writes);
- positions: GLM-4.1V's M-RoPE rows == 4.57's ``get_rope_index``; the tiled families' 1-D
  positions count the row's tokens;
- the 4.57 model class on ``collate(rows).model_inputs()``: batched logits == each row alone
  (and == the processor's own outputs run alone); ``unbatch(collate(rows)) == rows``.

Before: on 4.57 the offline builders of these families failed (5.x-only ``*ImageProcessorPil``
names; image-only processors without 4.x's ``attributes`` list: "Received a NoneType for argument
video_processor"; GLM's rope settings in 5.x's ``rope_parameters`` only: rope_scaling None, the
forward a TypeError), so no 4.57 test covered them.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip

from conftest import model_for, processor_for

pytestmark = pytest.mark.needs_env("tf457")

FAMILIES = ["glm4v", "gemma3", "internvl", "llava_onevision"]
# what each offline chat template writes after a reply (GLM-4.1V's writes no end-of-turn token)
TURN_END = {"glm4v": "", "gemma3": "<|im_end|>", "internvl": "<|im_end|>", "llava_onevision": "<|im_end|>"}
REPLIES = ["a cat.", "a dog, sitting."]


@pytest.fixture(params=FAMILIES)
def name(request):
    return request.param


def _raw(n_images: int, k: int = 0) -> dict:
    """Two user turns (the images in the first) and two replies."""
    images = [testing.tiny_image(40 + 23 * i, 70 + 11 * k, seed=k + i) for i in range(n_images)]
    first = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in row {k}?"}]
    reply = [{"role": "assistant", "content": [{"type": "text", "text": text}]} for text in REPLIES]
    msgs = [{"role": "user", "content": first}, reply[0],
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]}, reply[1]]
    return {"messages": msgs, "images": images}


def _with_images(raw: dict) -> list[dict]:
    """The messages with each image part holding its image (what the chat path loads)."""
    msgs, images = copy.deepcopy(raw["messages"]), iter(raw["images"])
    for msg in msgs:
        msg["content"] = [{"type": "image", "image": next(images)} if p["type"] == "image" else p
                          for p in msg["content"]]
    return msgs


def _flat(proc, raw: dict, name: str) -> dict:
    """The processor's flat call on the rendered text. LLaVA-OneVision takes one image list per
    conversation (its chat path's mode, and mmpipe's default)."""
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    images = raw["images"] or None
    if images and name == "llava_onevision":
        images = [images]
    return dict(proc(text=[text], images=images, return_tensors="np"))


def test_the_line_is_4_57():
    import transformers

    assert transformers.__version__.startswith("4.57")


@pytest.mark.parametrize("n_images", [0, 2])
def test_encode_matches_the_chat_path_and_the_flat_call(name, n_images):
    proc = processor_for(name)
    raw = _raw(n_images, k=n_images)
    row = mmpipe.encode_row(raw, proc)
    chat = proc.apply_chat_template(_with_images(raw), tokenize=True, return_dict=True, return_tensors="np")
    flat = _flat(proc, raw, name)
    for ref in (chat, flat):
        assert row.input_ids.tolist() == np.asarray(ref["input_ids"])[0].tolist()
    batch = mmpipe.collate([row], processor=proc)
    inputs = batch.model_inputs()
    for key in set(flat) - {"input_ids", "attention_mask"}:  # pixel_values bit for bit, grids, sizes, token types
        got = np.asarray(inputs[key])
        assert np.array_equal(got, np.asarray(chat[key])) and np.array_equal(got, flat[key]), key
    tok = proc.tokenizer
    want = [i for reply in REPLIES for i in tok(reply + TURN_END[name], add_special_tokens=False)["input_ids"]]
    assert row.labels[row.labels != -100].tolist() == want
    layout = mmpipe.encode_row(raw, proc, pixels="none")
    assert layout.pixel_values_u8 is None
    assert row.diff(layout) == ["pixel_values_u8"]  # an empty array without images, None in layout rows


def test_positions_match_the_4_57_model(name):
    proc, model = processor_for(name), model_for(name)
    rows = [mmpipe.encode_row(_raw(n, k), proc, idx=k) for k, n in enumerate([2, 0, 1])]
    for side in ("left", "right"):
        batch = mmpipe.collate(rows, processor=proc, padding_side=side)
        if name == "glm4v":  # M-RoPE: rows, batch and 4.57's Glm4vModel.get_rope_index agree
            assert_positions_match_rows(batch, rows, model=model)
            continue
        for b, r in enumerate(rows):  # 1-D: 0..n-1 at the row's tokens
            n = len(r.input_ids)
            assert r.position_ids.tolist() == list(range(n))
            real = slice(batch.input_ids.shape[1] - n, None) if side == "left" else slice(0, n)
            assert batch.position_ids[b, real].tolist() == list(range(n))


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_match_each_row_alone(name, side):
    """Rows with 0, 1, 3 images: the 4.57 model on the padded batch == each row alone (left:
    ``collate([row])``; right: the row's own processor outputs); the batch unbatches to the rows."""
    proc, model = processor_for(name), model_for(name)
    raws = [_raw(n, k) for k, n in enumerate([0, 1, 3])]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    batch = assert_roundtrip(rows, processor=proc, padding_side=side)
    refs = None if side == "left" else [_flat(proc, r, name) for r in raws]
    logits = assert_batched_logits_match(model, rows, proc, batch=batch, references=refs)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("generic", ["llava", "idefics3", "paligemma"])
def test_generic_path_families(generic):
    """LLaVA 1.5, Idefics3 and PaliGemma (no family-table row: `mmpipe.media.processor_encode`)
    on 4.57: the row's ids and model inputs == the chat path's and the flat call's; batched
    logits == each row alone; the batch unbatches to the rows."""
    proc, model = processor_for(generic), model_for(generic)
    # 4.57's PaliGemmaProcessor refuses a call without images ("`images` are expected"): no text-only row
    raws = [_raw(n, k) for k, n in enumerate([2, 1, 1] if generic == "paligemma" else [2, 0, 1])]
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    chat = proc.apply_chat_template(_with_images(raws[0]), tokenize=True, return_dict=True, return_tensors="np")
    flat = _flat(proc, raws[0], generic)
    inputs = mmpipe.collate(rows[:1], processor=proc).model_inputs()
    for key in set(flat) - {"attention_mask"}:
        got = np.asarray(inputs[key])
        assert np.array_equal(got, np.asarray(chat[key])) and np.array_equal(got, flat[key]), key
    batch = assert_roundtrip(rows, processor=proc, padding_side="left")
    assert_batched_logits_match(model, rows, proc, batch=batch)
