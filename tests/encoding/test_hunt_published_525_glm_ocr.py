"""GLM-OCR (transformers 5.25 ``glm_ocr``, rows of the glm46v family) with the chat template AS
PUBLISHED with its checkpoint (`mmpipe.offline.same_family_lines.GLM_OCR_CHAT_TEMPLATE`): the
template users load, not the family's offline one. mmpipe's rows equal the processor's own chat
path (ids, mm_token_type_ids, pixels) for an OCR prompt, several image turns with a system prompt,
``<think>`` content and a tool-call turn, with ``enable_thinking`` left out and False; each reply's
labels are exactly what the template writes for it after the generation prompt (the conversation
rendered up to the reply minus the one before it with the generation prompt: transformers' own
renders), tool calls included; RL prompts (``add_generation_prompt=True``) equal the chat path and
`mmpipe.rollout.to_vllm_prompts` rebuilds the same ids.

Found: the template writes no stop token after a reply, so a reply's ``<tool_call>...</tool_call>``
(and the whole of a tool-call reply with empty content) was never labelled (markers end at the
content; no stop token to run to)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.errors import InputError
from mmpipe.rollout import to_vllm_prompts

from helpers import chat_images as _images, labelled_texts as _labelled_texts, template_replies as _replies, \
    with_chat_images as _with_images

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "GlmOcrForConditionalGeneration"):
    pytest.skip(f"transformers {transformers.__version__} has no glm_ocr", allow_module_level=True)

from mmpipe.offline.same_family_lines import GLM_OCR_CHAT_TEMPLATE, build_line_processor  # noqa: E402

TOOL_CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
IMG, OCR = {"type": "image"}, {"type": "text", "text": "Text Recognition:"}
CONVERSATIONS = {
    "ocr": [{"role": "user", "content": [IMG, OCR]}, {"role": "assistant", "content": "Hello world"}],
    "system, images in two turns": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": [IMG, OCR]},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, IMG]}, {"role": "assistant", "content": "two"}],
    "thinking": [{"role": "user", "content": [IMG, OCR]}, {"role": "assistant", "content": "a"},
                 {"role": "user", "content": "again"}, {"role": "assistant", "content": "<think>hmm</think>ans"}],
    "tool call, empty content": [
        {"role": "user", "content": [IMG, {"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}, {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}],
    "tool call after text": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}],
}
KWARGS = [{}, {"enable_thinking": False}]


@pytest.fixture(scope="module")
def proc():
    p = build_line_processor("glm_ocr")
    p.chat_template = p.tokenizer.chat_template = GLM_OCR_CHAT_TEMPLATE
    return p


def _encoder(proc, kw, **opts):
    return mmpipe.Encoder(proc, **({"chat_template_kwargs": kw} if kw else {}), **opts)


@pytest.mark.parametrize("kw", KWARGS, ids=["thinking default", "enable_thinking False"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_rows_and_labels_equal_the_published_template(proc, name, kw):
    conv = CONVERSATIONS[name]
    images = _images(conv)
    if kw and name == "thinking":  # reasoning rendered, yet the prompt closes the think block: refused, typed
        with pytest.raises(InputError, match="span of reply"):
            _encoder(proc, kw).encode_row({"messages": conv, "images": images})
        return
    row = _encoder(proc, kw).encode_row({"messages": conv, "images": images})
    own = proc.apply_chat_template(_with_images(conv, images), tokenize=True, return_dict=True, return_tensors="np", **kw)
    assert row.input_ids.tolist() == own["input_ids"][0].tolist()
    got = mmpipe.collate([row], processor=proc).model_inputs()
    assert got["mm_token_type_ids"][0].tolist() == own["mm_token_type_ids"][0].tolist()
    if images:
        np.testing.assert_array_equal(got["pixel_values"].numpy(), own["pixel_values"])
    # was: the tool call of a reply unlabelled ("<think></think>\nLet me check." only; nothing for "")
    assert _labelled_texts(proc, row) == _replies(proc, conv, kw)


@pytest.mark.parametrize("kw", KWARGS, ids=["thinking default", "enable_thinking False"])
def test_rl_prompts_and_vllm_prompts(proc, kw):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [IMG, OCR]}]
    images = _images(conv)
    row = _encoder(proc, kw, add_generation_prompt=True).encode_row({"messages": conv, "images": images})
    own = proc.apply_chat_template(_with_images(conv, images), tokenize=True, return_dict=True,
                                   add_generation_prompt=True, return_tensors="np", **kw)
    assert row.input_ids.tolist() == own["input_ids"][0].tolist()
    assert (np.asarray(row.labels) == -100).all()
    prompt = to_vllm_prompts([row], proc)[0]
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    n = int(np.prod(own["image_grid_thw"][0])) // proc.image_processor.merge_size ** 2
    rebuilt = [t for tok in prompt["prompt_token_ids"] for t in ([tok] * n if tok == image_id else [tok])]
    assert rebuilt == row.input_ids.tolist()
    assert len(prompt["multi_modal_data"]["image"]) == 1
