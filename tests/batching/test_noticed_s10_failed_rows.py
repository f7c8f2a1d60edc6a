"""Rows that failed to encode under ``on_error="skip"`` (empty rows of 0 tokens, their failure in
``mmpipe_error``) reach no sampler: `token_counts` / `TokenBudgetBatchSampler.from_dataset` refuse
them up front, naming them and the fix (``mmpipe.drop_failed``).

Before the fix the sampler planned them like any row (0 tokens fit every budget) and training ran
until the collator refused their batch, possibly hours in: ``from_dataset`` returned a sampler
whose lengths held the failed rows' 0s, and ``token_counts`` of such rows counted 0.
"""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe.batching.sampler import TokenBudgetBatchSampler
from mmpipe.batching.token_counts import token_counts
from mmpipe.errors import InputError

from conftest import processor_for


def _row(n_images: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "A."}]}],
            "images": [mmpipe.testing.tiny_image(40, 56, seed=k) for k in range(n_images)]}


@pytest.fixture(scope="module")
def encoded():
    """Rows 1 and 3 have a placeholder without its image: they fail, and stay as empty rows."""
    ds = datasets.Dataset.from_list([_row(1), _row(0), _row(1), _row(0)])
    return ds.map(mmpipe.encode, fn_kwargs={"processor": processor_for("qwen2_vl"), "on_error": "skip"},
                  with_indices=True, remove_columns=ds.column_names)


@pytest.mark.parametrize("cost", ["padded", "packed"])
def test_sampler_from_dataset_refuses_failed_rows_by_name(encoded, cost):
    with pytest.raises(InputError, match="drop_failed") as e:
        TokenBudgetBatchSampler.from_dataset(encoded, max_tokens=4096, cost=cost)
    err = e.value
    assert err.row == 1 and err.column == "mmpipe_error"
    assert "2 row(s)" in str(err) and "[1, 3]" in str(err) and "image placeholders" in str(err)


def test_token_counts_refuses_failed_rows_as_dataset_and_as_rows(encoded):
    with pytest.raises(InputError, match="failed to encode") as e:
        token_counts(encoded.select([2, 3]))  # select indices honoured: the failed row is row 1 of these
    assert e.value.row == 1
    with pytest.raises(InputError, match="failed to encode") as e:
        token_counts([encoded[i] for i in range(4)])
    assert e.value.row == 1


def test_after_drop_failed_the_sampler_plans_the_good_rows(encoded):
    kept, errors = mmpipe.drop_failed(encoded)
    assert [x["row"] for x in errors] == [1, 3]
    sampler = TokenBudgetBatchSampler.from_dataset(kept, max_tokens=4096, shuffle=False)
    assert sorted(i for b in sampler for i in b) == [0, 1] and (sampler.lengths > 0).all()
    assert list(token_counts(encoded.select([0, 2]))[0]) == list(sampler.lengths)  # good rows only: no refusal
