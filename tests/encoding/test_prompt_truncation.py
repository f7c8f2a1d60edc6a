"""``truncation="truncate_text"`` on a PROMPT row (rendered with a generation prompt, as RL prompt
sets are): the cut keeps the row's end - the last turn's end of turn and the generation prompt the
model answers after - and cuts the text before it. Cutting the row's end (the old rule) left a
prompt without ``<|im_end|>\\n<|im_start|>assistant\\n``: a rollout continued the user's text."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import TruncationError
from mmpipe.testing.invariants import assert_row_positions

from conftest import model_for, processor_for

IMG = testing.tiny_image(56, 56, seed=1)


def _prompt(text: str = "word " * 60, history: bool = False) -> dict:
    turns = [{"role": "user", "content": [{"type": "text", "text": "first question"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "first answer " * 3}]}] if history else []
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
    return {"messages": turns + [user], "images": [IMG]}


def _tail(proc, row: dict) -> np.ndarray:
    """The ids the generation prompt adds: the processor's template rendered with and without it,
    tokenized by its tokenizer."""
    plain = [proc.tokenizer(proc.apply_chat_template(row["messages"], add_generation_prompt=agp, tokenize=False),
                            add_special_tokens=False)["input_ids"] for agp in (False, True)]
    assert plain[1][:len(plain[0])] == plain[0]
    return np.asarray(plain[1][len(plain[0]):])


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"])
@pytest.mark.parametrize("history", [False, True])
def test_a_cut_prompt_row_keeps_its_generation_prompt(family, history):
    proc, model = processor_for(family), model_for(family)
    row = _prompt(history=history)
    full = mmpipe.encode_row(row, proc)
    agp = _tail(proc, row)
    assert np.array_equal(full.input_ids[-len(agp):], agp)
    cap = full.num_tokens - 10
    cut = mmpipe.encode_row(row, proc, max_length=cap, truncation="truncate_text")
    assert cut.num_tokens == cap and cut.num_images == 1
    assert np.array_equal(cut.input_ids[-len(agp):], agp), "the generation prompt was cut"
    # the text before the row's end is what is cut: a head of the full row, then its end
    kept = int(np.flatnonzero(cut.input_ids != full.input_ids[:cap])[0])
    assert np.array_equal(cut.input_ids[:kept], full.input_ids[:kept])
    assert np.array_equal(cut.input_ids[kept:], full.input_ids[full.num_tokens - (cap - kept):])
    assert cap - kept >= len(agp)
    if family.startswith("qwen"):  # the user's turn stays closed: <|im_end|>\n, then the generation prompt
        end = proc.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert cut.input_ids[-len(agp) - 2] == end
    cut.validate()
    assert_row_positions(cut, model=model)
    if history:  # the earlier reply keeps its labels
        assert (cut.labels != -100).sum() == (full.labels != -100).sum() > 0
    lay = mmpipe.encode_row(row, proc, max_length=cap, truncation="truncate_text", pixels="none")
    assert np.array_equal(lay.input_ids, cut.input_ids) and np.array_equal(lay.position_ids, cut.position_ids)


def test_every_route_cuts_prompt_rows_alike():
    proc = processor_for("qwen2_vl")
    rows = [_prompt(), _prompt("short"), _prompt(history=True)]
    hist = mmpipe.encode_row(rows[2], proc)
    cap = int(np.flatnonzero(hist.mm_token_type_ids)[-1]) + 16  # past its image, short of its end
    assert mmpipe.encode_row(rows[1], proc).num_tokens <= cap < hist.num_tokens
    one = [mmpipe.encode_row(r, proc, max_length=cap, truncation="truncate_text").input_ids.tolist() for r in rows]
    out, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows), proc, max_length=cap,
                                   truncation="truncate_text", pixels="none")
    assert [list(x) for x in out["input_ids"]] == one and len(one[0]) == len(one[2]) == cap


def test_a_prompt_whose_end_alone_fills_max_length_is_refused():
    proc = processor_for("qwen2_vl")
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "word " * 40}]}], "images": []}
    with pytest.raises(TruncationError, match="generation prompt"):
        mmpipe.encode_row(row, proc, max_length=4, truncation="truncate_text")
    assert mmpipe.encode_row(row, proc, max_length=12, truncation="truncate_text").num_tokens == 12
