"""The GLM family's chat templates AS PUBLISHED (the text users load with the checkpoint), held to
the processor's own chat path: mmpipe's rows (ids, mm_token_type_ids, pixels) equal
``apply_chat_template(..., tokenize=True, return_dict=True)`` and every reply's labels equal
transformers' assistant mask on a ``{% generation %}`` copy / the reply as the template writes it
after its generation prompt, with a system prompt, ``tools=`` given, a tool-call turn followed by a
tool response and a final answer, images in two turns, ``enable_thinking`` left out / False; RL
prompts (``add_generation_prompt=True``) equal the chat path and `mmpipe.rollout.to_vllm_prompts`
rebuilds them.

- GLM-4.1V: zai-org/GLM-4.1V-9B-Thinking's template
  (`mmpipe.offline.glm4v.GLM4V_PUBLISHED_CHAT_TEMPLATE`). It has no tool branch and no
  ``enable_thinking``: a tool response and ``tools=`` render as nothing, tool calls are dropped.
- GLM-4.6V: its own published text was not found to write here; the nearest published GLM-4.5V-style
  text users load with a ``Glm46VProcessor`` is GLM-OCR's
  (`mmpipe.offline.same_family_lines.GLM_OCR_CHAT_TEMPLATE`): held here with ``tools=`` (the
  ``# Tools`` system header) and a system prompt, which its own tests leave out."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import mmpipe
from mmpipe.rollout import to_vllm_prompts

from helpers import TOOL_CALL, chat_images as _images, labelled_texts as _labelled_texts, template_replies, \
    with_chat_images as _with_images

transformers = pytest.importorskip("transformers")

IMG = {"type": "image"}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
KWARGS = [{}, {"enable_thinking": False}]
KW_IDS = ["thinking default", "enable_thinking False"]
CONVERSATIONS = {
    "system, images in two turns": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [IMG, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A square."},
        {"role": "user", "content": [{"type": "text", "text": "and this"}, IMG]},
        {"role": "assistant", "content": "Another square."}],
    "tool call, tool response, final answer": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": [IMG, {"type": "text", "text": "Weather where this was taken?"}]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}],
    "tool call with empty content": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}],
}


def _own(proc, conv, images, kw, **opts):
    target = proc if images else proc.tokenizer
    return target.apply_chat_template(_with_images(conv, images), tools=TOOLS, tokenize=True, return_dict=True,
                                      return_tensors="np", **opts, **kw)


def _assert_rows_equal_chat_path(proc, row, own, images):
    assert row.input_ids.tolist() == np.asarray(own["input_ids"]).reshape(-1).tolist()
    if images:
        got = mmpipe.collate([row], processor=proc).model_inputs()
        assert got["mm_token_type_ids"][0].tolist() == own["mm_token_type_ids"][0].tolist()
        np.testing.assert_array_equal(got["pixel_values"].numpy(), own["pixel_values"])


def _assert_prompt_labels(proc, conv, images, kw, row):
    """The earlier reply keeps its labels (the row that ends at that reply is a prefix); the last
    user turn and the generation prompt are unlabelled."""
    assert conv[-1]["role"] == "user" and conv[-2]["role"] == "assistant"
    n_images = len(_images(conv[:-1]))
    plain = mmpipe.Encoder(proc, tools=TOOLS, **({"chat_template_kwargs": kw} if kw else {})).encode_row(
        {"messages": conv[:-1], "images": images[:n_images]})
    n = len(plain.input_ids)
    assert row.input_ids[:n].tolist() == plain.input_ids.tolist() and len(row.input_ids) > n
    assert row.labels[:n].tolist() == plain.labels.tolist() and (plain.labels != -100).any()
    assert (np.asarray(row.labels[n:]) == -100).all()


def _assert_vllm_prompt_rebuilds(proc, row, own, n_images):
    prompt = to_vllm_prompts([row], proc)[0]
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    counts = iter([int(np.prod(g)) // proc.image_processor.merge_size ** 2 for g in own["image_grid_thw"]])
    rebuilt = [t for tok in prompt["prompt_token_ids"] for t in ([tok] * next(counts) if tok == image_id else [tok])]
    assert rebuilt == row.input_ids.tolist()
    assert len(prompt["multi_modal_data"]["image"]) == n_images


# --- GLM-4.1V (zai-org/GLM-4.1V-9B-Thinking) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def glm41v():
    """(processor with the published template, the same with its {% generation %} copy)."""
    from mmpipe.offline.glm4v import GLM4V_PUBLISHED_CHAT_TEMPLATE, build_processor
    from mmpipe.offline.published_templates import generation_template

    proc = build_processor()
    proc.chat_template = proc.tokenizer.chat_template = GLM4V_PUBLISHED_CHAT_TEMPLATE
    ref = copy.deepcopy(proc)
    ref.chat_template = ref.tokenizer.chat_template = generation_template("glm4v")
    return proc, ref


def test_glm41v_published_constant_is_the_checkpoint_text():
    """The text recorded from zai-org/GLM-4.1V-9B-Thinking (revision 3c1471e5): its JSON string's
    sha256 as recorded there."""
    import hashlib
    import json

    from mmpipe.offline.glm4v import GLM4V_PUBLISHED_CHAT_TEMPLATE

    digest = hashlib.sha256(json.dumps(GLM4V_PUBLISHED_CHAT_TEMPLATE).encode()).hexdigest()
    assert digest == "5232dbe7ee947df4d2009f2b262b70a22d4f2d2f0590e2af4ef2a78096171e90"


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_glm41v_rows_and_labels_equal_the_published_template(glm41v, name, kw):
    proc, ref = glm41v
    conv = CONVERSATIONS[name]
    images = _images(conv)
    row = mmpipe.Encoder(proc, tools=TOOLS, **({"chat_template_kwargs": kw} if kw else {})).encode_row(
        {"messages": conv, "images": images})
    own = _own(proc, conv, images, kw)
    _assert_rows_equal_chat_path(proc, row, own, images)
    target = ref if images else ref.tokenizer
    masked = target.apply_chat_template(_with_images(conv, images), tools=TOOLS, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, **kw)
    ids, mask = np.asarray(masked["input_ids"]).reshape(-1), np.asarray(masked["assistant_masks"]).reshape(-1)
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))
    assert (row.labels != -100).any()


def _check_rl_prompts(proc, kw):
    """An RL prompt (``add_generation_prompt=True``, ``tools=``) of a conversation with a history reply
    and images in two turns: its row equals the chat path, the history reply keeps its labels, and
    `to_vllm_prompts` rebuilds its ids."""
    conv = CONVERSATIONS["system, images in two turns"][:4]
    images = _images(conv)
    enc = mmpipe.Encoder(proc, tools=TOOLS, add_generation_prompt=True,
                         **({"chat_template_kwargs": kw} if kw else {}))
    row = enc.encode_row({"messages": conv, "images": images})
    own = _own(proc, conv, images, kw, add_generation_prompt=True)
    _assert_rows_equal_chat_path(proc, row, own, images)
    _assert_prompt_labels(proc, conv, images, kw, row)
    _assert_vllm_prompt_rebuilds(proc, row, own, 2)


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
def test_glm41v_rl_prompts_and_vllm_prompts(glm41v, kw):
    _check_rl_prompts(glm41v[0], kw)


# --- the GLM-4.5V-style text on a Glm46VProcessor (GLM-OCR's, published) -----------------------------------

@pytest.fixture(scope="module")
def glm46v():
    if not hasattr(transformers, "Glm46VProcessor"):
        pytest.skip(f"transformers {transformers.__version__} has no glm46v")
    from mmpipe.offline.glm46v import build_processor
    from mmpipe.offline.same_family_lines import GLM_OCR_CHAT_TEMPLATE

    proc = build_processor()
    proc.chat_template = proc.tokenizer.chat_template = GLM_OCR_CHAT_TEMPLATE
    return proc


def _replies(proc, conv, kw) -> list:
    return template_replies(proc, conv, kw, tools=TOOLS)


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_glm46v_rows_and_labels_with_tools_in_the_system_header(glm46v, name, kw):
    proc = glm46v
    conv = CONVERSATIONS[name]
    images = _images(conv)
    row = mmpipe.Encoder(proc, tools=TOOLS, **({"chat_template_kwargs": kw} if kw else {})).encode_row(
        {"messages": conv, "images": images})
    own = _own(proc, conv, images, kw)
    _assert_rows_equal_chat_path(proc, row, own, images)
    assert "# Tools" in proc.tokenizer.decode(row.input_ids)
    assert _labelled_texts(proc, row) == _replies(proc, conv, kw)


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
def test_glm46v_rl_prompts_with_tools_and_vllm_prompts(glm46v, kw):
    _check_rl_prompts(glm46v, kw)


# reasoning rendered where the generation prompt closes the thinking block: refused, as inline <think>
REASONING = {
    "reasoning_content on the answer": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "ans", "reasoning_content": "done"}],
    "reasoning_content on a tool-call reply": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "need a tool", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}],
    "inline <think> (refused before too)": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>done</think>ans"}],
}


@pytest.mark.parametrize("name", sorted(REASONING))
def test_glm46v_reasoning_under_enable_thinking_false_is_refused_not_left_unlabelled(glm46v, name):
    """The template renders a reply's reasoning after the last user turn even with
    enable_thinking=False, whose generation prompt closes the thinking block ("<think></think>"):
    the reply's span is not defined, so the row is refused naming the thinking block, as for
    reasoning written inline. Before, ``reasoning_content`` was encoded silently: the answer's
    "<think>done</think>" stayed in the text unlabelled ('ans' only), while a tool-call reply's
    reasoning was labelled ("<think>need a tool</think>..." although the prompt closes it)."""
    from mmpipe.errors import InputError

    conv = REASONING[name]
    enc = mmpipe.Encoder(glm46v, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(InputError, match="thinking block"):
        enc.encode_row({"messages": conv})
    row = mmpipe.Encoder(glm46v).encode_row({"messages": conv})  # thinking left on: the reasoning is labelled
    assert all(t.startswith("<think>") for t in _labelled_texts(glm46v, row))
    assert _labelled_texts(glm46v, row) == _replies(glm46v, conv, {})


@pytest.mark.parametrize("name", ["reasoning_content on the answer", "reasoning_content on a tool-call reply"])
def test_qwen3_6_reasoning_under_enable_thinking_false_is_refused_too(name):
    """The same on Qwen3.6's published template (`mmpipe.offline.published_525`): before, 'ans<|im_end|>'
    labelled with "<think>\\ndone\\n</think>\\n\\n" in the text unlabelled, and a tool-call reply's
    reasoning labelled."""
    from mmpipe.errors import InputError
    from mmpipe.offline.published_525 import QWEN3_6_CHAT_TEMPLATE
    from mmpipe.testing import build_processor

    proc = build_processor("qwen3_vl")
    proc.chat_template = proc.tokenizer.chat_template = QWEN3_6_CHAT_TEMPLATE
    with pytest.raises(InputError, match="thinking block"):
        mmpipe.Encoder(proc, chat_template_kwargs={"enable_thinking": False}).encode_row(
            {"messages": REASONING[name]})


def test_glm46v_json_string_tool_arguments_refused_with_the_fix(glm46v):
    """The GLM-4.5V-style templates iterate a call's ``arguments.items()``: OpenAI-style JSON-string
    arguments (which mmpipe's parser accepts) make the template fail, in transformers' chat path as
    in mmpipe. The refusal now says so and how to fix it; before, its fix read only "check the roles
    and their order against the model's chat template"."""
    from mmpipe.errors import InputError

    call = {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    conv = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(Exception):
        glm46v.apply_chat_template(conv, tokenize=False)
    with pytest.raises(InputError, match=r"arguments are JSON strings: pass them as dicts \(json.loads\)"):
        mmpipe.Encoder(glm46v).encode_row({"messages": conv})
    fixed = [{**m, "tool_calls": [{**call, "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}
             if m.get("tool_calls") else m for m in conv]
    row = mmpipe.Encoder(glm46v).encode_row({"messages": fixed})
    assert "<arg_value>Paris</arg_value>" in glm46v.tokenizer.decode(row.input_ids)
