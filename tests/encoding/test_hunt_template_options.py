"""Chat-template options through `mmpipe.Encoder`, measured against the processor's own chat path
(``apply_chat_template(..., tokenize=True, return_dict=True)``) and, for labels, transformers'
assistant mask on a ``{% generation %}`` copy of each published template. Guards (they passed
before this hunt's fixes): ``add_vision_id`` (``Picture N:``), custom / empty / default system
prompts, generation prompts for prompt rows and answered rows, ``continue_final_message``,
GLM-4.6V's ``enable_thinking``; the answer labelled, nothing else."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.offline.published_templates import PUBLISHED

from conftest import processor_for
from helpers import chat_path, published_pair

NATIVE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "glm46v", "gemma3", "internvl", "llava_onevision")
IMAGES = [testing.tiny_image(40, 56, seed=1), testing.tiny_image(48, 64, seed=2)]
USER = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " one,"}, {"type": "image"},
                                    {"type": "text", "text": " two. What?"}]}
ANSWER = {"role": "assistant", "content": [{"type": "text", "text": "Two boxes."}]}

CASES = {  # name -> (messages, chat_template_kwargs)
    "vision ids": ([USER, ANSWER], {"add_vision_id": True}),
    "custom system": ([{"role": "system", "content": [{"type": "text", "text": "Be terse."}]}, USER, ANSWER], {}),
    "empty system": ([{"role": "system", "content": [{"type": "text", "text": ""}]}, USER, ANSWER], {}),
    "prompt row, vision ids": ([USER], {"add_vision_id": True}),
    "continue final message": ([USER, {"role": "assistant", "content": [{"type": "text", "text": "Two"}]}],
                               {"continue_final_message": True}),
}


@pytest.mark.parametrize("family", NATIVE)
@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_equal_the_chat_path_with_the_template_options(family, case):
    messages, kwargs = CASES[case]
    proc, raw = processor_for(family), {"messages": messages, "images": IMAGES}
    prompt = messages[-1]["role"] != "assistant"
    ref = chat_path(proc, raw, add_generation_prompt=prompt, **kwargs)
    row = mmpipe.encode_row(raw, proc, chat_template_kwargs=kwargs or None)
    np.testing.assert_array_equal(row.input_ids, np.asarray(ref["input_ids"]).reshape(-1))
    batch = mmpipe.Collator(proc)([row]).model_inputs()
    for key in ("pixel_values", "image_grid_thw"):
        if key in ref:
            np.testing.assert_array_equal(np.asarray(batch[key]), np.asarray(ref[key]), err_msg=key)
    labelled = proc.tokenizer.decode(row.input_ids[row.labels != mmpipe.IGNORE_INDEX])
    reply = "" if prompt else messages[-1]["content"][0]["text"]
    stops = ("", "<|im_end|>", "<end_of_turn>", "<think></think>\n")  # what each template writes around it
    assert any(labelled in (reply + s, s + reply) for s in stops) if reply else labelled == "", labelled


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_published_templates_label_as_their_generation_copy_with_vision_ids(family):
    """ids and labels == transformers' assistant mask on the generation copy, add_vision_id on."""
    proc, ref = published_pair(processor_for(family), family)
    # GLM-4.1V's template prints assistant content as it is: a string there (as transformers needs it)
    conv = [USER, {"role": "assistant", "content": "Two boxes." if family == "glm4v" else ANSWER["content"]},
            {"role": "user", "content": [{"type": "text", "text": "Sure?"}]},
            {"role": "assistant", "content": "Yes." if family == "glm4v" else [{"type": "text", "text": "Yes."}]}]
    it = iter(IMAGES)
    inline = [{**m, "content": [dict(p, image=next(it)) if p.get("type") == "image" else p for p in m["content"]]}
              if isinstance(m["content"], list) else m for m in conv]
    out = ref.apply_chat_template(inline, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                  add_vision_id=True)
    ids, mask = np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)
    row = mmpipe.Encoder(proc, chat_template_kwargs={"add_vision_id": True}).encode_row(
        {"messages": conv, "images": IMAGES})
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))


@pytest.mark.parametrize("thinking", [False, True])
def test_glm46v_enable_thinking_prompts_and_answers(thinking):
    """Prompt rows end as the processor's generation prompt does (``<think></think>\\n`` when
    thinking is off); an answered row's answer is labelled, and its text is the chat path's."""
    proc = processor_for("glm46v")
    kwargs = {"enable_thinking": thinking}
    prompt = {"messages": [USER], "images": IMAGES}
    row = mmpipe.encode_row(prompt, proc, chat_template_kwargs=kwargs)
    np.testing.assert_array_equal(row.input_ids, np.asarray(chat_path(proc, prompt, add_generation_prompt=True,
                                                                      **kwargs)["input_ids"]).reshape(-1))
    assert proc.tokenizer.decode(row.input_ids).endswith("<|assistant|>\n" + ("" if thinking else "<think></think>\n"))
    answered = {"messages": [USER, ANSWER], "images": IMAGES}
    row = mmpipe.encode_row(answered, proc, chat_template_kwargs=kwargs)
    np.testing.assert_array_equal(row.input_ids, np.asarray(chat_path(proc, answered, **kwargs)["input_ids"]).reshape(-1))
    assert proc.tokenizer.decode(row.input_ids[row.labels != mmpipe.IGNORE_INDEX]).endswith("Two boxes.")
