"""The generic path on the 2026 processors (issue 27): MiniCPM-V 4.6 / 4.7, whose processor JOINS
every image of a batch into one ``pixel_values`` [1, 3, 14, patches x 14] (collate used to stack
it per row: the model crashed), and processors returning bf16 / f16 pixels (Llama 4's; encode
used to fail converting them to numpy).

MiniCPM-V: the real processors and tiny real models (`mmpipe.offline.minicpmv`), rows with
0..3 images (one large enough to be sliced): encode == the processor's own call, collate == its
own batch call, batched logits == the model on each row's own processor call, the rows back out
of their batch (the invariant harness). Low-precision pixels: Llama 4's image processor needs torchvision (not in this
environment) and no PIL image processor of transformers 5.24 returns bf16, so a real processor
(LLaVA's) subclassed to cast its pixels as Llama 4's does stands in."""

from __future__ import annotations

import dataclasses

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.media.processor import ProcessorLayout
from mmpipe.offline.minicpmv import MINICPMV_NAMES, build_minicpmv_model, build_minicpmv_processor
from mmpipe.families import processor_class_name
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows, processor_call

COUNTS = [2, 0, 3, 1]  # images per row
SIZES = [(64, 96), (200, 150), (100, 100), (120, 240)]  # 200x150 and 120x240 are sliced (> 112x112)
PIXEL_KEYS = ("pixel_values", "target_sizes")


@pytest.fixture(scope="module", params=MINICPMV_NAMES)
def minicpm(request):
    """(name, processor, model, raw rows, encoded rows)."""
    name = request.param
    import transformers

    if not hasattr(transformers, "MiniCPMV4_6Processor"):
        pytest.skip(f"transformers {transformers.__version__} has no MiniCPM-V 4.6 / 4.7 (added in 5.x)")
    proc = build_minicpmv_processor(name)
    raws = generic_chat_rows(COUNTS, sizes=SIZES)
    return name, proc, build_minicpmv_model(name), raws, [mmpipe.encode_row(r, proc) for r in raws]


def test_layout_joins_the_pixels(minicpm):
    name, proc, _, _, rows = minicpm
    layout = rows[0].layout
    assert layout.joins == (("pixel_values", 3),) and layout.row_keys == () and layout.dtypes == ()
    assert ProcessorLayout.from_json(layout.to_json()) == layout
    assert processor_class_name(build_foreign_processor(name)) == processor_class_name(proc) == layout.processor_class


def test_encode_equals_the_processors_own_call(minicpm):
    _, proc, _, raws, rows = minicpm
    for raw, row in zip(raws, rows):
        own = processor_call(proc, [raw])
        assert np.array_equal(row.input_ids, own["input_ids"][0].numpy())
        for k in PIXEL_KEYS:
            assert (k in row.vision) == bool(raw["images"])
            if raw["images"]:
                assert np.array_equal(row.vision[k], own[k].numpy()) and row.vision[k].dtype == own[k].numpy().dtype
        for k, v in row.sequence.items():  # 4.7: mm_token_type_ids
            assert np.array_equal(v, own[k][0].numpy())


def test_collate_equals_the_processors_own_batch(minicpm):
    """Left padding (the processor's default): every input bit-identical to its batch call."""
    _, proc, _, raws, rows = minicpm
    batch = mmpipe.collate(rows, processor=proc, padding_side="left")
    own = processor_call(proc, raws)
    assert batch.vision["pixel_values"].shape == tuple(own["pixel_values"].shape)
    assert batch.vision["pixel_values"].shape[0] == 1 and len(batch.vision["target_sizes"]) > sum(COUNTS)
    for k in PIXEL_KEYS:
        assert np.array_equal(batch.vision[k], own[k].numpy())
    assert np.array_equal(batch.input_ids, own["input_ids"].numpy())
    assert np.array_equal(batch.attention_mask, own["attention_mask"].numpy())
    for k, v in batch.sequence.items():
        assert np.array_equal(v, own[k].numpy())


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_each_rows_own_call(minicpm, side):
    """The model on the batch (its own positions: 4.7's canvas M-RoPE needs them) at each row's
    real tokens == the model on the row's own processor call."""
    _, proc, model, raws, rows = minicpm
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    with torch.no_grad():
        logits = model(**batch.model_inputs(positions="none")).logits
        for b, raw in enumerate(raws):
            want = model(**processor_call(proc, [raw])).logits[0]
            n = int(batch.seq_lengths[b])
            got = logits[b, :n] if side == "right" else logits[b, -n:]
            assert (got - want).abs().max().item() < 1e-4, f"row {b}"


@pytest.mark.parametrize("side", ["left", "right"])
def test_unbatch_collate_is_the_rows(minicpm, side):
    _, proc, _, _, rows = minicpm
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
    # the zero-image row comes back without vision keys and with the batch's (= its own) layout
    assert not rows[1].vision and batch.layout == rows[1].layout and batch.shapes["pixel_values"][1] is None


def test_stored_rows_through_arrow(minicpm):
    """encode -> datasets.map -> Arrow rows -> Collator: the joined layout survives storage."""
    _, proc, _, raws, rows = minicpm
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    batch = mmpipe.Collator(proc)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert batch.layout.joins == (("pixel_values", 3),)
    invariants.assert_roundtrip(rows, batch)


def test_joined_rows_of_other_settings_are_refused(minicpm):
    """Rows whose joined output differs on another axis (another patch size) cannot be joined."""
    _, proc, _, _, rows = minicpm
    odd = dataclasses.replace(rows[0], vision={**rows[0].vision, "pixel_values": rows[0].vision["pixel_values"][:, :, :7]})
    with pytest.raises(mmpipe.errors.InputError, match="joined along axis 3"):
        mmpipe.collate([odd, rows[2]], processor=proc)


# ---- processors returning low-precision pixels (Llama 4: bf16) ----
class _LowPrecisionPixels:
    """A real processor whose pixels come back in ``DTYPE``, as Llama 4's image processor returns
    them (bf16 torch tensors: ``return_tensors="np"`` fails on them, as on Llama 4's)."""

    DTYPE = torch.bfloat16

    def __call__(self, *args, return_tensors=None, **kwargs):
        from transformers import BatchFeature

        out = dict(super().__call__(*args, return_tensors="pt", **kwargs))
        if "pixel_values" in out:
            out["pixel_values"] = out["pixel_values"].to(self.DTYPE)
        return BatchFeature(out, tensor_type=return_tensors)


def _low_precision_llava(dtype):
    proc = build_foreign_processor("llava")
    proc.__class__ = type(f"{str(dtype)[6:].title()}LlavaProcessor", (_LowPrecisionPixels, type(proc)),
                          {"DTYPE": dtype, "__module__": __name__})
    return proc


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_pixels_stored_exactly_and_handed_back(dtype):
    proc = _low_precision_llava(dtype)
    name = str(dtype)[6:]
    if dtype == torch.bfloat16:
        with pytest.raises(ValueError, match="Unable to convert output 'pixel_values'"):
            proc(text=["<image>"], images=[generic_chat_rows([1])[0]["images"][0]], return_tensors="np")
    raws = generic_chat_rows([2, 0, 1])
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    assert rows[0].layout.dtypes == (("pixel_values", name),)
    assert dict((n, t) for n, t, _ in rows[0].layout.vision)["pixel_values"] == "float32"
    ds = datasets.Dataset.from_list(raws)
    stored = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    back = mmpipe.rows_from_arrow(stored.data.table)
    invariants.assert_rows_equal(back, rows, what="arrow rows")
    for raw, row, arrow_row in zip(raws, rows, back):
        own = processor_call(proc, [raw])
        if raw["images"]:
            assert own["pixel_values"].dtype == dtype
            assert torch.equal(torch.from_numpy(row.vision["pixel_values"]), own["pixel_values"].float())  # exact
        alone = mmpipe.collate([arrow_row], processor=proc).model_inputs()
        if raw["images"]:
            assert alone["pixel_values"].dtype == dtype and torch.equal(alone["pixel_values"], own["pixel_values"])
    batch = mmpipe.collate(back, processor=proc)
    pv = batch.model_inputs()["pixel_values"]
    assert pv.dtype == dtype and torch.equal(pv, processor_call(proc, raws, padding=True)["pixel_values"])
    invariants.assert_roundtrip(rows, processor=proc)
