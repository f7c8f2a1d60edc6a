"""Multi-turn appends (VRAG loop): incremental rows equal encoding the whole conversation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe import testing
from mmpipe.records.generation import Completion
from mmpipe.testing.invariants import assert_row_positions
from mmpipe.rollout.multiturn_batch import MultiTurnBatch
from mmpipe.rollout.multiturn import (
    append_messages,
    append_observation,
    append_response,
    start,
)

from conftest import model_for, processor_for
from strategies import image_pool, multiturn_cases

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
IGNORE = mmpipe.IGNORE_INDEX


def _gen_ids(tok, text):
    """What a model that 'generates' ``text`` returns: its tokens, then <|im_end|>."""
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]


def _play(case, mode):
    """Run the case's loop; returns (conversation, whole-conversation raw row, observation spans)."""
    proc = processor_for(case["family"])
    tok = proc.tokenizer
    conv = start(case["prompt"], proc, pixels=case["pixels"])
    msgs, imgs = list(case["prompt"]["messages"]), list(case["prompt"]["images"])
    obs_spans = []

    def respond(conv, text):
        msgs.append({"role": "assistant", "content": text})
        if mode == "text":
            return append_response(conv, text=text)
        return append_response(conv, _gen_ids(tok, text))

    for text, obs, obs_imgs in case["rounds"]:
        conv = respond(conv, text)
        a = conv.num_tokens
        conv = append_messages(conv, obs, obs_imgs)
        obs_spans.append((a, conv.num_tokens))
        msgs += obs
        imgs += obs_imgs
    if case["final"] is not None:
        conv = respond(conv, case["final"])
    return conv, {"messages": msgs, "images": imgs}, obs_spans


@SETTINGS
@given(multiturn_cases())
def test_incremental_equals_whole_conversation(case):
    """For any sequence of turns, appending turn by turn gives exactly the row that encoding
    the whole conversation at once gives: ids, labels, mm_token_type_ids, grids, pixels,
    positions, rope_delta (all three families, all pixel formats)."""
    proc = processor_for(case["family"])
    conv, whole, obs_spans = _play(case, "text")
    ref = mmpipe.encode_row(whole, proc, pixels=case["pixels"])
    assert conv.row.diff(ref) == [], conv.row.diff(ref)
    conv.row.validate()
    # generated ids (no re-tokenization) give the same row when the texts tokenize the same
    by_ids, _, _ = _play(case, "ids")
    assert by_ids.row.diff(ref) == []
    # observation / tool tokens (and the generation prompt after them) are never trained on
    for a, b in obs_spans:
        assert (conv.row.labels[a:b] == IGNORE).all()
    # the response mask is exactly the appended responses' tokens
    mask = np.zeros(conv.num_tokens, np.int64)
    for a, b in conv.response_spans:
        mask[a:b] = 1
    assert np.array_equal(conv.response_mask, mask)
    assert conv.awaiting_response == (case["final"] is None)
    assert len(conv.images) == conv.row.num_images == len(whole["images"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_model_sees_every_appended_image(data):
    """The collated final rows run through the tiny model; its vision tower receives every
    image of every turn (no 'Image features and image tokens do not match')."""
    family = data.draw(st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]))
    cases = data.draw(st.lists(multiturn_cases(families=(family,)), min_size=1, max_size=3))
    rows = [_play({**c, "pixels": "uint8"}, "ids")[0].row for c in cases]
    proc, model = processor_for(family), model_for(family)
    batch = mmpipe.collate(rows, processor=proc, padding_side=data.draw(st.sampled_from(["left", "right"])))
    seen = []
    hook = model.model.visual.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs.get("grid_thw", args[1] if len(args) > 1 else None)),
        with_kwargs=True)
    try:
        with torch.no_grad():
            out = model(**batch.model_inputs())
    finally:
        hook.remove()
    assert torch.isfinite(out.logits).all()
    n_images = sum(r.num_images for r in rows)
    if n_images:
        assert len(seen) == 1 and seen[0].shape[0] == n_images
        assert torch.equal(seen[0], torch.from_numpy(np.concatenate([r.image_grid_thw for r in rows])))
    else:
        assert seen == []


def _question(i, n_images):
    content = [{"type": "text", "text": f"question {i}"}]
    for _ in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": " see."}]
    return {"messages": [{"role": "user", "content": content}], "images": image_pool()[:n_images]}


def test_batch_loop_rows_finishing_early_stop_and_map_back():
    """4 conversations, 2 finish early (one with a final answer, one marked done); the active
    mapping returns original indices and finished rows never change."""
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    batch = MultiTurnBatch.start([_question(i, i % 3) for i in range(4)], proc)
    assert batch.active_indices == [0, 1, 2, 3]
    assert [r.num_images for r in batch.active_rows()] == [0, 1, 2, 0]

    frozen = {}
    for rnd in range(3):
        idx = batch.active_indices
        rows = batch.active_rows()
        assert [i for i, _ in batch.active()] == idx and len(rows) == len(idx)
        for i, row in zip(idx, rows):
            assert row is batch[i].row  # the engine's k-th prompt belongs to original row idx[k]
            finished = (rnd, i) == (0, 1)
            reply = Completion(token_ids=_gen_ids(tok, f"answer {i}.{rnd}"), finish_reason="stop")
            batch.append_response(i, reply, done=finished)
        if rnd == 1:
            batch.mark_done(3, "length")
        for i, conv in batch.active():
            batch.append_observation(i, [{"type": "text", "text": f"result {rnd}"}, {"type": "image"}],
                                     images=[image_pool()[(i + rnd) % 7]], role="tool")
        for i in range(4):
            if batch[i].done:
                if i in frozen:
                    assert batch[i] is frozen[i] and batch[i].row == frozen[i].row
                frozen.setdefault(i, batch[i])
        assert batch.active_indices == [i for i in range(4) if i not in frozen]

    assert batch.active_indices == [0, 2]
    assert batch.finish_reasons == [None, "stop", None, "length"]
    assert [c.num_turns for c in batch.conversations] == [3, 1, 3, 2]
    assert [r.num_images for r in batch.rows()] == [3, 1, 5, 1]  # prompt images + one per observation
    for r in batch.rows():
        r.validate()
    with pytest.raises(ValueError, match="conversation 1 is done"):
        batch.append_observation(1, "more")


def test_response_cut_without_end_of_turn_is_closed_unlabelled():
    """A reply cut by max_tokens (or a stop string) gets <|im_end|>\\n appended with label -100;
    its own ids stay labelled; positions still equal a whole recompute."""
    proc = processor_for("qwen2_5_vl")
    tok = proc.tokenizer
    conv = start(_question(0, 1), proc)
    ids = tok("<search>cats", add_special_tokens=False)["input_ids"]
    L = conv.num_tokens
    conv = append_response(conv, Completion(token_ids=ids, finish_reason="length"))
    tail = conv.row.input_ids[L:].tolist()
    assert tail == ids + tok("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert conv.row.labels[L:].tolist() == ids + [IGNORE, IGNORE]
    assert conv.response_spans == ((L, L + len(ids)),)
    conv = append_observation(conv, [{"type": "image"}, {"type": "text", "text": "page"}], images=[image_pool()[5]])
    row = conv.row.validate()
    assert row.family == "qwen2_5_vl"
    assert_row_positions(row)


def test_order_errors_name_the_conversation():
    proc = processor_for("qwen2_vl")
    conv = start(_question(0, 0), proc, index=7)
    with pytest.raises(ValueError, match="conversation 7: .*append the response"):
        append_observation(conv, "too early")
    closed = append_response(conv, text="hi")
    with pytest.raises(ValueError, match="conversation 7: the last turn is closed"):
        append_response(closed, text="again")
    with pytest.raises(ValueError, match="conversation 7: .*assistant"):
        append_messages(closed, [{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="1 image"):
        append_observation(closed, [{"type": "image"}, {"type": "image"}], images=[image_pool()[0]])
    done = append_response(conv, text="bye", done=True)
    assert done.finish_reason == "stop"
    with pytest.raises(ValueError, match="conversation 7 is done"):
        append_observation(done, "late")


def test_generated_vision_token_is_refused():
    """A sampled <|image_pad|> would be an image slot with no image: refuse it by name."""
    proc = processor_for("qwen3_vl")
    tok = proc.tokenizer
    conv = start(_question(2, 1), proc, index=2)
    bad = tok("x", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|image_pad|>")]
    with pytest.raises(ValueError, match="conversation 2: the response holds 1 image pad"):
        append_response(conv, bad)


def test_qwen3_consecutive_tool_turns_must_come_in_one_call():
    """Qwen3-VL merges consecutive tool messages into one user turn: appending them one by
    one re-renders the first (not a prefix), which is refused; one call works and equals
    the whole encode. Qwen2-VL renders each tool turn on its own, so both ways work."""
    tools = [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
    for family, split_ok in (("qwen3_vl", False), ("qwen2_vl", True)):
        proc = processor_for(family)
        conv = append_response(start(_question(0, 0), proc), text="call")
        one_call = append_messages(conv, tools)
        whole = {"messages": _question(0, 0)["messages"] + [{"role": "assistant", "content": "call"}] + tools}
        assert one_call.row == mmpipe.encode_row(whole, proc)
        first = append_messages(conv, tools[:1], add_generation_prompt=False)
        if split_ok:
            assert append_messages(first, tools[1:]).row == one_call.row
        else:
            with pytest.raises(ValueError, match="re-renders earlier text"):
                append_messages(first, tools[1:])


def _tokenizer_with_double_newline_merge():
    """The test tokenizer plus the ``\\n\\n`` merge real Qwen vocabularies have (id 271 there)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = testing.build_tokenizer("qwen2_vl")
    spec = json.loads(base.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab["ĊĊ"] = max(max(vocab.values()), *(a["id"] for a in spec["added_tokens"])) + 1
    spec["model"]["merges"].append(["Ċ", "Ċ"])
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = base.chat_template
    return tok


def test_retokenization_drift_at_the_response_border():
    """With a vocabulary that merges "\\n\\n", a reply starting with "\\n" re-tokenizes
    differently in the whole conversation ("assistant\\n" + "\\n..." -> one token). A text
    append re-tokenizes the border as the whole encode does (it refused it before); generated ids
    are kept as generated (what the model sampled)."""
    tok = _tokenizer_with_double_newline_merge()
    conv = start({"messages": [{"role": "user", "content": "hi"}]}, tok)
    whole = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "\nabc"}]}, tok)
    assert append_response(conv, text="\nabc").row == whole
    ids = _gen_ids(tok, "\nabc")
    L = conv.num_tokens
    kept = append_response(conv, ids)
    assert kept.row.input_ids[L:L + len(ids)].tolist() == ids
    assert kept.row.labels[L:L + len(ids)].tolist() == ids
    assert whole.num_tokens == kept.num_tokens - 1  # the border tokens merged on re-encode


def test_text_only_family():
    tok = testing.build_tokenizer("qwen2_vl")
    conv = start({"messages": [{"role": "user", "content": "hello"}]}, tok)
    conv = append_observation(append_response(conv, text="search"), "found it", role="tool")
    conv = append_response(conv, text="done")
    whole = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "search"},
                          {"role": "tool", "content": "found it"}, {"role": "assistant", "content": "done"}]}
    assert conv.row == mmpipe.encode_row(whole, tok) and conv.row.family == "text"


def test_a_rows_tools_column_reaches_every_render_of_the_conversation():
    """A raw row's ``tools`` column (Qwen3-VL renders tools in the system block) is kept by
    `start` and used by every append: the incremental row equals the whole encode with the
    same tools, and differs from the encode without them (so the check can fail)."""
    proc = processor_for("qwen3_vl")
    specs = [{"type": "function", "function": {"name": "search", "description": "Search the web.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    raw = {**_question(0, 1), "tools": specs}
    conv = start(raw, proc)
    assert conv.tools == specs
    conv = append_response(conv, text='<tool_call>{"name": "search", "arguments": {"q": "cat"}}</tool_call>')
    conv = append_observation(conv, [{"type": "text", "text": "a cat"}], role="tool")
    whole = {"messages": raw["messages"] + [
        {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"q": "cat"}}</tool_call>'},
        {"role": "tool", "content": [{"type": "text", "text": "a cat"}]}], "images": raw["images"], "tools": specs}
    assert conv.row == mmpipe.encode_row(whole, proc, add_generation_prompt=True)
    without = {k: v for k, v in whole.items() if k != "tools"}
    assert conv.row.num_tokens > mmpipe.encode_row(without, proc, add_generation_prompt=True).num_tokens
