"""Multi-turn loops on thinking templates with thinking on (the template's default): GLM-4.6V's
format and Qwen3.6's published template. GLM-4.6V's generation prompt is ``<|assistant|>\\n``; a
thinking model samples ``<think>...</think>\\nanswer`` there, a reply without reasoning is rendered
``<think></think>\\nanswer`` and history reasoning becomes ``<think></think>`` after a later user
turn (Qwen3: ``<think>\\n`` opened by the prompt, history reasoning dropped). The row keeps what the
model saw, as verl's agent loop does: the generation prompt, the sampled ids (all labelled, nothing
else), then the next turn as the template writes it after a reply; positions are the M-RoPE rule
over the row (== transformers' get_rope_index). Before the fix the first reply raised InputError
('does not render an assistant reply right after the generation prompt')."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.errors import InputError
from mmpipe.rollout import multiturn as mt
from mmpipe.testing.invariants import assert_row_positions

from conftest import model_for, processor_for
from helpers import count_renders

pytest.importorskip("transformers")
from mmpipe.offline import glm46v  # noqa: E402

if not glm46v.available():
    pytest.skip("transformers without GLM-4.6V", allow_module_level=True)

HEAD = "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>Find.<|assistant|>\n"
# (reply as sampled, observation role): the reply ends with the header of the next turn GLM samples
ROUNDS = [("<think>look at it</think>\nsearch cats", "tool"), ("search dogs", "user"),
          ("<think>two</think>\nok", "tool"), ("done", "user")]
STOP = {"tool": "<|observation|>", "user": "<|user|>"}


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (28 + 28 * (i % 2), 28), (30 * i % 255, 40, 90))


def _glm_loop(rounds=ROUNDS):
    proc = processor_for("glm46v")
    tok = proc.tokenizer
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find."}]}]
    conv = mt.start({"messages": msgs, "images": [_image(0)]}, proc)
    sampled = []
    for i, (reply, role) in enumerate(rounds):
        ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(STOP[role])]
        conv = mt.append_response(conv, ids)
        sampled.append(ids)
        conv = mt.append_observation(conv, [{"type": "image"}, {"type": "text", "text": f"r{i}"}],
                                     images=[_image(i + 1)], role=role)
    return conv, sampled


def test_glm46v_thinking_loop_keeps_what_the_model_saw():
    conv, sampled = _glm_loop()
    row, tok = conv.row, processor_for("glm46v").tokenizer
    img = "<|begin_of_image|><|image|><|end_of_image|>"
    want = (HEAD + "<think>look at it</think>\nsearch cats<|observation|>\n<tool_response>\n" + img
            + "r0\n</tool_response><|assistant|>\nsearch dogs<|user|>\n" + img + "r1<|assistant|>\n"
            + "<think>two</think>\nok<|observation|>\n<tool_response>\n" + img + "r2\n</tool_response>"
            + "<|assistant|>\ndone<|user|>\n" + img + "r3<|assistant|>\n")
    assert conv.text == want
    # the ids: the text above with each image's pads expanded, the replies exactly as sampled
    n_pads = [int(t * h * w) // 4 for t, h, w in row.image_grid_thw]
    image_id = tok.convert_tokens_to_ids("<|image|>")
    text_ids = tok(want, add_special_tokens=False)["input_ids"]
    expanded, k = [], 0
    for t in text_ids:
        expanded += [t] * (n_pads[k] if t == image_id else 1)
        k += t == image_id
    np.testing.assert_array_equal(row.input_ids, expanded)
    assert len(conv.response_spans) == 4 and row.num_images == 5
    mask = np.zeros(row.num_tokens, bool)
    for (a, b), ids in zip(conv.response_spans, sampled):
        np.testing.assert_array_equal(row.input_ids[a:b], ids)
        mask[a:b] = True
    np.testing.assert_array_equal(row.labels != -100, mask)
    np.testing.assert_array_equal(row.labels[mask], row.input_ids[mask])
    assert_row_positions(row, model=model_for("glm46v"))


def test_glm46v_replies_with_reasoning_and_tool_turns_equal_the_whole_conversation():
    """Reasoning on every reply and tool turns only: the template keeps the reasoning (after the last
    user turn) and writes each reply as sampled, so the loop equals encoding the whole conversation;
    its labels are the replies as rendered from the header on (GLM's sampled <|observation|> opens the
    next turn there)."""
    rounds = [("<think>a</think>\nx", "tool"), ("<think>b c</think>\ny", "tool")]
    conv, _ = _glm_loop(rounds)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find."}]}]
    for i, (reply, _) in enumerate(rounds):
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": f"r{i}"}]}]
    whole = mmpipe.encode_row({"messages": msgs, "images": [_image(i) for i in range(3)]},
                              processor_for("glm46v"), add_generation_prompt=True)
    np.testing.assert_array_equal(conv.row.input_ids, whole.input_ids)
    np.testing.assert_array_equal(conv.row.position_ids, whole.position_ids)
    wants = np.zeros(conv.row.num_tokens, bool)
    for a, b in conv.response_spans:
        wants[a:b - 1] = True
    np.testing.assert_array_equal(whole.labels != -100, wants)


def test_glm46v_thinking_off_loop_is_unchanged():
    proc = processor_for("glm46v")
    tok = proc.tokenizer
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find."}]}]
    conv = mt.start({"messages": msgs, "images": [_image(0)]}, proc, chat_template_kwargs={"enable_thinking": False})
    conv = mt.append_response(conv, tok("ans", add_special_tokens=False)["input_ids"]
                              + [tok.convert_tokens_to_ids("<|user|>")])
    conv = mt.append_observation(conv, "more")
    assert conv.sampled == () and conv.text.endswith("<think></think>\nans<|user|>\nmore/nothink<|assistant|>\n"
                                                     "<think></think>\n")


def test_glm46v_sampled_header_of_the_wrong_turn_is_a_typed_error():
    """The reply ended with <|observation|> (a tool turn) but a user turn is appended: refused, naming
    the header, with the fix."""
    proc = processor_for("glm46v")
    tok = proc.tokenizer
    conv = mt.start({"messages": [{"role": "user", "content": "Q"}]}, proc)
    conv = mt.append_response(conv, tok("a", add_special_tokens=False)["input_ids"]
                              + [tok.convert_tokens_to_ids("<|observation|>")])
    with pytest.raises(InputError) as e:
        mt.append_observation(conv, "x", role="user")
    assert "<|observation|>" in str(e.value) and e.value.fix and "a tool turn" in e.value.fix


@pytest.fixture(scope="module")
def qwen36():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3_5ForConditionalGeneration"):
        pytest.skip("transformers without Qwen3.5")
    from mmpipe.offline.published_525 import QWEN3_6_CHAT_TEMPLATE
    from mmpipe.offline.qwen3_5 import build_qwen3_5_processor

    p = copy.copy(build_qwen3_5_processor())
    p.chat_template = QWEN3_6_CHAT_TEMPLATE
    return p


def test_qwen3_6_thinking_loop_keeps_what_the_model_saw(qwen36):
    """The same on Qwen3.6's published template: '<think>\\n' opened by the generation prompt, a
    reply with and without its '</think>', user turns (which drop history reasoning) and tool turns."""
    tok = qwen36.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    conv = mt.start({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]}],
                     "images": [_image(0)]}, qwen36)
    prompt = conv.text
    replies = ["hmm\n</think>\n\nsearch", "plain", "x\n</think>\n\nfin"]
    for i, reply in enumerate(replies):
        ids = tok(reply, add_special_tokens=False)["input_ids"] + [end]
        conv = mt.append_response(conv, ids)
        conv = mt.append_observation(conv, f"r{i}", role="user" if i % 2 else "tool")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert conv.text == (prompt + "hmm\n</think>\n\nsearch<|im_end|>\n<|im_start|>user\n<tool_response>\nr0\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nplain<|im_end|>\n"
                         "<|im_start|>user\nr1<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\nfin"
                         "<|im_end|>\n<|im_start|>user\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n")
    row = conv.row
    mask = np.zeros(row.num_tokens, bool)
    for a, b in conv.response_spans:
        mask[a:b] = True
    assert tok.decode(row.input_ids[mask].tolist()) == "".join(r + "<|im_end|>" for r in replies)
    np.testing.assert_array_equal(row.labels != -100, mask)
    assert_row_positions(row)


def test_glm46v_reply_as_text_with_reasoning_survives_a_later_user_turn():
    """append_response(text=) of a reply with its reasoning, then a user turn (which drops history
    reasoning in the template): the reply stays as written, labelled as encoding gives it."""
    proc = processor_for("glm46v")
    tok = proc.tokenizer
    conv = mt.start({"messages": [{"role": "user", "content": "Q"}]}, proc)
    conv = mt.append_response(conv, text="<think>r</think>\nans")
    conv = mt.append_observation(conv, "y")
    conv = mt.append_response(conv, tok("w", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|user|>")])
    assert conv.text == "[gMASK]<sop><|user|>\nQ<|assistant|>\n<think>r</think>\nans<|user|>\ny<|assistant|>\nw<|user|>"
    labelled = tok.decode(conv.row.input_ids[conv.row.labels != -100])
    assert labelled == "<think>r</think>\nansw<|user|>"


def test_qwen3_vl_thinking_loop_positions_equal_transformers():
    """Qwen3-VL with a thinking template (tests/thinking_templates.QWEN3_VL_THINKING), images in user
    turns that drop history reasoning: positions == the tiny Qwen3-VL's get_rope_index."""
    from thinking_templates import QWEN3_VL_THINKING

    proc = copy.copy(processor_for("qwen3_vl"))
    proc.chat_template = QWEN3_VL_THINKING
    tok = proc.tokenizer
    conv = mt.start({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]}],
                     "images": [Image.new("RGB", (32, 32), (1, 2, 3))]}, proc)
    for i, reply in enumerate(["a\n</think>\n\nb", "c", "d\n</think>\n\ne"]):
        ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        conv = mt.append_response(conv, ids)
        conv = mt.append_observation(conv, [{"type": "image"}, {"type": "text", "text": f"r{i}"}],
                                     images=[Image.new("RGB", (64, 32), (9, 2, 3))])
    assert conv.text.count("a\n</think>\n\nb<|im_end|>") == 1 and conv.row.num_images == 4
    assert tok.decode(conv.row.input_ids[conv.row.labels != -100]) == "a\n</think>\n\nb<|im_end|>c<|im_end|>d\n</think>\n\ne<|im_end|>"
    assert_row_positions(conv.row, model=model_for("qwen3_vl"))


def test_glm46v_agent_loop_thinking_on_end_to_end():
    """AgentLoop on the tiny GLM-4.6V with the template's default (thinking on): every tool turn
    appends (before the fix the first reply raised), rows stay valid, labels are the model's own
    tokens, and the training forward's logprobs match the rollout's."""
    from mmpipe.records import SamplingParams
    from mmpipe.records.trajectory import ToolCall
    from mmpipe.rollout import AgentLoop, TransformersEngine, logprob_gaps

    proc, model = processor_for("glm46v"), model_for("glm46v")
    prompts = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
                "images": [_image(i)]} for i in range(2)]
    loop = AgentLoop(TransformersEngine(model, proc), proc, {"search": lambda q: ("found:", [_image(5)])},
                     parser=lambda text: [ToolCall(name="search", arguments={"q": "x"}, text="search")],
                     max_turns=3, max_tokens=1024, max_images=6)
    trajectories = loop.run(prompts, SamplingParams(max_new_tokens=8, n=1, temperature=1.0, seed=0))
    for t in trajectories:
        t.row.validate()
        assert t.num_turns == 3 and t.row.num_images == 3
        assert (t.row.labels != -100).sum() == t.num_model_tokens
    assert logprob_gaps(model, trajectories, proc).max() < 1e-4


def test_glm46v_thinking_loop_renders_per_round_do_not_grow(monkeypatch):
    """Kept-as-sampled replies cost a fixed number of renders a round (counted, not timed): the
    probe renders are of the conversation once each, never of every prefix."""
    counted = count_renders(monkeypatch)
    proc = processor_for("glm46v")
    tok = proc.tokenizer
    conv = mt.start({"messages": [{"role": "user", "content": "Q"}]}, proc)
    per_round = []
    for i in range(24):
        reply, role = ("<think>r</think>\nans" if i % 2 else "ans"), ("user" if i % 3 else "tool")
        before = len(counted)
        ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(STOP[role])]
        conv = mt.append_observation(mt.append_response(conv, ids), "o", role=role)
        per_round.append(len(counted) - before)
    assert len(conv.sampled) == 24 and len(set(per_round[1:])) == 1, per_round
