"""``chat_template_kwargs`` holding one of ``apply_chat_template``'s own arguments, which the
encoder passes itself (``add_generation_prompt``, ``tokenize``, ``conversation``), is refused when
the `Encoder` is built, naming the option to use instead. Before, every row failed with an
`InputError` about a TypeError whose fix said to "check the roles and their order", and with
``on_error="skip"`` a whole dataset became failed rows."""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError

from conftest import processor_for

RAW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
       "images": [testing.tiny_image(40, 56, seed=1)]}


@pytest.mark.parametrize("key, value, fix", [("add_generation_prompt", False, "add_generation_prompt= option"),
                                             ("tokenize", True, "leave it out")])
def test_apply_chat_template_arguments_are_refused_up_front(key, value, fix):
    with pytest.raises(ArgumentError, match=f"chat_template_kwargs\\['{key}'\\].*{fix}"):
        mmpipe.Encoder(processor_for("qwen2_vl"), chat_template_kwargs={"add_vision_id": True, key: value})


def test_template_keywords_still_pass():
    """Guard: template keywords are passed on (the row has the vision id)."""
    proc = processor_for("qwen2_vl")
    row = mmpipe.Encoder(proc, chat_template_kwargs={"add_vision_id": True}).encode_row(RAW)
    assert "Picture 1:" in proc.tokenizer.decode(row.input_ids)
