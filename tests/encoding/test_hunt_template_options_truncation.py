"""``truncation="truncate_text"`` on a prompt row keeps what the template writes at the end of the
last turn, whatever the template keywords make it: GLM-4.6V with ``enable_thinking=False`` ends
each user turn with ``/nothink`` (the model's switch), then ``<|assistant|>\\n<think></think>\\n``.

Before the fix the cut kept the generation prompt and the family's stop token only: GLM writes no
stop token after a user turn, so ``/nothink`` was cut with the text before it and the prompt asked
a thinking-off answer without the switch the template writes (silently, the row's length right).
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing

from conftest import processor_for

END = "/nothink<|assistant|>\n<think></think>\n"


def _prompt(history: bool) -> dict:
    turns = [{"role": "user", "content": [{"type": "text", "text": "first question"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]}] if history else []
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "long question " * 20}]}
    return {"messages": turns + [user], "images": [testing.tiny_image(40, 56, seed=1)]}


@pytest.mark.parametrize("history", [False, True])
@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_a_cut_glm46v_prompt_keeps_the_no_think_switch(history, pixels):
    proc, kwargs = processor_for("glm46v"), {"enable_thinking": False}
    raw = _prompt(history)
    full = mmpipe.encode_row(raw, proc, chat_template_kwargs=kwargs, pixels=pixels)
    assert proc.tokenizer.decode(full.input_ids).endswith("question " + END)
    cap = full.num_tokens - 10
    cut = mmpipe.encode_row(raw, proc, chat_template_kwargs=kwargs, pixels=pixels, max_length=cap,
                            truncation="truncate_text")
    assert cut.num_tokens == cap and cut.num_images == 1
    assert proc.tokenizer.decode(cut.input_ids).endswith(END), proc.tokenizer.decode(cut.input_ids[-12:])
    # a head of the full row, then its end: the text before the switch is what is cut
    kept = int(np.flatnonzero(cut.input_ids != full.input_ids[:cap])[0])
    np.testing.assert_array_equal(cut.input_ids[kept:], full.input_ids[full.num_tokens - (cap - kept):])
    cut.validate()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "glm46v"])
def test_the_cut_keeps_the_same_end_without_keywords(family):
    """Guard: without template keywords the kept end is the turn's end of turn and the generation
    prompt, as before (Qwen ``<|im_end|>\\n<|im_start|>assistant\\n``; GLM-4.6V the prompt only)."""
    proc, raw = processor_for(family), _prompt(False)
    full = mmpipe.encode_row(raw, proc)
    cut = mmpipe.encode_row(raw, proc, max_length=full.num_tokens - 10, truncation="truncate_text")
    end = "<|assistant|>\n" if family == "glm46v" else "<|im_end|>\n<|im_start|>assistant\n"
    text = proc.tokenizer.decode(cut.input_ids)
    assert text.endswith("question" + end) or text.endswith("question " + end), text[-60:]
