"""One rendered reply, one answer: a reply's reasoning given three ways (``reasoning_content``,
inline ``<think>done</think>ans``, and inline without its opening tag, ``done</think>ans``, the shape
a model writes after a generation prompt that opens ``<think>``) renders the same text on
GLM-4.6V's chat format (mmpipe's offline copy and GLM-OCR's published GLM-4.5V-style text on a
``Glm46VProcessor``) and on Qwen3.6's published template. So the row gets the same labels, or
the same refusal:

- thinking on: the labels are what the template writes after the generation prompt (the
  reasoning as rendered, then the answer);
- ``enable_thinking=False``: the generation prompt closes the thinking block
  (``<think></think>``) and the user turns carry ``/nothink``, while the template still renders
  this reply's reasoning: no span of the text is what the model writes after that prompt. Labelling
  from the role line would train reasoning after ``/nothink``; dropping it (LLaMA-Factory's
  ``enable_thinking=False``) would make a row that is not the chat path's text. The row is refused
  naming the thinking block and both fixes. Before, the third shape slipped past that check and was
  labelled from the middle of the block (``done</think>\\nans``: its ``<think>`` unlabelled).
"""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe.errors import InputError

from helpers import labelled_texts

transformers = pytest.importorskip("transformers")

SHAPES = {
    "reasoning_content": {"role": "assistant", "content": "ans", "reasoning_content": "done"},
    "inline": {"role": "assistant", "content": "<think>done</think>ans"},
    "inline without its opening tag": {"role": "assistant", "content": "done</think>ans"},
}
TEMPLATES = ["glm46v offline", "glm46v with GLM-OCR's published text", "qwen3_vl with Qwen3.6's published text"]


@pytest.fixture(scope="module")
def processors():
    from mmpipe.offline.published_525 import QWEN3_6_CHAT_TEMPLATE
    from mmpipe.offline.same_family_lines import GLM_OCR_CHAT_TEMPLATE
    from mmpipe.testing import build_processor

    out = {}
    for name, family, template in [(TEMPLATES[0], "glm46v", None), (TEMPLATES[1], "glm46v", GLM_OCR_CHAT_TEMPLATE),
                                   (TEMPLATES[2], "qwen3_vl", QWEN3_6_CHAT_TEMPLATE)]:
        if family == "glm46v" and not hasattr(transformers, "Glm46VProcessor"):
            continue
        proc = build_processor(family)
        if template is not None:
            proc.chat_template = proc.tokenizer.chat_template = template
        out[name] = proc
    return out


def _proc(processors, name):
    if name not in processors:
        pytest.skip(f"transformers {transformers.__version__} lacks the class")
    return processors[name]


def _conv(shape):
    return [{"role": "user", "content": "q"}, dict(SHAPES[shape])]


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("thinking", [True, False])
def test_the_three_shapes_render_the_same_text(processors, name, thinking):
    """The premise: the template itself cannot tell the shapes apart (guard)."""
    proc = _proc(processors, name)
    texts = {proc.tokenizer.apply_chat_template(_conv(s), tokenize=False, enable_thinking=thinking) for s in SHAPES}
    assert len(texts) == 1 and "done" in texts.pop()


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_enable_thinking_false_refuses_every_shape_naming_the_thinking_block(processors, name, shape):
    """Failed before for the shape without its opening tag (DID NOT RAISE: labelled
    'done</think>\\nans' on GLM, 'done\\n</think>\\n\\nans<|im_end|>' on Qwen3.6)."""
    proc = _proc(processors, name)
    enc = mmpipe.Encoder(proc, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(InputError, match="thinking block") as got:
        enc.encode_row({"messages": _conv(shape)})
    assert "enable_thinking=True" in got.value.fix and "reasoning" in got.value.fix
    # the same row as a prompt (no training targets) is the chat path's text, reasoning included
    row = mmpipe.Encoder(proc, chat_template_kwargs={"enable_thinking": False}, labels=False).encode_row(
        {"messages": _conv(shape)})
    own = proc.tokenizer.apply_chat_template(_conv(shape), enable_thinking=False)["input_ids"]
    assert row.input_ids.tolist() == own


@pytest.mark.parametrize("name", TEMPLATES)
def test_thinking_on_labels_every_shape_alike_from_the_generation_prompt(processors, name):
    """With thinking on, each shape's labels are the text after the generation prompt (guard)."""
    proc = _proc(processors, name)
    prompt = proc.tokenizer.apply_chat_template(_conv("inline")[:1], tokenize=False, add_generation_prompt=True,
                                                enable_thinking=True)
    full = proc.tokenizer.apply_chat_template(_conv("inline"), tokenize=False, enable_thinking=True)
    assert full.startswith(prompt)
    got = {s: labelled_texts(proc, mmpipe.Encoder(proc, chat_template_kwargs={"enable_thinking": True}).encode_row(
        {"messages": _conv(s)})) for s in SHAPES}
    assert len({tuple(v) for v in got.values()}) == 1
    (reply,) = got["inline"]
    assert full[len(prompt):].rstrip("\n").startswith(reply) and reply.startswith(full[len(prompt):][:4])
    assert "done" in reply and reply.rstrip().endswith(("ans", "ans<|im_end|>"))


@pytest.mark.parametrize("name", TEMPLATES[:2])
def test_history_reasoning_under_enable_thinking_false_is_dropped_and_the_answers_labelled(processors, name):
    """An earlier reply's reasoning (any shape) is not rendered (the template keeps reasoning after
    the last user turn only): the row is the chat path's and each answer is labelled (guard)."""
    proc = _proc(processors, name)
    for shape in SHAPES:
        conv = _conv(shape) + [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "ans2"}]
        row = mmpipe.Encoder(proc, chat_template_kwargs={"enable_thinking": False}).encode_row({"messages": conv})
        own = proc.tokenizer.apply_chat_template(conv, enable_thinking=False)["input_ids"]
        assert row.input_ids.tolist() == own
        assert labelled_texts(proc, row) == ["ans", "ans2"]
