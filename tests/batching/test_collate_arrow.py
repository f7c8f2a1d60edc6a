"""ArrowRows / collate from Arrow tables: the same batch as collate from datasets' rows."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_from_arrow
from mmpipe.batching.collate import ArrowRows
from mmpipe.records.row import MultiModalInputs

from conftest import processor_for


def _raws(n_rows=6):
    raws = []
    for i in range(n_rows):
        k = i % 3  # 0, 1, 2 images
        content = [{"type": "text", "text": f"row {i}"}]
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f" image {j}"}]
        msgs = [{"role": "user", "content": content}]
        if i % 2:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "An answer."}]})
        raws.append({"messages": msgs,
                     "images": [testing.tiny_image(30 + 11 * j, 50 + 9 * i, seed=7 * i + j) for j in range(k)]})
    return raws


def _same_batch(a, b):
    for k in ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "rope_deltas", "labels",
              "image_grid_thw", "image_offsets", "patch_offsets", "pixel_values", "pixel_values_u8",
              "video_grid_thw", "seq_lengths"):
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            assert x.shape == y.shape and torch.equal(x, y), k
    assert a.row_pixel_formats == b.row_pixel_formats


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("pixels", ["uint8", "float32", "none"])
def test_arrow_rows_collate_like_python_rows(family, pixels, tmp_path):
    proc = processor_for(family)
    rows = [mmpipe.encode_row(r, proc, pixels=pixels).to_dict() for r in _raws()]
    ds = datasets.Dataset.from_list(rows, features=MultiModalInputs.features(pixels))
    ds.save_to_disk(tmp_path / "enc")
    ds = datasets.load_from_disk(tmp_path / "enc")  # memory-mapped, as in training
    col = mmpipe.Collator(proc, padding_side="right", allow_layout_only=pixels == "none")  # "none": ids only
    order = [4, 0, 5, 2]
    want = col(ds.__getitems__(order))
    _same_batch(col(ArrowRows(ds).__getitems__(order)), want)
    # a DataLoader with workers and without batching both work
    loader = DataLoader(ArrowRows(ds.select(order)), batch_size=4, collate_fn=col, num_workers=2)
    _same_batch(next(iter(loader)), want)
    _same_batch(col([ArrowRows(ds)[i] for i in order]), want)
    assert_rows_from_arrow(ds.with_format("arrow")[order], [ds[i] for i in order])


def video_row(proc, grid=(4, 4, 6)):
    """A compact row holding one video (built as the processor lays one out)."""
    tok, fam = proc.tokenizer, mmpipe.family_of(proc)
    spec = mmpipe.VisionSpec.from_processor(proc)
    vs, ve, vp = (tok.convert_tokens_to_ids(x) for x in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>"))
    t, h, w = grid
    ids = np.asarray(tok("Watch: ", add_special_tokens=False)["input_ids"] + [vs] + [vp] * (t * h * w // 4) + [ve]
                     + tok(" what happens?", add_special_tokens=False)["input_ids"])
    u8 = np.random.default_rng(0).integers(0, 256, size=(t * h * w, fam.patch_dim), dtype=np.uint8)
    out = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64),
           "mm_token_type_ids": 2 * (ids == vp).astype(np.int64)[None], "video_grid_thw": np.asarray([grid]),
           "pixel_values_videos": mmpipe.images.u8_video_to_pixel_values(u8, spec.for_videos().lut()),
           "second_per_grid_ts": np.asarray([1.0], np.float32)}
    return mmpipe.compact(mmpipe.rows_from_processor_output(out, proc)[0], spec)


def test_arrow_rows_without_labels_and_with_videos():
    proc = processor_for("qwen2_5_vl")
    rows = [mmpipe.encode_row(r, proc, labels=False) for r in _raws(3)] + [video_row(proc)]
    ds = datasets.Dataset.from_list([r.to_dict() for r in rows], features=MultiModalInputs.features("uint8", labels=False))
    col = mmpipe.Collator(proc)
    got = col(ArrowRows(ds).__getitems__([3, 2, 1, 0]))
    _same_batch(got, col(ds.__getitems__([3, 2, 1, 0])))
    assert torch.equal(got.pixel_values_videos, col(rows[::-1]).pixel_values_videos)
    assert_roundtrip(rows[::-1], batch=got)


def test_arrow_rows_reject_altered_pixel_bytes():
    proc = processor_for("qwen2_vl")
    row = mmpipe.encode_row(_raws(2)[1], proc).to_dict()
    row["pixel_values_u8"] = row["pixel_values_u8"][:-1]  # end marker lost
    ds = datasets.Dataset.from_list([row], features=MultiModalInputs.features("uint8"))
    with pytest.raises(ValueError, match="end marker"):
        mmpipe.Collator(proc)(ArrowRows(ds).__getitems__([0]))
