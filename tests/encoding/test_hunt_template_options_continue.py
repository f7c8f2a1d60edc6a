"""``chat_template_kwargs={"continue_final_message": True}`` (a prefilled last reply, left open):
the earlier replies keep their labels as without it, end of turn included, and the text is the
processor's chat path. Reference: transformers' assistant mask on the ``{% generation %}`` copy
of each published template (transformers refuses the mask with the keyword itself: the mask of the
whole conversation, over the tokens the open rendering keeps).

Before the fix the encoder's probes of how the template ends a reply (`stop_rule`) and where a
reply starts (`reply_header`) rendered with the keyword too, which cut each probe's own last turn
open: the template's end of turn looked unwritten, so every earlier reply lost its ``<|im_end|>``
/ ``<end_of_turn>`` label (``First.Partial`` instead of ``First.<|im_end|>Partial``), and
GLM-4.6V's replies their ``<think></think>``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.offline.published_templates import PUBLISHED

from conftest import processor_for
from helpers import published_pair

IMAGE = testing.tiny_image(40, 56, seed=1)


def _conversation(family: str) -> list:
    text = (lambda t: t) if family == "glm4v" else (lambda t: [{"type": "text", "text": t}])  # GLM prints it as is
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": text("First.")},
            {"role": "user", "content": [{"type": "text", "text": "And?"}]},
            {"role": "assistant", "content": text("Partial")}]


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_continue_final_message_keeps_the_earlier_replies_labels(family):
    proc, ref = published_pair(processor_for(family), family)
    conv = _conversation(family)
    inline = [{**m, "content": [dict(p, image=IMAGE) if p.get("type") == "image" else p for p in m["content"]]}
              if isinstance(m["content"], list) else m for m in conv]
    out = ref.apply_chat_template(inline, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    full, mask = np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)
    ids = np.asarray(proc.apply_chat_template(inline, tokenize=True, return_dict=True,
                                              continue_final_message=True)["input_ids"]).reshape(-1)
    np.testing.assert_array_equal(ids, full[:len(ids)])  # the open rendering: a head of the whole one
    row = mmpipe.Encoder(proc, chat_template_kwargs={"continue_final_message": True}).encode_row(
        {"messages": conv, "images": [IMAGE]})
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask[:len(ids)] == 1, ids, -100))
    assert proc.tokenizer.decode(row.input_ids).endswith("Partial")  # the last reply is left open


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "glm46v", "gemma3", "internvl", "llava_onevision"])
def test_the_earlier_replies_are_labelled_as_without_the_keyword(family):
    """The labels of everything before the open reply equal the row's labels without the keyword."""
    proc, conv = processor_for(family), _conversation(family)
    raw = {"messages": conv, "images": [IMAGE]}
    plain = mmpipe.encode_row(raw, proc)
    row = mmpipe.encode_row(raw, proc, chat_template_kwargs={"continue_final_message": True})
    n = len(row.input_ids) - len(proc.tokenizer("Partial", add_special_tokens=False)["input_ids"])
    np.testing.assert_array_equal(row.input_ids[:n], plain.input_ids[:n])
    np.testing.assert_array_equal(row.labels[:n], plain.labels[:n])
    assert (row.labels[n:] != mmpipe.IGNORE_INDEX).all()  # the open reply's text is labelled
