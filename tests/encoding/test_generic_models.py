"""The generic path end to end on real model classes (issue 20.1): Idefics3 (row keys, ragged
tiles), LLaVA 1.5 (CLIP) and Gemma 3 (SigLIP, token_type_ids; a tiled family since issue 20.2, its
generic rows made by Encoder(family="generic") explicitly) - encode -> dataset.map ->
Arrow rows -> Collator -> model, with 0..3 images per row: batched logits == per-row logits,
left and right padding; Gemma 3's bidirectional image attention survives collate."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.offline.other_vlms import MODELS, build_foreign_model, build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows as chat_rows

COUNTS = [2, 0, 3, 1]  # images per row


@pytest.fixture(scope="module", params=[m for m in MODELS if mmpipe.families.takes_generic_path(build_foreign_processor(m))])
def stored(request):
    """(name, processor, model, stored rows as an encoded datasets.Dataset)."""
    name = request.param
    proc = build_foreign_processor(name)
    ds = datasets.Dataset.from_list(chat_rows(COUNTS))
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    return name, proc, build_foreign_model(name), enc


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_per_row(stored, side):
    name, proc, model, enc = stored
    rows = list(enc)
    batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert batch.input_ids.shape[0] == len(COUNTS) and len(set(batch.lengths.tolist())) > 1
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    invariants.assert_roundtrip(rows, batch)


def test_per_row_logits_equal_the_processors_own_inputs(stored):
    """A stored row run alone == the model on the processor's own call for that row."""
    name, proc, model, enc = stored
    raw = chat_rows(COUNTS)[2]
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    own = proc(text=[text], images=raw["images"], return_tensors="pt")
    with torch.no_grad():
        want = model(**own).logits[0]
        got = model(**mmpipe.collate([enc[2]], processor=proc).model_inputs()).logits[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _masks(model, kwargs):
    """The attention masks Gemma 3 hands its language model: {"full_attention", "sliding_attention"}
    -> bool [B, L, L], True where a query may attend to a key."""
    seen = {}

    def hook(_module, _args, kw):
        seen.update(kw["attention_mask"])

    handle = model.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        handle.remove()
    out = {}
    for k, m in seen.items():
        m = m[:, 0] if m.dim() == 4 else m
        out[k] = m if m.dtype == torch.bool else m == 0
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_gemma3_bidirectional_image_attention_survives_collate(side):
    """token_type_ids make Gemma 3 attend both ways inside each image's soft tokens; the
    batched mask at each row's real tokens equals the row's own mask (and is not causal)."""
    proc, model = build_foreign_processor("gemma3"), build_foreign_model("gemma3")
    enc = mmpipe.Encoder(proc, family="generic", log=lambda _: None)  # a tiled family, taken explicitly
    rows = [enc.encode_row(r) for r in chat_rows(COUNTS)]
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    assert "token_type_ids" in batch.sequence
    batched = _masks(model, batch.model_inputs())
    L = batch.input_ids.shape[1]
    for b, row in enumerate(rows):
        alone = _masks(model, mmpipe.collate([row], processor=proc).model_inputs())
        n = len(row)
        cols = slice(L - n, L) if side == "left" else slice(0, n)
        for kind in ("full_attention", "sliding_attention"):
            assert torch.equal(batched[kind][b, cols, cols], alone[kind][0]), (b, kind)
        image = np.flatnonzero(row.sequence["token_type_ids"] == 1)
        if len(image):  # the first image token sees the last token of its own block (4 soft tokens)
            assert bool(alone["full_attention"][0, image[0], image[3]])
            assert not bool(alone["full_attention"][0, 0, 1])  # text stays causal
