"""ShareGPT / LLaVA rows (``conversations``: ``{"from": "human" | "gpt" | "system", "value": text with
<image> markers}``, the layout of LLaVA-Instruct, ShareGPT4V and LLaMA-Factory's sharegpt datasets)
encode as the same conversation in ``messages`` form, on every kind of family, through
``datasets.map`` (batched or not) and a plain dict batch; the old code refused them ("found columns
['conversations', 'images']"). Tool turns and other speakers, non-text values and a row holding both
``messages`` and ``conversations`` are typed `ParseError` s naming the row, the column and the fix."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.errors import ParseError
from mmpipe.testing import invariants

IMAGES = [Image.new("RGB", (60, 40), (10, 200, 30)), Image.new("RGB", (36, 52), (200, 10, 30))]
TURNS = [("system", "Be brief."), ("human", "<image>\nWho are they?"), ("gpt", "Two players."),
         ("human", "And here?<image>"), ("gpt", "A goal.")]
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def _sharegpt(turns=TURNS) -> dict:
    return {"conversations": [{"from": f, "value": v} for f, v in turns], "images": IMAGES}


def _messages(turns=TURNS) -> dict:
    return {"messages": [{"role": ROLES[f], "content": v} for f, v in turns], "images": IMAGES}


@pytest.mark.parametrize("family", ["qwen2_vl", "glm4v", "gemma3", "llava_onevision"])
def test_sharegpt_rows_encode_as_their_messages(family):
    from mmpipe import testing

    proc = testing.build_processor(family)
    a, b = mmpipe.encode_row(_sharegpt(), proc, idx=0), mmpipe.encode_row(_messages(), proc, idx=0)
    invariants.assert_rows_equal([a], [b])
    assert (a.labels != -100).sum() > 0 and a.num_images == 2


def test_through_datasets_map_and_a_plain_batch():
    import datasets

    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    want = [mmpipe.encode_row(_messages(), proc, idx=i) for i in range(3)]
    ds = datasets.Dataset.from_list([_sharegpt()] * 3)
    for batched in (False, True):
        out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names, batched=batched)
        invariants.assert_rows_from_arrow(out.data.table, want)
    plain = {"conversations": [_sharegpt()["conversations"]] * 3, "images": [IMAGES] * 3}
    got = mmpipe.encode(plain, processor=proc)
    np.testing.assert_array_equal(np.asarray(got["input_ids"][2]), want[2].input_ids)


@pytest.mark.parametrize("row, words", [
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "{}"}]},
     "from='function_call'"),
    ({"conversations": [{"from": "human", "value": ["<image>", "hi"]}]}, "value of type list"),
    ({"conversations": [{"from": "human", "value": "hi"}], "messages": [{"role": "user", "content": "hi"}]},
     "both a 'messages' and a 'conversations' column"),
])
def test_turns_that_are_not_sharegpt_text_are_typed(row, words):
    from mmpipe import testing

    with pytest.raises(ParseError, match=words) as e:
        mmpipe.encode_row(row, testing.build_processor("qwen2_vl"), idx=7)
    assert e.value.row == 7 and e.value.column == "conversations" and e.value.fix
