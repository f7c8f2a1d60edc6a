"""`RolloutRefusal` raised in a torch DataLoader worker keeps its ``row``, ``stage`` and ``family``
(error-routes hunt). torch re-raises a worker's error as ``type(e)(text)`` (``ExceptionWrapper``):
a prompt-building ``collate_fn`` under ``num_workers`` gave the caller a refusal whose ``row`` was
None, where ``num_workers=0`` named the row."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.data import DataLoader

from mmpipe.families import get_family
from mmpipe.rollout.processor_prompts import check_served
from mmpipe.rollout.support import RolloutRefusal, check_rollout

from helpers import mapped_with_a_failed_row

WORKER_TIMEOUT_S = 120  # a hung worker fails the test instead of stalling the suite

REFUSALS = {
    "tiled_rows_in_verl": functools.partial(check_rollout, get_family("gemma3"), "verl", row=3),
    "tiled_multiturn": functools.partial(check_rollout, get_family("internvl"), "multiturn", row=0),
    "generic_vllm_prompts": functools.partial(check_served, object(), row=5),
    "no_row": functools.partial(check_rollout, get_family("gemma3"), "verl"),
}


class _Refusing(torch.utils.data.Dataset):
    """Item i runs the i-th check (a stage's own check) in the worker."""

    def __init__(self, checks):
        self.checks = checks

    def __len__(self):
        return len(self.checks)

    def __getitem__(self, i):
        self.checks[i]()


def test_a_refusal_from_a_dataloader_worker_keeps_its_row_stage_and_family():
    names = sorted(REFUSALS)
    loader = DataLoader(_Refusing([REFUSALS[n] for n in names]), batch_size=None, num_workers=1,
                        timeout=WORKER_TIMEOUT_S)
    it = iter(loader)
    for name in names:
        with pytest.raises(RolloutRefusal) as direct:
            REFUSALS[name]()
        with pytest.raises(RolloutRefusal) as got:
            next(it)
        d, e = direct.value, got.value
        assert (name, e.row, e.stage, e.family) == (name, d.row, d.stage, d.family)
        assert str(d) in str(e)
        assert d.stage is not None and d.family is not None  # the case tests something
    with pytest.raises(StopIteration):  # and the worker shuts down
        next(it)


def test_rows_that_failed_to_encode_are_no_prompts():
    """A row left empty by on_error="skip" went to vLLM as a 0-token prompt (to_vllm_prompts, every
    engine through as_rows): the Collator refuses such rows, the rollout side took them silently.
    Each form of rows (a list, a dataset slice of columns, Arrow as ArrowRows gives) names row 1."""
    from mmpipe.errors import InputError
    from mmpipe.rollout import as_rows, to_vllm_prompts

    enc, proc = mapped_with_a_failed_row()
    for form in ([enc[i] for i in range(3)], enc[0:3], enc.data.table):
        with pytest.raises(InputError, match="row 1: this row failed to encode") as got:
            to_vllm_prompts(form, proc)
        assert (got.value.row, got.value.column, got.value.stage) == (1, "mmpipe_error", "rollout")
        with pytest.raises(InputError, match="drop_failed"):
            as_rows(form)
    good = enc.select([0, 2])
    assert [len(p["prompt_token_ids"]) > 0 for p in to_vllm_prompts(list(good), proc)] == [True, True]
