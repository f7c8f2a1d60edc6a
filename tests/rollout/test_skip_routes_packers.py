"""cosmos-rl data packers and rows that are skipped elsewhere (skip / bad-input hunt): a row that failed
to encode under on_error="skip" is refused by name as a packer item (a stored dict or the record read
from it), not made an empty prompt; the encode options that leave an item out (truncation="drop",
on_error="skip") are refused at construction, since a packer must answer every item."""

from __future__ import annotations

import pytest

from mmpipe import testing
from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.packers import QwenVLDataPacker

from conftest import processor_for
from helpers import mapped_with_a_failed_row


def test_a_failed_stored_row_is_refused_as_a_packer_item():
    """Old code: a ParseError 'rename your column', naming neither the failure nor its row."""
    enc, proc = mapped_with_a_failed_row()
    packer = QwenVLDataPacker(proc)
    for call in (packer.get_rollout_input, lambda it: packer.get_policy_input(it, [5, 6, 7]),
                 packer.sft_process_sample):
        with pytest.raises(InputError, match="failed to encode") as e:
            call(enc[1])
        assert (e.value.row, e.value.column, e.value.stage) == (1, "mmpipe_error", "rollout")
        assert "drop_failed" in str(e.value)


def test_the_record_of_a_failed_row_is_no_prompt():
    """Old code: the record read from a failed row went to vLLM as {'prompt_token_ids': []} and to the
    policy as a row of the response tokens alone (3 tokens, no prompt), silently."""
    enc, proc = mapped_with_a_failed_row()
    packer = QwenVLDataPacker(proc)
    record = MultiModalInputs.from_dict(enc[1])  # a record keeps no failure: 0 tokens
    for call in (packer.get_rollout_input, lambda it: packer.get_policy_input(it, [5, 6, 7])):
        with pytest.raises(InputError, match="holds no token") as e:
            call(record)
        assert (e.value.column, e.value.stage) == ("input_ids", "rollout") and "drop_failed" in str(e.value)


def test_a_good_stored_row_is_the_prompt_of_its_record():
    """Guard for the new form: an encoded row as stored is the prompt its record gives."""
    enc, proc = mapped_with_a_failed_row()
    packer = QwenVLDataPacker(proc)
    want = packer.get_rollout_input(MultiModalInputs.from_dict(enc[0]))
    got = packer.get_rollout_input(enc[0])
    assert got["prompt_token_ids"] == want["prompt_token_ids"] and len(got["prompt_token_ids"]) > 0
    assert got["multi_modal_data"] == want["multi_modal_data"]
    row = packer.get_policy_input(enc[0], [5, 6, 7])
    assert row.num_tokens == MultiModalInputs.from_dict(enc[0]).num_tokens + 3
    with pytest.raises(ArgumentError, match="labels=True"):  # a prompt row is no SFT row
        packer.sft_process_sample(enc[0])


@pytest.mark.parametrize("option", [{"truncation": "drop", "max_length": 20}, {"on_error": "skip"}])
def test_options_that_leave_an_item_out_are_refused_at_construction(option):
    """Old code: truncation='drop' built, and a long item's get_rollout_input / get_policy_input raised the
    encoder's internal RowDropped signal (no typed error, nothing counted); on_error='skip' built and was
    not applied (each failure raised)."""
    with pytest.raises(ArgumentError, match=f"{next(iter(option))}=.*cannot leave one out"):
        QwenVLDataPacker(processor_for("qwen2_vl"), **option)
    packer = QwenVLDataPacker(**option)  # cosmos-rl's way: no processor until setup(config)
    with pytest.raises(ArgumentError, match="encode_dataset"):
        packer.bind(processor_for("qwen2_vl"))


def test_truncate_text_still_builds():
    """Guard: the option that keeps every item is taken."""
    img = testing.tiny_image(56, 56, seed=1)
    item = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "word " * 40}]}]
    packer = QwenVLDataPacker(processor_for("qwen2_vl"), max_length=60, truncation="truncate_text")
    assert 0 < len(packer.get_rollout_input(item)["prompt_token_ids"]) <= 60
