"""The text packer (`DecoderOnlyLLMDataPacker`) reads a string item as cosmos-rl's own
``DecoderOnlyLLMDataPacker`` (0.4.7) does: raw text, no chat template, tokenized without special
tokens; so a pre-templated dataset gives the same rows as the chat lists it was rendered from
(issue 28: it was wrapped in a user message and templated twice). The cosmos-rl rules written
out here are checked against the real package in tests/rollout/test_packers_cosmos_text.py."""

from __future__ import annotations

import numpy as np
import pytest

from mmpipe import testing
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.rollout.packers import DecoderOnlyLLMDataPacker
from mmpipe.testing.invariants import assert_rows_equal

CHATS = [
    [{"role": "user", "content": "Name a prime number."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two turns:"},
     {"role": "assistant", "content": "Yes?"}, {"role": "user", "content": "Why is the sky blue?"}],
]


@pytest.fixture(scope="module")
def tok():
    return testing.build_tokenizer("qwen2_vl")


@pytest.fixture(scope="module")
def packer(tok):
    return DecoderOnlyLLMDataPacker(tok)


def _ids(tok, text: str) -> list:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("chat", CHATS)
def test_a_pre_templated_string_is_not_templated_again(packer, tok, chat):
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.count("<|im_start|>user") == sum(m["role"] == "user" for m in chat)
    assert_rows_equal([packer.encode_prompt(text)], [packer.encode_prompt(chat)], what="string vs chat prompt")
    assert packer.get_rollout_input(text) == packer.get_rollout_input(chat)
    assert tok.decode(packer.get_rollout_input(text)["prompt_token_ids"]) == text


@pytest.mark.parametrize("text", ["Once upon a time", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", " a"])
def test_the_rollout_input_of_a_string_is_its_own_tokens(packer, tok, text):
    # cosmos-rl: get_rollout_input(str) returns the string itself (raw text, no template)
    assert packer.get_rollout_input(text) == {"prompt_token_ids": _ids(tok, text)}


def test_the_policy_input_of_a_string_follows_cosmos_rl(packer, tok):
    text, completion, n_ignore = "Question: 2 + 2 =", _ids(tok, " 4, of course.") + [tok.eos_token_id], 2
    row = packer.get_policy_input(text, completion, n_ignore_prefix_tokens=n_ignore)
    prompt = _ids(tok, text)
    assert row.input_ids.tolist() == prompt + completion
    batch = packer.policy_collate_fn([row], packer.policy_compute_max_len([row]))
    # cosmos-rl's RLPolicyInput.logprob_masks, as its DecoderOnlyLLMDataPacker writes them
    cosmos_mask = [0] * (len(prompt) - 1 + n_ignore) + [1] * (len(completion) - n_ignore) + [0]
    assert batch["input_ids"][0].tolist() == prompt + completion
    assert batch["logprob_masks"][0].int().tolist() == cosmos_mask


def test_sft_on_a_string_labels_every_token(packer, tok):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    row = packer.sft_process_sample(text)
    # cosmos-rl: token_ids = tokenizer(sample, add_special_tokens=False); label_ids = token_ids
    assert row.input_ids.tolist() == _ids(tok, text) and row.labels.tolist() == _ids(tok, text)
    batch = packer.sft_collate_fn([row], packer.sft_compute_max_len([row]))
    assert batch["label_ids"][0].tolist() == batch["input_ids"][0].tolist()
    assert np.array_equal(row.position_ids, np.tile(np.arange(row.num_tokens), (3, 1)))


def test_chat_items_keep_their_template_and_assistant_labels(packer, tok):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    row = packer.sft_process_sample(chat)
    assert row.input_ids.tolist() == tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
    labelled = row.input_ids[row.labels != IGNORE_INDEX]
    assert tok.decode(labelled).startswith("hello") and (row.labels == IGNORE_INDEX).sum() > 0
