"""The length filter counts the tokens the training encode makes, with the same template and
encode options: ``chat_template_kwargs`` (Qwen-VL ``add_vision_id``, GLM-4.6V ``enable_thinking``),
tools, generation prompts and ``end_of_turn="stop_token"``.

Before the fix the counter encoded without labels, and without labels ``end_of_turn="stop_token"``
appends nothing: GLM-4.1V/4.6V rows (whose template writes no end-of-turn token) were counted one
token short per reply, so ``filter_by_length(max_tokens=N)`` kept rows that the encode with
``max_length=N`` then refused.
"""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data import filters
from mmpipe.errors import TruncationError

from conftest import processor_for

TOOL = {"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
                                         "parameters": {"type": "object", "properties": {}}}}


def _rows() -> list[dict]:
    """A two-reply row with an image and a prompt row (no reply)."""
    img = testing.tiny_image(40, 56, seed=1)
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}
    return [
        {"messages": [user, {"role": "assistant", "content": [{"type": "text", "text": "A box."}]},
                      {"role": "user", "content": [{"type": "text", "text": "Colour?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Red."}]}], "images": [img]},
        {"messages": [user], "images": [img]},
    ]


CASES = {
    "glm4v stop_token": ("glm4v", {"end_of_turn": "stop_token"}),
    "glm46v stop_token": ("glm46v", {"end_of_turn": "stop_token"}),
    "glm46v no thinking, stop_token": ("glm46v", {"end_of_turn": "stop_token",
                                                  "chat_template_kwargs": {"enable_thinking": False}}),
    "qwen2_vl vision ids": ("qwen2_vl", {"chat_template_kwargs": {"add_vision_id": True}}),
    "qwen3_vl tools": ("qwen3_vl", {"tools": [TOOL]}),
    "qwen2_5_vl stop_token": ("qwen2_5_vl", {"end_of_turn": "stop_token"}),
    "llava_onevision stop_token": ("llava_onevision", {"end_of_turn": "stop_token"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_counts_equal_the_encode_with_the_same_options(case):
    family, options = CASES[case]
    proc, rows = processor_for(family), _rows()
    counted = filters.token_lengths(datasets.Dataset.from_list(rows), proc, **options).total.tolist()
    assert counted == [mmpipe.encode_row(r, proc, idx=i, **options).num_tokens for i, r in enumerate(rows)]


def test_filter_keeps_only_rows_the_encode_takes():
    """A GLM-4.1V row that the stop-token encode makes N tokens long is dropped by max_tokens=N-1."""
    proc, rows = processor_for("glm4v"), _rows()[:1]
    n = mmpipe.encode_row(rows[0], proc, end_of_turn="stop_token").num_tokens
    with pytest.raises(TruncationError):
        mmpipe.encode_row(rows[0], proc, end_of_turn="stop_token", max_length=n - 1)
    kept, report = filters.filter_by_length(datasets.Dataset.from_list(rows), proc, max_tokens=n - 1,
                                            end_of_turn="stop_token")
    assert len(kept) == 0 and report.too_long == 1
    # labels=False: the encode appends no stop token, and the count follows it
    assert filters.token_lengths(datasets.Dataset.from_list(rows), proc, end_of_turn="stop_token",
                                 labels=False).total.tolist() == [
        mmpipe.encode_row(rows[0], proc, end_of_turn="stop_token", labels=False).num_tokens]
