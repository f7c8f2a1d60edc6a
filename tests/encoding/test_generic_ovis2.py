"""The generic path on Ovis2 (issue 27.3; transformers 5.24 ``ovis2``): the stock ``Ovis2Processor``
(plain-text ``<image>`` expanded to ``<IMG_START>`` atoms ``<IMG_GRID>`` [tile atoms with
``<IMG_COL>`` / ``<IMG_ROW>``] ``<IMG_END>``), its PIL image processor cutting each image into
1..4 tiles plus a thumbnail (``pixel_values`` [tiles, 3, 56, 56], ``grids`` dropped), and a tiny real
``Ovis2ForConditionalGeneration`` (`mmpipe.offline.ovis2`). Rows of 0..3 images with 1x1, 1x2, 2x2
and 3x1 grids: encode == the processor's chat path and its own call, collate == its batch call
(both padding sides), batched logits == each row's own call (left and right padding), the rows
back out of their batch, also after a datasets / Arrow round trip (the invariant harness)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.offline.other_vlms import build_foreign_model, build_foreign_processor
from mmpipe.testing import invariants

from helpers import chat_path, generic_chat_rows, processor_call

COUNTS = [2, 0, 3, 1]  # images per row
SIZES = [(64, 100), (40, 56), (60, 170), (70, 30)]  # tile grids 2x2, 1x1, 3x1, 1x2 (5, 1, 4, 3 tiles)


@pytest.fixture(scope="module")
def ovis2():
    """(processor, model, raw rows, encoded rows)."""
    import transformers

    if not hasattr(transformers, "Ovis2ImageProcessorPil"):
        pytest.skip(f"transformers {transformers.__version__} has no Ovis2ImageProcessorPil (the PIL image "
                    "processor the offline Ovis2 processor uses: transformers 5.x)")
    proc = build_foreign_processor("ovis2")
    raws = generic_chat_rows(COUNTS, sizes=SIZES)
    return proc, build_foreign_model("ovis2"), raws, [mmpipe.encode_row(r, proc) for r in raws]


def test_encode_equals_the_processors_chat_path_and_call(ovis2):
    proc, _, raws, rows = ovis2
    tiles = {"<IMG_GRID>": 0, "<IMG_COL>": 0, "<IMG_ROW>": 0}
    for raw, row in zip(raws, rows):
        for own in (chat_path(proc, raw), processor_call(proc, [raw])):
            assert set(own) == {"input_ids", "attention_mask"} | ({"pixel_values"} if raw["images"] else set())
            assert np.array_equal(row.input_ids, own["input_ids"][0].numpy())
            assert set(row.vision) == ({"pixel_values"} if raw["images"] else set()) and not row.sequence
            if raw["images"]:
                pv = own["pixel_values"].numpy()
                assert np.array_equal(row.vision["pixel_values"], pv) and row.vision["pixel_values"].dtype == pv.dtype
        for t in tiles:
            tiles[t] += int((row.input_ids == proc.tokenizer.convert_tokens_to_ids(t)).sum())
    # 2x2 twice, 3x1, 1x2 (rows x columns): the multi-tile placeholders are in the rows
    assert tiles == {"<IMG_GRID>": 6, "<IMG_COL>": 2 + 2 + 0 + 1, "<IMG_ROW>": 1 + 1 + 2 + 0}
    assert [len(r.image_hw) if r.image_hw is not None else 0 for r in rows] == COUNTS


@pytest.mark.parametrize("side", ["left", "right"])
def test_collate_equals_the_processors_own_batch(ovis2, side):
    """The batch call pads the same way: every input bit-identical."""
    proc, _, raws, rows = ovis2
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    own = processor_call(proc, raws, padding=True, padding_side=side)
    assert set(batch.vision) == {"pixel_values"} and not batch.sequence
    assert batch.vision["pixel_values"].shape == (5 + 1 + 4 + 3 + 5 + 1, 3, 56, 56)  # tiles + thumbnails
    assert np.array_equal(batch.vision["pixel_values"], own["pixel_values"].numpy())
    assert np.array_equal(batch.input_ids, own["input_ids"].numpy())
    assert np.array_equal(batch.attention_mask, own["attention_mask"].numpy())
    assert batch.sample_to_image_indices == [[0, 1], [], [2, 3, 4], [5]]


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_each_rows_own_call(ovis2, side):
    """The model on the batch at each row's real tokens == the model on the row's own call."""
    proc, model, raws, rows = ovis2
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    refs = [dict(processor_call(proc, [raw])) for raw in raws]
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the images count: blanking one row's pixels moves its logits
        blank = dict(refs[3], pixel_values=torch.zeros_like(refs[3]["pixel_values"]))
        assert (model(**refs[3]).logits - model(**blank).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("side", ["left", "right"])
def test_unbatch_collate_is_the_rows(ovis2, side):
    proc, _, _, rows = ovis2
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
    # the zero-image row comes back without vision keys and with the batch's (= its own) layout
    assert not rows[1].vision and batch.layout == rows[1].layout


def test_stored_rows_through_arrow(ovis2):
    """encode -> datasets.map -> Arrow rows -> Collator -> unbatch == the rows."""
    proc, _, raws, rows = ovis2
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    invariants.assert_rows_from_arrow(enc.data.table, rows)
    for side in ("left", "right"):
        batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
        invariants.assert_roundtrip(rows, batch)
