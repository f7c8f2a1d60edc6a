"""Qwen3.6 (rows of the qwen3_vl family: its checkpoints ship ``Qwen3VLProcessor``) with the chat
template AS PUBLISHED (`mmpipe.offline.published_525.QWEN3_6_CHAT_TEMPLATE`; Qwen3.5's differs in the
``preserve_thinking`` gate only): ``<think>\\n`` opened by the generation prompt, reasoning written on
replies after the last user query only, tool calls as ``<function=...><parameter=...>``, tool results
in a user turn. Guards (they pass on the code before this hunt): mmpipe's rows equal the processor's
chat path (ids, mm_token_type_ids, pixels) with ``enable_thinking`` left out and False; each reply
after the last user query is labelled as exactly what the template writes after its generation prompt
(transformers' renders), a history reply as its text and ``<|im_end|>``; RL prompts equal the chat path
and `mmpipe.rollout.to_vllm_prompts` rebuilds their ids; a reply's reasoning under
``enable_thinking=False`` (rendered, yet the prompt closes the think block) is refused, typed."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.errors import InputError
from mmpipe.offline.published_525 import QWEN3_6_CHAT_TEMPLATE
from mmpipe.rollout import to_vllm_prompts

from helpers import chat_images as _images, labelled_texts as _labelled_texts, template_reply as _after_prompt, \
    with_chat_images as _with_images

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3_5ForConditionalGeneration"):
    pytest.skip(f"transformers {transformers.__version__} has no Qwen3.5", allow_module_level=True)

from mmpipe.offline.qwen3_5 import build_qwen3_5_processor  # noqa: E402

TOOL_CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
IMG = {"type": "image"}
CONVERSATIONS = {
    "one image": [{"role": "user", "content": [IMG, {"type": "text", "text": "What?"}]},
                  {"role": "assistant", "content": "Hello world"}],
    "reasoning": [{"role": "user", "content": [IMG, {"type": "text", "text": "q"}]},
                  {"role": "assistant", "content": "<think>hmm</think>ans"}],
    "tool call, empty content": [
        {"role": "user", "content": [IMG, {"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}, {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}],
    "tool call after text": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}],
}
MULTI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [IMG, {"type": "text", "text": "a?"}]},
         {"role": "assistant", "content": "<think>x</think>one"},
         {"role": "user", "content": [{"type": "text", "text": "and"}, IMG]}, {"role": "assistant", "content": "two"}]
KWARGS = [{}, {"enable_thinking": False}]
KW_IDS = ["thinking default", "enable_thinking False"]


@pytest.fixture(scope="module")
def proc():
    p = build_qwen3_5_processor()
    p.chat_template = p.tokenizer.chat_template = QWEN3_6_CHAT_TEMPLATE
    return p


def _encode(proc, conv, kw, **opts):
    images = _images(conv)
    enc = mmpipe.Encoder(proc, **({"chat_template_kwargs": kw} if kw else {}), **opts)
    return enc.encode_row({"messages": conv, "images": images}), images


def _same_as_chat_path(proc, row, conv, images, kw, **call):
    own = proc.apply_chat_template(_with_images(conv, images), tokenize=True, return_dict=True, return_tensors="np",
                                   **kw, **call)
    assert row.input_ids.tolist() == own["input_ids"][0].tolist()
    got = mmpipe.collate([row], processor=proc).model_inputs()
    assert got["mm_token_type_ids"][0].tolist() == own["mm_token_type_ids"][0].tolist()
    if images:
        np.testing.assert_array_equal(got["pixel_values"].numpy(), own["pixel_values"])
    return own


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_rows_and_labels_equal_the_published_template(proc, name, kw):
    conv = CONVERSATIONS[name]
    if kw and name == "reasoning":
        with pytest.raises(InputError, match="span of reply"):
            _encode(proc, conv, kw)
        return
    row, images = _encode(proc, conv, kw)
    _same_as_chat_path(proc, row, conv, images, kw)
    ks = [k for k, m in enumerate(conv) if m["role"] == "assistant"]  # all after the last user query
    assert _labelled_texts(proc, row) == [_after_prompt(proc, conv, k, kw) for k in ks]


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
def test_images_in_two_turns_and_a_history_reply(proc, kw):
    row, images = _encode(proc, MULTI, kw)
    _same_as_chat_path(proc, row, MULTI, images, kw)
    # the history reply: its answer as the template writes it (reasoning dropped, no think block)
    assert _labelled_texts(proc, row) == ["one<|im_end|>", _after_prompt(proc, MULTI, 4, kw)]


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
def test_rl_prompts_and_vllm_prompts(proc, kw):
    conv = MULTI[:2]
    row, images = _encode(proc, conv, kw, add_generation_prompt=True)
    own = _same_as_chat_path(proc, row, conv, images, kw, add_generation_prompt=True)
    assert proc.tokenizer.decode(row.input_ids).endswith("<think>\n\n</think>\n\n" if kw else "assistant\n<think>\n")
    assert (np.asarray(row.labels) == -100).all()
    prompt = to_vllm_prompts([row], proc)[0]
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    n = int(np.prod(own["image_grid_thw"][0])) // proc.image_processor.merge_size ** 2
    rebuilt = [t for tok in prompt["prompt_token_ids"] for t in ([tok] * n if tok == pad else [tok])]
    assert rebuilt == row.input_ids.tolist()


def test_the_reasoning_refusal_names_the_thinking_block_and_its_fix(proc):
    """The refusal of a reply's reasoning under ``enable_thinking=False`` says where the renders part
    (a thinking block the generation prompt closes) and what to do; it survives a DataLoader worker's re-raise."""
    with pytest.raises(InputError) as info:
        _encode(proc, CONVERSATIONS["reasoning"], {"enable_thinking": False})
    e = info.value
    assert "differ at a thinking block" in str(e) and "enable_thinking=True" in e.fix
    text = (f"Caught InputError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            f"  File \"x.py\", line 1, in f\nmmpipe.errors.InputError: {e}")  # torch's re-raise of a worker's error
    again = type(e)(text)
    assert again.fix == e.fix and again.column == "messages"
