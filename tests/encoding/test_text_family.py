"""Text-only decoder models: no images, plain 1-D positions, same pipeline."""

from __future__ import annotations

import torch

from helpers import tiny_text_model
import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip


def test_text_decoder_batch_equals_rows_alone():
    tok = testing.build_tokenizer("qwen2_vl")
    model = tiny_text_model(len(tok))
    raws = [{"messages": [{"role": "user", "content": "hello " * (i + 1)},
                          {"role": "assistant", "content": "hi"}]} for i in range(3)]
    rows = [mmpipe.encode_row(r, tok) for r in raws]
    assert all(r.family == "text" and r.num_images == 0 for r in rows)
    batch = mmpipe.Collator(tok, padding_side="left")(rows)
    kw = batch.model_inputs()
    assert "mm_token_type_ids" not in kw and kw["position_ids"].shape == batch.input_ids.shape
    assert_roundtrip(rows, batch=batch)
    assert_positions_match_rows(batch, rows)
    assert_batched_logits_match(model, rows, tok, batch=batch, rtol=1e-5, atol=1e-5,
                                references=[{"input_ids": torch.from_numpy(r.input_ids)[None]} for r in rows])
