"""Collate / unbatch of tiled-family rows (mmpipe.media.tiles_collate) on Gemma 3: records, stored
dicts, Arrow and torch-formatted rows give the same batch; the rows come back from the batch for
both padding sides and padded lengths; pass-through columns; a picklable Collator; mixed,
failed or foreign rows refused with the row named."""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.batching.collate import Collator
from mmpipe.batching.unbatch import unbatch as unbatch_tiled
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.offline import build_processor, tiny_image
from mmpipe.offline.gemma3 import build_gemma3_processor
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing import invariants

COUNTS = [0, 2, 1, 3]


@pytest.fixture(scope="module")
def proc():
    return build_gemma3_processor()


@pytest.fixture(scope="module")
def raws():
    out = []
    for k, n in enumerate(COUNTS):
        images = [tiny_image(30 + 17 * j, 40 + 9 * k, seed=k * 5 + j) for j in range(n)]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"row {k}" + " more" * k}]
        out.append({"id": f"r{k}", "messages": [{"role": "user", "content": content},
                                                {"role": "assistant", "content": [{"type": "text", "text": "ok " * (k + 1)}]}],
                    "images": images})
    return out


@pytest.fixture(scope="module")
def stored(proc, raws):
    ds = datasets.Dataset.from_list(raws)
    return ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=["messages", "images"])


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("multiple", [None, 16])
def test_roundtrip_every_row_form(proc, raws, stored, side, multiple):
    rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    want = mmpipe.collate(rows, processor=proc, pad_token_id=7, padding_side=side,
                          pad_to_multiple_of=multiple)
    assert want.input_ids.shape[1] % (multiple or 1) == 0
    forms = {"records": rows, "dicts": [r.to_dict() for r in rows], "stored": list(stored),
             "arrow": mmpipe.ArrowRows(stored).__getitems__(range(len(stored))),
             "torch": list(stored.with_format("torch"))}
    for name, form in forms.items():
        batch = mmpipe.collate(form, processor=proc, padding_side=side, pad_token_id=7, pad_to_multiple_of=multiple)
        for f in ("input_ids", "attention_mask", "position_ids", "mm_token_type_ids", "labels", "pixel_values",
                  "pixel_values_u8", "tiles_per_image", "image_hw"):
            assert np.array_equal(getattr(batch, f), getattr(want, f)), (name, f)
        invariants.assert_roundtrip(rows, batch, label=name)
    assert all(a.equals(b) for a, b in zip(unbatch_tiled(want), rows))


def test_arrow_reader_reads_the_buffers(stored, proc, raws):
    table = stored.with_format("arrow")[:]
    rows = rows_from_arrow(table)
    invariants.assert_rows_equal(rows, [mmpipe.encode_row(r, proc) for r in raws], what="rows_from_arrow")
    assert rows[3].pixel_values_u8.shape == (3, 32, 32, 3) and rows[0].pixel_values_u8.shape == (0, 32, 32, 3)


def test_collator_pickles_and_keeps_columns(proc, raws):
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=["messages", "images"])
    coll = mmpipe.Collator(proc, keep_columns=["id"], padding_side="right")
    assert isinstance(coll, Collator)
    again = pickle.loads(pickle.dumps(coll))
    batch = again(list(enc))
    assert batch.columns == {"id": ["r0", "r1", "r2", "r3"]}
    assert batch.images_per_row.tolist() == COUNTS and batch.pixel_values.shape == (sum(COUNTS), 3, 32, 32)
    with pytest.raises(InputError, match="no column 'nope'"):
        mmpipe.Collator(proc, keep_columns=["nope"])(list(enc))


def test_bad_batches_are_refused(proc, raws, stored):
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    with pytest.raises(ArgumentError, match="needs the processor"):
        mmpipe.collate(rows)  # pixels without the normalisation
    with pytest.raises(InputError, match="failed to encode"):
        mmpipe.collate([stored[0], dict(stored[1], mmpipe_error='{"row": 1}')], processor=proc)
    qwen = build_processor("qwen2_vl")
    native = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, qwen).to_dict()
    with pytest.raises(InputError, match="row of another family"):
        mmpipe.collate([stored[0], native], processor=proc)
    with pytest.raises(FamilyMismatchError):
        mmpipe.collate([stored[0]], processor=qwen)
    with pytest.raises(FamilyMismatchError):
        mmpipe.Collator(proc)([native])
    layout = mmpipe.encode_row(raws[1], proc, pixels="none")
    with pytest.raises(InputError, match="layout-only row"):
        mmpipe.collate([rows[1], layout], processor=proc)
    broken = dict(stored[1], pixel_values_u8=stored[1]["pixel_values_u8"][:-1])
    with pytest.raises(InputError, match="pixel_values_u8"):
        MultiModalInputs.from_dict(broken, 1)


def test_layout_only_rows_follow_the_one_rule_of_every_kind(proc, raws):
    """Layout-only rows (pixels="none") in a tiled batch: the rule of every kind (the batching
    checks' `carries_pixels`): rows with images but no pixels are refused (PixelDataError
    naming the row) unless ``allow_layout_only=True`` (a text-only batch, on purpose); mixed
    with rows that carry pixels a PixelDataError naming both, opt-in or not; a layout-only row
    WITHOUT images loses nothing, so it batches with rows that carry pixels."""
    from mmpipe.errors import PixelDataError

    layout = [mmpipe.encode_row(r, proc, pixels="none") for r in raws]
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    with pytest.raises(PixelDataError, match=r"rows \[1, 2, 3\] hold image/video tokens but no pixel data") as info:
        mmpipe.collate(layout, processor=proc)
    assert (info.value.row, info.value.column) == (1, "pixel_values_u8") and "pixels='uint8'" in info.value.fix
    batch = mmpipe.collate(layout, processor=proc, allow_layout_only=True)
    assert batch.pixel_format == "none" and "pixel_values" not in batch.model_inputs()
    for allow in (False, True):
        with pytest.raises(PixelDataError, match=r"rows \[1\] hold images but no pixel data.*rows \[0\] carry pixels"):
            mmpipe.collate([rows[1], layout[1]], processor=proc, allow_layout_only=allow)
    mixed = mmpipe.collate([layout[0], rows[1], rows[2]], processor=proc)  # layout[0]: no image
    alone = mmpipe.collate([rows[0], rows[1], rows[2]], processor=proc)
    np.testing.assert_array_equal(mixed.pixel_values, alone.pixel_values)
    assert mixed.sample_to_image_indices == alone.sample_to_image_indices
