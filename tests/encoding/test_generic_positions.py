"""The generic path hands a model only positions it can compute exactly (issue 27): 1-D
``position_ids`` [B, L] where the processor's model takes 1-D positions (Idefics3), none where its
rope is multi-dimensional (GLM-4.6V: the model computes them, as with the processor's own batch),
``positions="1d"`` refused there. Decided from transformers' tables by the processor class
(`mmpipe.model_rope`). Rows of 0..3 images, left and right padding.

GLM-4.6V has a native row now (tests/encoding/test_glm46v.py); here it stands for a processor
WITHOUT a row whose model's rope is 3-D (the Omni thinkers, ...): the module hides its row from
the class lookups (`glm46v_without_its_row`), so it takes the generic path as such a processor
does (``Encoder(processor, family="generic")`` refuses a native patch-grid processor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import families
from mmpipe.errors import ArgumentError
from mmpipe.model_rope import model_rope
from mmpipe.offline import glm46v
from mmpipe.offline.other_vlms import build_foreign_model, build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows as chat_rows

COUNTS = [2, 0, 3, 1]  # images per row
SIDES = ["left", "right"]
needs_glm46v = pytest.mark.skipif(not glm46v.available(), reason="transformers 4.x has no GLM-4.6V (glm46v)")


@pytest.fixture(scope="module", autouse=True)
def glm46v_without_its_row():
    """The glm46v row out of the processor-class and model-type lookups for this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(families._PROCESSOR_CLASSES, "Glm46VProcessor")
        mp.delitem(families._MODEL_TYPES, "glm46v")
        yield


@pytest.fixture(scope="module")
def glm():
    """(processor, model, raw chat rows, encoded rows) of GLM-4.6V through the generic path."""
    if not glm46v.available():
        pytest.skip("transformers 4.x has no GLM-4.6V (glm46v)")
    proc, raws = glm46v.build_processor(), chat_rows(COUNTS)
    assert mmpipe.families.takes_generic_path(proc)
    return proc, glm46v.build_model(), raws, [mmpipe.encode(r, processor=proc) for r in raws]


def _own(proc, raw) -> dict:
    """The processor's own call on the row's chat (its template, its images)."""
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    return dict(proc(text=[text], images=raw["images"] or None, return_tensors="pt"))


def test_the_rope_tables():
    """From transformers' tables: GLM-4.6V and the Omni thinkers are multi-dimensional, the
    generic path's 1-D models are 1-D, a class transformers does not map is unknown."""
    if glm46v.available():
        assert model_rope("Glm46VProcessor").kind == "multi"
        assert model_rope("Qwen2_5OmniProcessor").kind == "multi"  # its thinker's get_rope_index
    for cls in ("Idefics3Processor", "LlavaProcessor", "MllamaProcessor", "PaliGemmaProcessor", "Gemma3Processor"):
        assert model_rope(cls).kind == "1d", model_rope(cls)
    assert model_rope("MyOwnProcessor").kind == "unknown"


def test_encode_equals_the_processor(glm):
    proc, _, raws, rows = glm
    for i, (raw, row) in enumerate(zip(raws, rows)):
        own = _own(proc, raw)
        assert np.asarray(row["input_ids"]).tolist() == own["input_ids"][0].tolist(), f"row {i}"
        assert np.asarray(row["mm_token_type_ids"]).tolist() == own["mm_token_type_ids"][0].tolist(), f"row {i}"
        r = mmpipe.collate([row], processor=proc)
        assert sorted(r.vision) == (sorted(["pixel_values", "image_grid_thw"]) if raw["images"] else [])
        for k in r.vision:
            np.testing.assert_array_equal(np.asarray(r.vision[k]), own[k].numpy(), err_msg=f"row {i} {k}")


@pytest.mark.parametrize("side", SIDES)
def test_batched_logits_equal_per_row(glm, side):
    """Default model_inputs: no position_ids (the model's get_rope_index); each row's logits in
    the batch == the model on the processor's own call for that row. Measured: 0.0 both sides;
    the old default (1-D positions) was off by up to 9.1e-3 on this model, rows with images."""
    proc, model, raws, rows = glm
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    kw = batch.model_inputs()
    assert "position_ids" not in kw and "mm_token_type_ids" in kw
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-4, rtol=0,
                                           references=[_own(proc, r) for r in raws])
    with torch.no_grad():  # what 1-D positions did: measurably wrong wherever a row has images
        old = model(**kw, position_ids=torch.as_tensor(batch.position_ids)).logits
        new = model(**kw).logits
    gap = [(old[b] - new[b])[torch.as_tensor(batch.attention_mask[b]).bool()].abs().max().item()
           for b in range(len(rows))]
    assert all((g > 1e-3) == bool(n) for g, n in zip(gap, COUNTS)), gap


def test_positions_1d_refused(glm):
    proc, _, _, rows = glm
    batch = mmpipe.collate(rows, processor=proc)
    with pytest.raises(ArgumentError, match=r"Glm46VProcessor.*get_rope_index.*positions=None"):
        batch.model_inputs(positions="1d")
    assert "position_ids" not in batch.model_inputs(positions="none")


def test_roundtrip_with_the_zero_image_row(glm):
    proc, _, _, rows = glm
    for side in SIDES:
        invariants.assert_roundtrip(rows, processor=proc, padding_side=side)


def test_old_rows_decide_by_their_processor_class(glm):
    """Rows of an earlier mmpipe (no image_hw) carry the processor class in their stored layout:
    they get the same default."""
    proc, _, _, rows = glm
    old = [{k: v for k, v in r.items() if k != "image_hw"} for r in rows]
    assert "position_ids" not in mmpipe.collate(old, processor=proc).model_inputs()


@pytest.mark.parametrize("side", SIDES)
def test_a_1d_model_keeps_its_positions(side):
    """Idefics3 (Llama rope) keeps today's 1-D position_ids [B, L] (``positions="1d"`` too) and
    batched logits == per-row logits."""
    proc, model = build_foreign_processor("idefics3"), build_foreign_model("idefics3")
    rows = [mmpipe.encode(r, processor=proc) for r in chat_rows(COUNTS)]
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    for positions in (None, "1d"):
        kw = batch.model_inputs(positions=positions)
        np.testing.assert_array_equal(kw["position_ids"].numpy(), np.asarray(batch.position_ids))
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-5, rtol=1e-5)
    invariants.assert_roundtrip(rows, batch)


def test_glm46v_builder_says_what_it_needs(monkeypatch):
    """On transformers 4.x (no glm46v) the builders raise, naming the version to install."""
    monkeypatch.setattr(glm46v, "available", lambda: False)
    for build in (glm46v.build_processor, glm46v.build_model):
        with pytest.raises(ArgumentError, match=r"GLM-4.6V .*not in transformers .*transformers>=5"):
            build()
