"""Text-only decoder models: no images, plain 1-D positions, same pipeline."""

from __future__ import annotations

import torch

from helpers import tiny_text_model
import mmpipe
from mmpipe import testing


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
    assert mmpipe.unbatch(batch) == rows
    with torch.no_grad():
        logits = model(**kw).logits
        L = logits.shape[1]
        for b, r in enumerate(rows):
            ref = model(input_ids=torch.from_numpy(r.input_ids)[None]).logits[0]
            torch.testing.assert_close(logits[b, L - r.num_tokens:], ref, rtol=1e-5, atol=1e-5)
