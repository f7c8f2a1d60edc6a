"""LLaMA-Factory / ms-swift SFT layouts: a ``system`` column beside ``conversations`` (sharegpt) or
``messages`` (openai style, string contents with ``<image>`` markers) is the conversation's system
prompt (the old code dropped it silently: the template's default system prompt was rendered), and
alpaca rows (``instruction`` / ``input`` / ``output`` / ``history`` / ``system``) encode as the
same conversation in ``messages`` form (the old code refused them). Each equals the explicit
``messages`` row, through ``datasets.map`` too; bad values are typed `ParseError` s."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.errors import ParseError
from mmpipe.testing import invariants

IMG = Image.new("RGB", (60, 40), (10, 200, 30))
SYSTEM = "You are a cat expert."


def _explicit(*turns, images=(IMG,)) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in turns], "images": list(images)}


EXPLICIT = _explicit(("system", SYSTEM), ("user", "<image>Who are they?"), ("assistant", "Cats."))
LAYOUTS = {
    "sharegpt": {"conversations": [{"from": "human", "value": "<image>Who are they?"}, {"from": "gpt", "value": "Cats."}],
                 "system": SYSTEM, "images": [IMG]},
    "openai": {"messages": [{"role": "user", "content": "<image>Who are they?"}, {"role": "assistant", "content": "Cats."}],
               "system": SYSTEM, "images": [IMG]},
    "alpaca": {"instruction": "<image>Who are they?", "input": "", "output": "Cats.", "system": SYSTEM, "images": [IMG]},
}


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_layout_encodes_as_its_explicit_messages(family, layout):
    from mmpipe import testing

    proc = testing.build_processor(family)
    got, want = mmpipe.encode_row(LAYOUTS[layout], proc, idx=0), mmpipe.encode_row(EXPLICIT, proc, idx=0)
    invariants.assert_rows_equal([got], [want])
    assert SYSTEM in proc.tokenizer.decode(got.input_ids) and (got.labels != -100).sum() > 0


def test_alpaca_input_history_and_prompt_rows():
    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    row = {"instruction": "Describe <image>", "input": "in one word", "output": "Cat.",
           "history": [["Hi", "Hello!"], ["Ready?", "Yes."]], "images": [IMG]}
    want = _explicit(("user", "Hi"), ("assistant", "Hello!"), ("user", "Ready?"), ("assistant", "Yes."),
                     ("user", "Describe <image>\nin one word"), ("assistant", "Cat."))
    invariants.assert_rows_equal([mmpipe.encode_row(row, proc, idx=0)], [mmpipe.encode_row(want, proc, idx=0)])
    prompt = {"instruction": "Describe <image>", "images": [IMG]}  # no output: an RL / generation prompt
    assert np.array_equal(mmpipe.encode_row(prompt, proc).input_ids,
                          mmpipe.encode_row(_explicit(("user", "Describe <image>")), proc).input_ids)


def test_through_datasets_map_with_rows_without_a_system_prompt():
    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    rows = [dict(LAYOUTS["sharegpt"]), {**LAYOUTS["sharegpt"], "system": None}, {**LAYOUTS["sharegpt"], "system": ""}]
    ds = datasets.Dataset.from_list(rows)
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, batched=True, remove_columns=ds.column_names)
    plain = {k: v for k, v in LAYOUTS["sharegpt"].items() if k != "system"}
    assert out[0]["input_ids"] == mmpipe.encode_row(EXPLICIT, proc).input_ids.tolist()
    assert out[1]["input_ids"] == out[2]["input_ids"] == mmpipe.encode_row(plain, proc).input_ids.tolist()


@pytest.mark.parametrize("row, column, words", [
    ({**EXPLICIT, "system": "Another prompt."}, "system", "another text"),
    ({**LAYOUTS["openai"], "system": 5}, "system", "holds int"),
    ({"instruction": "Q", "output": ["good", "bad"], "images": []}, "output", "ranking"),
    ({"instruction": "Q", "output": "A", "history": [["only a query"]], "images": []}, "history", "history entry 0"),
    ({"instruction": 3, "output": "A"}, "instruction", "holds int"),
])
def test_bad_values_are_typed(row, column, words):
    from mmpipe import testing

    with pytest.raises(ParseError, match=words) as e:
        mmpipe.encode_row(row, testing.build_processor("qwen2_vl"), idx=4)
    assert e.value.column == column and "row 4" in str(e.value)


def test_a_system_column_repeating_the_system_turn_is_one_prompt():
    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    got = mmpipe.encode_row({**EXPLICIT, "system": SYSTEM}, proc)
    assert np.array_equal(got.input_ids, mmpipe.encode_row(EXPLICIT, proc).input_ids)
