"""Images outside user turns, on the published chat templates (`mmpipe.offline.published_templates`):

- an image inside an assistant reply: its tokens are inputs, never targets - the pads and the
  image's start / end tokens (``<|vision_start|>`` / ``<|vision_end|>``, GLM's
  ``<|begin_of_image|>`` / ``<|end_of_image|>``, from `ModelFamily.vision_token_ids`) are -100;
  the rest equals transformers' assistant mask on the generation copy; the batched layout path too;
- an image the template drops: the `PlaceholderError` names the turns holding the row's images
  (the ones outside user turns when they are as many as are missing), not one template's habit.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.encoding import layout_batch
from mmpipe.encoding.dataset import make_encoder
from mmpipe.errors import PlaceholderError
from mmpipe.families import get_family
from mmpipe.offline import glm46v
from mmpipe.offline.published_templates import generation_template, published_template

from thinking_templates import GLM46V_GENERATION

IMAGE_REPLY = [{"role": "user", "content": [{"type": "text", "text": "Draw a cat."}]},
               {"role": "assistant", "content": [{"type": "text", "text": "Here:"}, {"type": "image"},
                                                 {"type": "text", "text": " a cat."}]}]


def _image(i=0):
    return Image.new("RGB", (40 + 12 * i, 30 + 5 * i), (30 * i, 120, 60))


def _processors(family):
    """(processor with the published template, one with its generation copy)."""
    if family == "glm46v":
        if not glm46v.available():
            pytest.skip("transformers 4.x has no GLM-4.6V (glm46v)")
        proc, ref = glm46v.build_processor(), glm46v.build_processor()
        ref.chat_template = ref.tokenizer.chat_template = GLM46V_GENERATION
        return proc, ref
    from mmpipe.testing import build_processor

    proc, ref = build_processor(family), build_processor(family)
    proc.chat_template = proc.tokenizer.chat_template = published_template(family)
    ref.chat_template = ref.tokenizer.chat_template = generation_template(family)
    return proc, ref


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "glm46v"])  # Qwen3-VL, GLM-4.1V: no reply images
def test_image_in_a_reply_is_never_labelled(family):
    proc, ref = _processors(family)
    image = _image()
    conv = copy.deepcopy(IMAGE_REPLY)
    conv[1]["content"][1] = {"type": "image", "image": image}
    out = ref.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)
    vision = [i for i in get_family(family).vision_token_ids(proc.tokenizer).values() if i is not None]
    row = mmpipe.encode_row({"messages": IMAGE_REPLY, "images": [image]}, proc)
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where((mask == 1) & ~np.isin(ids, vision), ids, -100))
    assert np.isin(ids[mask == 1], vision).sum() >= 3  # the mask itself covers the image's tokens
    labelled = proc.tokenizer.decode(row.input_ids[row.labels != -100])
    assert "Here:" in labelled and " a cat." in labelled
    # the batched layout path (pixels="none") labels the same
    columns, good = layout_batch.encode_layout(make_encoder(proc, pixels="none"),
                                               [{"messages": IMAGE_REPLY, "images": [image]}], [0])
    assert good == [0]
    np.testing.assert_array_equal(np.asarray(columns["labels"][0], np.int64), row.labels)


@pytest.mark.parametrize("family, role, turns", [
    ("qwen3_vl", "assistant", [{"role": "user", "content": "Draw."},
                               {"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "ok"}]}]),
    ("qwen3_vl", "system", [{"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "Be brief."}]},
                            {"role": "user", "content": "hi"}]),
    ("glm4v", "tool", [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "checking"},
                       {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "map"}]},
                       {"role": "assistant", "content": "sunny"}]),
])
def test_dropped_image_error_names_the_turn_that_held_it(family, role, turns):
    if family == "glm4v":
        from mmpipe.offline.glm4v import build_processor

        proc = build_processor()
    else:
        from mmpipe.testing import build_processor

        proc = build_processor(family)
    proc.chat_template = proc.tokenizer.chat_template = published_template(family)
    at = next(i for i, m in enumerate(turns) if m["role"] == role)
    with pytest.raises(PlaceholderError) as e:
        mmpipe.Encoder(proc).encode_row({"messages": turns, "images": [_image()]}, idx=4)
    err = e.value
    assert f"message {at} ({role}, 1 image)" in err.fix and f"drops images in {role} messages" in err.fix
    assert "system" not in err.fix or role == "system"
    assert (err.expected, err.found, err.column) == (f"one {get_family(family).image_token} per image", "0", "messages")
    assert "row 4" in str(err)


def test_dropped_user_image_error_claims_no_cause():
    """A template that drops an image of a user turn (here: one that renders no image items): the
    error names where the images sit and claims no role the template drops."""
    from mmpipe.testing import build_processor

    proc = build_processor("qwen2_vl")
    proc.chat_template = proc.tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    turns = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    with pytest.raises(PlaceholderError) as e:
        mmpipe.encode_row({"messages": turns, "images": [_image()]}, proc)
    assert "the images sit in message 0 (user, 1 image)" in e.value.fix and "apparently" not in e.value.fix
