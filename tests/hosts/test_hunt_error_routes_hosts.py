"""Host adapters refuse rows that failed to encode (error-routes hunt): a plain
``ds.map(mmpipe.encode, on_error="skip")`` keeps each failed row as an empty placeholder (0 tokens,
its failure in ``mmpipe_error``). The Collator refuses them; verl_rows / verl_batch and
VisionGRPOTrainer's encoded prompts took them as 0-token prompts."""

from __future__ import annotations

import pytest

from mmpipe.errors import InputError
from mmpipe.hosts import verl

from helpers import mapped_with_a_failed_row


def test_verl_rows_refuse_a_row_that_failed_to_encode():
    enc, proc = mapped_with_a_failed_row()
    for form in ([enc[i] for i in range(3)], enc.data.table):
        for stage in (verl.verl_rows, verl.verl_batch):
            with pytest.raises(InputError, match="row 1: this row failed to encode.*drop_failed") as got:
                stage(form, proc)
            assert (got.value.row, got.value.column) == (1, "mmpipe_error")
    assert len(verl.verl_rows([enc[0], enc[2]], proc)) == 2


def test_trl_grpo_refuses_an_encoded_prompt_that_failed_to_encode(tmp_path):
    pytest.importorskip("trl")
    from test_hunt_trl_grpo import _rows, _trainer

    enc, _ = mapped_with_a_failed_row()
    trainer = _trainer(tmp_path, _rows())
    assert trainer._prompt_row(enc[0], 0).num_tokens > 0
    with pytest.raises(InputError, match="row 4: this row failed to encode") as got:
        trainer._prompt_row(enc[1], 4)
    assert (got.value.row, got.value.column, got.value.stage) == (4, "mmpipe_error", "rollout")
