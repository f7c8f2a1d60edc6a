"""The invariant harness itself: each check passes on good data and FAILS, naming the row,
on a batch / pack / row broken on purpose (a harness that cannot fail proves nothing)."""

from __future__ import annotations

import dataclasses

import datasets
import pyarrow as pa
import pytest
import torch

import mmpipe
from mmpipe import rema, testing
from mmpipe.batching.packing import pack
from mmpipe.errors import ArgumentError
from mmpipe.records.generation import Completion, Generation
from mmpipe.records.rema import ReMABatch
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing import invariants as inv

from conftest import model_for, processor_for

FAMILY = "qwen2_vl"


@pytest.fixture(scope="module")
def rows():
    """Three rows: 1 image + answer, text only, 2 images (uint8 pixels)."""
    proc = processor_for(FAMILY)
    raws = []
    for i, k in enumerate((1, 0, 2)):
        content = [{"type": "text", "text": f"Row {i}: " + "look " * (i + 1)}]
        content += [{"type": "image"}, {"type": "text", "text": "."}] * k
        msgs = [{"role": "user", "content": content}]
        if i == 0:
            msgs.append({"role": "assistant", "content": "fine"})
        raws.append({"messages": msgs, "images": [testing.tiny_image(40 + 8 * j, 56, seed=10 * i + j) for j in range(k)]})
    return [mmpipe.encode_row(r, proc) for r in raws]


def _clone(batch):
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).clone() for f in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, f.name), torch.Tensor)})


# ---- round trips -----------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_roundtrip_passes_for_records_dicts_and_batch_lists(rows, side):
    proc = processor_for(FAMILY)
    batch = inv.assert_roundtrip(rows, processor=proc, padding_side=side)
    assert isinstance(batch, mmpipe.BatchedMultiModalInputs) and batch.padding_side == side
    inv.assert_roundtrip([r.to_dict() for r in rows], processor=proc, padding_side=side)
    inv.assert_roundtrip(rows, batch=[mmpipe.collate(rows[:2], processor=proc), mmpipe.collate(rows[2:], processor=proc)])


def test_roundtrip_fails_naming_the_row_and_field(rows):
    proc = processor_for(FAMILY)
    batch = _clone(mmpipe.collate(rows, processor=proc, padding_side="left"))
    batch.input_ids[1, -1] += 1  # row 1's last real token
    with pytest.raises(AssertionError, match=r"row 1 changed through collate/unbatch: fields \['input_ids'\]"):
        inv.assert_roundtrip(rows, batch=batch)
    with pytest.raises(AssertionError, match="gave 3 rows, expected 2"):
        inv.assert_roundtrip(rows[:2], batch=mmpipe.collate(rows, processor=proc))
    with pytest.raises(AssertionError, match=r"case 7: row 0 changed"):
        inv.assert_roundtrip(rows[::-1], batch=mmpipe.collate(rows, processor=proc), label="case 7")
    with pytest.raises(ArgumentError, match="collate arguments or a ready batch"):
        inv.assert_roundtrip(rows, batch=batch, processor=proc)


def test_pack_roundtrip_passes_and_fails(rows):
    proc = processor_for(FAMILY)
    p = inv.assert_pack_roundtrip(rows, processor=proc)
    p.labels[0, 3] = 7  # inside row 0
    with pytest.raises(AssertionError, match=r"row 0 changed through pack/unpack: fields \['labels'\]"):
        inv.assert_pack_roundtrip(rows, packed=p)


def test_rows_from_arrow_passes_and_fails(rows):
    def table(rs):
        return datasets.Dataset.from_list([r.to_dict() for r in rs], features=MultiModalInputs.features("uint8")).data.table

    assert inv.assert_rows_from_arrow(table(rows), rows) == rows
    swapped = table([rows[0], rows[2], rows[1]])
    with pytest.raises(AssertionError, match=r"row 1 changed through rows_from_arrow: fields \[.*'input_ids'"):
        inv.assert_rows_from_arrow(swapped, rows)


def test_unbatched_rows_valid_passes_and_fails(rows):
    batch = _clone(mmpipe.collate(rows, processor=processor_for(FAMILY)))
    assert inv.assert_unbatched_rows_valid(batch) == rows
    batch.mm_token_type_ids[2, -3] = 1  # a text token of row 2 marked as an image token
    with pytest.raises(ValueError, match="row 2"):
        inv.assert_unbatched_rows_valid(batch)


# ---- positions -------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_positions_match_rows_passes_with_the_model(rows, side):
    batch = mmpipe.collate(rows, processor=processor_for(FAMILY), padding_side=side)
    inv.assert_positions_match_rows(batch, rows, model=model_for(FAMILY))


def test_positions_fail_naming_the_row(rows):
    good = mmpipe.collate(rows, processor=processor_for(FAMILY), padding_side="right")
    moved = _clone(good)
    moved.position_ids[1, 2, 0] += 1
    with pytest.raises(AssertionError, match="row 2: batched position_ids differ"):
        inv.assert_positions_match_rows(moved, rows)
    padded = _clone(good)
    padded.position_ids[0, 1, -1] = 5  # row 1 is the shortest: its last column is a pad
    with pytest.raises(AssertionError, match="row 1: position_ids are not 0 at the pads"):
        inv.assert_positions_match_rows(padded, rows)
    delta = _clone(good)
    delta.rope_deltas[0] -= 1
    with pytest.raises(AssertionError, match="row 0: batched rope_delta"):
        inv.assert_positions_match_rows(delta, rows)
    # the row itself off the M-RoPE rule (consistent with its batch): caught by the recompute
    bad = dataclasses.replace(rows[2], position_ids=rows[2].position_ids + 1, rope_delta=rows[2].rope_delta + 1)
    with pytest.raises(AssertionError, match="row 3: position_ids differ from the M-RoPE rule"):
        inv.assert_row_positions(bad, row_index=3)


# ---- model outputs ---------------------------------------------------------------------------
def test_batched_logits_match_passes_and_fails(rows):
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    logits = inv.assert_batched_logits_match(model, rows, proc, padding_side="right")
    assert logits.shape[:2] == (3, max(r.num_tokens for r in rows))
    ref = mmpipe.collate([rows[1]], processor=proc).model_inputs()
    inv.assert_batched_logits_match(model, rows, proc, references=[None, ref, None])
    broken = _clone(mmpipe.collate(rows, processor=proc, padding_side="left"))
    broken.input_ids[2, -3] = 100  # a text token of row 2
    with pytest.raises(AssertionError, match="row 2: batched logits differ from the row alone"):
        inv.assert_batched_logits_match(model, rows, proc, batch=broken)
    with pytest.raises(AssertionError, match="row 0: .* tokens in the batch, .* when run alone"):
        inv.assert_batched_logits_match(model, rows, proc, references=[ref, None, None])


def test_packed_logits_match_passes_and_fails(rows):
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    out = inv.assert_packed_logits_match(model, rows, proc)
    assert out.logits.shape[:2] == (1, sum(r.num_tokens for r in rows))
    p = pack(rows, processor=proc)
    p.input_ids[0, int(p.cu_seqlens[1]) + 2] = 100  # a text token of row 1
    with pytest.raises(AssertionError, match="row 1: packed logits differ from the row alone"):
        inv.assert_packed_logits_match(model, rows, proc, packed=p)


def test_logprobs_match_passes_and_fails(rows):
    proc, model = processor_for(FAMILY), model_for(FAMILY)
    batch = mmpipe.collate(rows, processor=proc, padding_side="right")
    got = inv.policy_logprobs(model, batch)
    assert [g.shape[0] for g in got] == [0 if r.labels is None else int((r.labels != -100).sum()) for r in rows]
    assert got[0].shape[0] > 0
    assert inv.assert_logprobs_match(got, [g.copy() for g in got]) == 0.0
    want = [g.copy() for g in got]
    want[0][-1] += 1e-3
    assert inv.logprob_gap(got, want) == pytest.approx(1e-3, rel=1e-2)
    with pytest.raises(AssertionError, match="row 0: logprob gap"):
        inv.assert_logprobs_match(got, want, atol=1e-4)
    with pytest.raises(AssertionError, match=r"row 0: logprobs of shape \(\d+,\), expected"):
        inv.logprob_gap(got, [g[:-1] for g in got])


class _OkEngine:
    """A rollout engine answering every prompt with "ok" and the end-of-turn token."""

    def __init__(self, processor):
        tok = processor.tokenizer
        self.ids = tok("ok", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, rows, params=None):
        return [Generation(prompt_index=k, completions=[Completion(token_ids=list(self.ids), finish_reason="stop")])
                for k in range(len(rows))]


def test_rema_roundtrip_passes_and_fails(monkeypatch):
    proc = processor_for(FAMILY)
    qs = [{"question": "Q0: what is shown? <image>", "images": [testing.tiny_image(40, 52)]}, "Q1: why?"]
    batch = rema.rollout(qs, _OkEngine(proc), proc, agent_roles=["meta", "reasoner"], max_num_turns=1,
                         finish_flag=None)
    back = inv.assert_rema_roundtrip(batch)
    assert back.diff(batch) == []
    real = ReMABatch.from_arrow.__func__

    def lossy(cls, table):  # a codec that loses one label
        out = real(cls, table)
        out.batch["meta_labels"][0, -1] = 1
        return out

    monkeypatch.setattr(ReMABatch, "from_arrow", classmethod(lossy))
    with pytest.raises(AssertionError, match=r"ReMA batch changed through Arrow: fields \['meta_labels'\]"):
        inv.assert_rema_roundtrip(batch)


def test_rema_roundtrip_fails_on_a_wrong_schema():
    class NotReMA:
        agent_roles, family, max_num_turns = ("meta", "reasoner"), FAMILY, 2

        def to_arrow(self):
            return pa.table({"x": [1]})

    with pytest.raises(AssertionError, match="ReMA Arrow schema differs"):
        inv.assert_rema_roundtrip(NotReMA())
