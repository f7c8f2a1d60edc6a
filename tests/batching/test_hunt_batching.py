"""Stored rows as users build them by hand, and what unbatch is given: found by the data-layer hunt.

- a row dict made with ``np.asarray`` / ``torch.tensor`` on its lists has float empty arrays for
  the columns it has no value in (``video_grid_thw=[]`` -> float64 [0]); collate took that for
  float token ids ("would silently truncate") although no value can be cast wrongly;
- ``unbatch`` of what users hold instead of the batch (``batch.model_inputs()``, a pack, the rows)
  raised a bare AttributeError deep inside.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.testing import invariants
from mmpipe import testing
from mmpipe.batching.packing import pack
from mmpipe.errors import ArgumentError, InputError

from conftest import processor_for


@pytest.fixture(scope="module")
def rows():
    proc = processor_for("qwen2_vl")
    raws = []
    for i, n in enumerate((1, 0, 2)):
        content = [{"type": "image"}] * n + [{"type": "text", "text": f"Row {i}."}]
        raws.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "ok " * (i + 1)}]}],
                     "images": [testing.tiny_image(40 + 8 * j, 56, seed=i + j) for j in range(n)]})
    return [mmpipe.encode_row(r, proc).to_dict() for r in raws]


def _as(rows, conv):
    return [{k: (conv(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]


def _same(b, ref):
    for k in ("input_ids", "attention_mask", "position_ids", "labels", "pixel_values", "image_grid_thw",
              "video_grid_thw", "mm_token_type_ids"):
        assert torch.equal(getattr(b, k), getattr(ref, k)), k


@pytest.mark.parametrize("conv", [np.asarray, torch.tensor], ids=["numpy", "torch"])
def test_rows_as_arrays_with_empty_lists_collate(rows, conv):
    proc = processor_for("qwen2_vl")
    listed = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in rows]
    arrays = _as(listed, conv)
    assert str(arrays[1]["image_grid_thw"].dtype).replace("torch.", "").startswith("float")  # the case
    ref = mmpipe.Collator(proc)(rows)
    _same(mmpipe.Collator(proc)(arrays), ref)
    _same(mmpipe.collate(arrays, processor=proc), ref)


def test_float_values_still_refused(rows):
    proc = processor_for("qwen2_vl")
    bad = [dict(r) for r in rows]
    bad[2]["input_ids"] = np.asarray(bad[2]["input_ids"], np.float64) + 0.5
    with pytest.raises(InputError) as e:
        mmpipe.Collator(proc)(bad)
    assert e.value.row == 2 and e.value.column == "input_ids"


def test_unbatch_refuses_what_is_not_a_batch(rows):
    proc = processor_for("qwen2_vl")
    batch = mmpipe.Collator(proc)(rows)
    for wrong, says in ((batch.model_inputs(), "model_inputs"), (pack(rows, processor=proc), "unpack"),
                        (rows, "BatchedMultiModalInputs")):
        with pytest.raises(ArgumentError, match=says):
            invariants.assert_unbatched_rows_valid(wrong)  # runs mmpipe.unbatch on it
    invariants.assert_roundtrip(rows, batch)  # a batch still unbatches


@pytest.fixture(scope="module")
def stored(rows):
    import datasets

    return datasets.Dataset.from_list([{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
                                       for r in rows])


@pytest.mark.parametrize("fmt", ["python", "numpy", "torch"])
def test_dataset_slice_collates_like_its_rows(stored, fmt):
    """``ds[i:j]`` is a dict of columns in these formats (pandas / arrow slices were accepted): it
    was iterated by key and refused as "row 0: no 'family' column"."""
    proc = processor_for("qwen2_vl")
    ds = stored.with_format(fmt)
    ref = mmpipe.Collator(proc, keep_columns=["family"])([stored[i] for i in range(len(stored))])
    got = mmpipe.Collator(proc, keep_columns=["family"])(ds[0:len(stored)])
    _same(got, ref)
    assert list(got.columns["family"]) == ref.columns["family"]
    _same(mmpipe.collate(ds[0:len(stored)], processor=proc), ref)
    packed = pack(ds[0:len(stored)], processor=proc)
    assert torch.equal(packed.input_ids, pack([stored[i] for i in range(len(stored))], processor=proc).input_ids)
    with pytest.raises(ArgumentError, match=r"one row's dict"):
        mmpipe.Collator(proc)(ds[0])


def test_row_without_token_types_says_the_column_was_dropped(rows):
    """A row dict whose mm_token_type_ids column was dropped (a hand-made ``select`` of the
    columns) read as '0 image tokens in input_ids' although input_ids hold every image pad:
    the error now says what marks them and that the column may be gone."""
    proc = processor_for("qwen2_vl")
    lost = {k: v for k, v in rows[0].items() if k != "mm_token_type_ids"}
    with pytest.raises(InputError) as e:
        mmpipe.Collator(proc)([lost])
    assert e.value.row == 0 and e.value.column == "image_grid_thw"
    assert "counted where mm_token_type_ids == 1" in str(e.value) and "was dropped" in str(e.value)
    mmpipe.Collator(proc)([{k: v for k, v in rows[1].items() if k != "mm_token_type_ids"}])  # text-only: fine
