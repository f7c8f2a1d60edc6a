"""The model sees every image: batched logits equal per-row transformers logits, and an
image change moves only its own row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_batched_logits_match, assert_positions_match_rows

from conftest import model_for, processor_for
from helpers import processor_reference


def _raws(photos, counts=(2, 0, 1, 3)):
    pool = photos + [im for _, im in testing.generated_images()][:4]
    raws, k = [], 0
    for i, n in enumerate(counts):
        content = [{"type": "text", "text": f"Row {i}: look."}]
        imgs = []
        for j in range(n):
            content += [{"type": "image"}, {"type": "text", "text": f" that was image {j}."}]
            imgs.append(pool[k % len(pool)])
            k += 1
        raws.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "fine " * (i + 1)}]}],
                     "images": imgs})
    return raws


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_batched_logits_equal_per_row_transformers_logits(family, photos):
    proc, model = processor_for(family), model_for(family)
    raws = _raws(photos)
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    batch = mmpipe.Collator(proc, padding_side="left")(rows)
    # each row's reference is the transformers processor's own output for the raw row
    refs = [{k: torch.from_numpy(v) for k, v in processor_reference(proc, raw["messages"], raw["images"]).items()}
            for raw in raws]
    assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, rtol=1e-5, atol=1e-5)
    assert_positions_match_rows(batch, rows, model=model)  # and each row's equal transformers' get_rope_index


def test_changing_one_image_changes_only_its_row(photos):
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    raws = _raws(photos)
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    swapped = dict(raws[3])
    new_img = testing.tiny_image(*reversed(swapped["images"][1].size), seed=99)  # same size, other pixels
    swapped["images"] = [swapped["images"][0], new_img, swapped["images"][2]]
    rows2 = rows[:3] + [mmpipe.encode_row(swapped, proc)]
    assert np.array_equal(rows2[3].input_ids, rows[3].input_ids)
    with torch.no_grad():
        a = model(**mmpipe.collate(rows, processor=proc).model_inputs()).logits
        b = model(**mmpipe.collate(rows2, processor=proc).model_inputs()).logits
    for r in range(3):
        assert torch.equal(a[r], b[r]), f"row {r} changed although only row 3's image did"
    assert not torch.allclose(a[3], b[3])


def test_removing_pixels_changes_logits(photos):
    """The equality above cannot pass vacuously: without pixel_values the logits differ."""
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    rows = [mmpipe.encode_row(r, proc) for r in _raws(photos, counts=(1, 2))]
    kw = mmpipe.collate(rows, processor=proc).model_inputs()
    blind = {k: v for k, v in kw.items() if k not in ("pixel_values", "image_grid_thw")}
    with torch.no_grad():
        assert not torch.allclose(model(**kw).logits, model(**blind).logits)
