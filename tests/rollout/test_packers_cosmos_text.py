"""The text packer against cosmos-rl 0.4.7's own ``DecoderOnlyLLMDataPacker`` (scripts/envs/cosmos.sh),
both set up by cosmos-rl's ``setup(config)`` from one tokenizer directory: for string items (raw
text, no template) and chat lists, the same prompt ids as the rollout sees them, the same policy
ids and ``logprob_masks``, the same SFT ids and labels (issue 28: ours templated strings)."""

from __future__ import annotations

import pytest

from mmpipe import testing
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.rollout.packers import DecoderOnlyLLMDataPacker

pytestmark = pytest.mark.needs_env("cosmos")

ITEMS = [
    "Once upon a time",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n",
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two turns:"},
     {"role": "assistant", "content": "Yes?"}, {"role": "user", "content": "Go on."}],
]
SFT_ITEMS = [ITEMS[0], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"]


@pytest.fixture(scope="module")
def packers(tmp_path_factory):
    """(cosmos-rl's packer, ours), each set up from the same config as cosmos-rl does."""
    from cosmos_rl.dispatcher.data.packer import DecoderOnlyLLMDataPacker as CosmosTextPacker
    from cosmos_rl.policy.config import Config

    d = tmp_path_factory.mktemp("tok")
    testing.build_tokenizer("qwen2_vl").save_pretrained(d)
    config = Config.from_dict({"train": {"train_policy": {"type": "grpo"}, "output_dir": str(d / "out")},
                               "policy": {"model_name_or_path": str(d)}})
    theirs = CosmosTextPacker()
    theirs.setup(config)
    ours = DecoderOnlyLLMDataPacker(theirs.tokenizer)
    ours.setup(config)
    return theirs, ours


@pytest.mark.parametrize("i", range(len(ITEMS)))
def test_rollout_prompts_are_cosmos_rl_s(packers, i):
    theirs, ours = packers
    item = ITEMS[i]
    prompt = theirs.get_rollout_input(item)  # a string: the item itself, or the chat rendered
    if isinstance(item, str):
        assert prompt == item
    assert ours.get_rollout_input(item)["prompt_token_ids"] == theirs.tokenizer(prompt, add_special_tokens=False).input_ids


@pytest.mark.parametrize("i", range(len(ITEMS)))
@pytest.mark.parametrize("n_ignore", [0, 2])
def test_policy_inputs_are_cosmos_rl_s(packers, i, n_ignore):
    theirs, ours = packers
    tok = theirs.tokenizer
    completion = tok(" A short answer.", add_special_tokens=False).input_ids + [tok.eos_token_id]
    want = theirs.get_policy_input(ITEMS[i], completion, n_ignore_prefix_tokens=n_ignore)
    row = ours.get_policy_input(ITEMS[i], completion, n_ignore_prefix_tokens=n_ignore)
    batch = ours.policy_collate_fn([row], ours.policy_compute_max_len([row]))
    assert batch["input_ids"][0].tolist() == want.input_ids
    assert batch["logprob_masks"][0].int().tolist() == want.logprob_masks


@pytest.mark.parametrize("text", SFT_ITEMS)
def test_sft_of_a_string_is_cosmos_rl_s(packers, text):
    theirs, ours = packers
    want = theirs.sft_process_sample(text)
    row = ours.sft_process_sample(text)
    assert row.input_ids.tolist() == want["token_ids"]
    assert [int(x) if x != IGNORE_INDEX else -100 for x in row.labels] == want["label_ids"]
