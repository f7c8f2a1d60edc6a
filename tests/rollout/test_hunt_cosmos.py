"""cosmos-rl data packers (`mmpipe.rollout.packers`) driven the way cosmos-rl 0.4.7's trainers drive
them, where the other packer tests do not go: bad completions, a collate asked for fewer tokens
than a sample holds (cosmos-rl's SFT asks for ``min(policy.model_max_length, sft_compute_max_len)``,
its GRPO under pipeline parallelism for ``model_max_length``), and multi-turn GRPO, whose trainer
passes ``rollout.completed_conversation`` (the dialogue WITH the last reply) and the last reply's
ids. The unmarked tests run anywhere (cosmos-rl's calls made as its trainer makes them); the test
marked ``needs_env("cosmos")`` compares with cosmos-rl's own text packer (scripts/envs/cosmos.sh)."""

from __future__ import annotations

import types

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError, InputError, TruncationError
from mmpipe.rollout.packers import DecoderOnlyLLMDataPacker, QwenVLDataPacker

from conftest import processor_for

CONV = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "It is red."},
        {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Blue."}]


def _config(*, multi_turn=False, model_max_length=4096):
    """The parts of cosmos-rl's Config the packers read."""
    return types.SimpleNamespace(
        rollout=types.SimpleNamespace(multi_turn_config=types.SimpleNamespace(enable=multi_turn)),
        policy=types.SimpleNamespace(model_name_or_path="unused", model_max_length=model_max_length))


def _vl_item(k=1):
    content = [{"type": "image", "image": testing.tiny_image(40 + 8 * j, 48, seed=j)} for j in range(k)]
    return [{"role": "user", "content": content + [{"type": "text", "text": "What is it?"}]}]


@pytest.mark.parametrize("bad, found", [
    ([3.0, 7.9], "dtype float64"),     # int64 would floor 7.9 to 7: a different token, silently
    ([12, -1, 13], "id -1"),          # a -1 fill: the embedding reads out of range deep in the step
    ([[12], [13]], "shape (2, 1)"),   # cosmos-rl's completion_token_ids layout, not flattened
    (None, "NoneType"),
])
def test_policy_input_refuses_bad_completion_ids_by_name(bad, found):
    packer = QwenVLDataPacker(processor_for("qwen2_vl"))
    with pytest.raises(InputError, match="get_policy_input") as e:
        packer.get_policy_input(_vl_item(), bad)
    assert found in str(e.value) and e.value.column == "token_ids" and e.value.fix
    with pytest.raises(ArgumentError, match="n_ignore_prefix_tokens"):
        packer.get_policy_input(_vl_item(), [12, 13], n_ignore_prefix_tokens=-1)
    assert packer.get_policy_input(_vl_item(), [12, 13]).num_tokens > 2  # good ids still go through


def test_a_sample_longer_than_cosmos_rl_s_max_len_names_model_max_length():
    """cosmos-rl's SFT step collates at ``min(policy.model_max_length, sft_compute_max_len(batch))``
    (its own packers then cut the rows, image tokens included): the error names that setting."""
    packer = QwenVLDataPacker(processor_for("qwen2_vl"))
    packer.setup(_config(model_max_length=32))
    rows = [packer.sft_process_sample(_vl_item(k) + [{"role": "assistant", "content": "A square."}]) for k in (0, 2)]
    max_len = min(packer.config.policy.model_max_length, packer.sft_compute_max_len(rows))  # sft_trainer.py
    with pytest.raises(TruncationError, match="policy.model_max_length=32") as e:
        packer.sft_collate_fn(rows, max_len, ignore_label_id=-100)
    assert e.value.row == 0 and f"at least {rows[0].num_tokens}" in e.value.fix
    with pytest.raises(TruncationError, match="computed_max_len=10"):
        packer.policy_collate_fn([packer.get_policy_input(_vl_item(), [12, 13])], 10)
    out = packer.sft_collate_fn(rows, packer.sft_compute_max_len(rows), ignore_label_id=-100)
    assert out["input_ids"].shape == (2, max(r.num_tokens for r in rows))


@pytest.mark.parametrize("kind", ["text", "vl"])
def test_multi_turn_completed_conversation_holds_the_last_reply_once(kind):
    """Multi-turn GRPO: the completed conversation + the last reply's sampled ids -> the dialogue
    with the last reply ONCE (as sampled), every assistant turn scored; single-turn unchanged."""
    proc = testing.build_tokenizer("qwen2_vl") if kind == "text" else processor_for("qwen2_vl")
    packer = (DecoderOnlyLLMDataPacker if kind == "text" else QwenVLDataPacker)(proc)
    packer.setup(_config(multi_turn=True))
    tok = packer.tokenizer
    conv = CONV if kind == "text" else [{"role": "user", "content": _vl_item()[0]["content"]}] + CONV[1:]
    last = tok("Blue.<|im_end|>", add_special_tokens=False)["input_ids"]
    s = packer.get_policy_input(conv, last)
    want = mmpipe.encode_row({"messages": conv}, proc, labels=True)  # images inline, as cosmos-rl's items hold them
    text = tok.decode(s.input_ids)
    assert text.count("Blue.") == 1 and s.input_ids[-len(last):].tolist() == last
    # the rollout's dialogue: the whole conversation as the template renders it (but its last newline)
    assert s.input_ids.tolist() == want.input_ids[: s.num_tokens].tolist()
    scored = [t for t, m in zip(s.input_ids[1:].tolist(), s.logprob_masks[:-1]) if m]
    assert tok.decode(scored) == "It is red.<|im_end|>Blue.<|im_end|>"
    packer.setup(_config(multi_turn=False))  # single turn: the sample is the prompt, the ids its reply
    single = packer.get_policy_input(conv[:1], last)
    assert tok.decode([t for t, m in zip(single.input_ids[1:].tolist(), single.logprob_masks[:-1]) if m]) \
        == "Blue.<|im_end|>"


@pytest.mark.needs_env("cosmos")
def test_multi_turn_scores_the_assistant_turns_cosmos_rl_s_own_packer_scores(tmp_path):
    """cosmos-rl's own DecoderOnlyLLMDataPacker in multi-turn mode (completion ignored: it is in the
    conversation) scores every assistant turn of the same ids; ours the same turns, at logit
    positions, the last one as sampled."""
    from cosmos_rl.dispatcher.data.packer import DecoderOnlyLLMDataPacker as CosmosTextPacker
    from cosmos_rl.policy.config import Config

    testing.build_tokenizer("qwen2_vl").save_pretrained(tmp_path)
    config = Config.from_dict({"train": {"train_policy": {"type": "grpo"}, "output_dir": str(tmp_path / "out")},
                               "policy": {"model_name_or_path": str(tmp_path)},
                               "rollout": {"multi_turn_config": {"enable": True}}})
    theirs = CosmosTextPacker()
    theirs.setup(config)
    ours = DecoderOnlyLLMDataPacker(theirs.tokenizer)
    ours.setup(config)
    tok = theirs.tokenizer
    from cosmos_rl.dispatcher.data.schema import ChatMessage

    conv = [ChatMessage(**m) for m in CONV]  # what extend_conversation builds
    last = tok("Blue.<|im_end|>", add_special_tokens=False)["input_ids"]
    want = theirs.get_policy_input(conv, last)
    got = ours.get_policy_input(conv, last)
    n = got.num_tokens
    assert got.input_ids.tolist() == want.input_ids[:n] and tok.decode(want.input_ids[n:]) == "\n"
    theirs_scored = tok.decode([t for t, m in zip(want.input_ids, want.logprob_masks) if m])
    ours_scored = tok.decode([t for t, m in zip(got.input_ids[1:].tolist(), got.logprob_masks[:-1]) if m])
    assert theirs_scored == "It is red.Blue." and ours_scored == "It is red.<|im_end|>Blue.<|im_end|>"


@pytest.mark.parametrize("kind", ["text", "vl"])
def test_a_conversation_grown_in_place_gets_a_new_rollout_prompt(kind):
    """cosmos-rl's multi-turn rollout calls get_rollout_input each turn on ONE list that
    extend_conversation grows in place (``messages += [...]``): the identity cache gave every
    turn the first turn's prompt (the tool result never reached the model)."""
    proc = testing.build_tokenizer("qwen2_vl") if kind == "text" else processor_for("qwen2_vl")
    packer = (DecoderOnlyLLMDataPacker if kind == "text" else QwenVLDataPacker)(proc)
    conv = [{"role": "user", "content": "Look up the weather."}] if kind == "text" else _vl_item()
    first = packer.get_rollout_input(conv)["prompt_token_ids"]
    assert packer.get_rollout_input(conv)["prompt_token_ids"] == first  # unchanged item: the cached encoding
    conv += [{"role": "assistant", "content": "<tool_call>weather()</tool_call>"},
             {"role": "tool", "content": "Sunny, 21 C."}]
    second = packer.get_rollout_input(conv)["prompt_token_ids"]
    want = mmpipe.encode_row({"messages": conv}, proc, labels=False).input_ids.tolist()
    assert "Sunny" in packer.tokenizer.decode(second) and len(second) > len(first)
    if kind == "text":
        assert second == want


@pytest.mark.needs_env("cosmos")
def test_cosmos_rl_s_in_place_extend_reaches_the_next_rollout_prompt():
    """The same with cosmos-rl's own BaseDataPacker.extend_conversation and add_tool_response_messages."""
    from cosmos_rl.dispatcher.data.packer.multi_turn import add_tool_response_messages
    from cosmos_rl.dispatcher.data.schema import ChatMessage

    tok = testing.build_tokenizer("qwen2_vl")
    packer = DecoderOnlyLLMDataPacker(tok)
    conv = [ChatMessage(role="user", content="Look up the weather.")]
    first = packer.get_rollout_input(conv)["prompt_token_ids"]
    same = packer.extend_conversation(conv, ["<tool_call>weather()</tool_call>"])
    assert same is conv  # cosmos-rl extends in place
    add_tool_response_messages(conv, "Sunny, 21 C.")
    second = packer.get_rollout_input(conv)["prompt_token_ids"]
    assert "Sunny" in tok.decode(second) and second[: len(first) - 3] == first[:-3]
