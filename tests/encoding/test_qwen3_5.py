"""Qwen3.5 and Qwen3.5-MoE (transformers 5 ``qwen3_5`` / ``qwen3_5_moe``) take the Qwen3-VL
processor's rows (their checkpoints ship ``Qwen3VLProcessor``: family qwen3_vl): mmpipe's
positions == the Qwen3.5 model's own get_rope_index (a copy of Qwen3-VL's in transformers 5.24),
batched logits == per-row logits (rows of 0..3 images and one with a video, left and right
padding; hybrid linear / full attention). Measured max-abs: about 2e-7 for both lines.
Packing is refused for them (tests/batching/test_packing_models.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.families import QWEN3_VL, resolve_family
from mmpipe.offline.qwen3_5 import MODEL_LINES
from mmpipe.testing import invariants

LINES = ("qwen3_5", "qwen3_5_moe")
COUNTS = [0, 1, 2, 3]  # images per row; then a row with a video and an image


def _available(name: str) -> bool:
    import transformers

    return hasattr(transformers, MODEL_LINES[name])


@pytest.fixture(scope="module")
def proc():
    return testing.build_processor(QWEN3_VL.name)


@pytest.fixture(scope="module")
def rows(proc):
    out = []
    for i, k in enumerate(COUNTS):
        content = []
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f" picture {j}."}]
        content.append({"type": "text", "text": "Please look carefully. " * (i % 2) + "Describe them."})
        imgs = [testing.tiny_image(40 + 16 * j + 8 * i, 56 + 24 * i, seed=5 * i + j) for j in range(k)]
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": f"Answer {i}."}]
        out.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc))
    video = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "image"},
                                                       {"type": "text", "text": "What happens?"}]},
                          {"role": "assistant", "content": "It brightens."}],
             "videos": [[np.full((64, 64, 3), 17 * t, np.uint8) for t in range(4)]],
             "images": [testing.tiny_image(50, 70, seed=3)]}
    out.append(mmpipe.encode_row(video, proc, video_options={"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 16}))
    assert len(out[-1].video_grid_thw) == 1
    return out


@pytest.fixture(scope="module", params=LINES)
def model(request):
    if not _available(request.param):
        pytest.skip(f"transformers 4.x has no {MODEL_LINES[request.param]}")
    return testing.build_model(request.param)


def test_the_processor_is_qwen3_vl(proc, model):
    """The rows' family comes from the processor (Qwen3-VL), whichever of these models reads them."""
    assert resolve_family(proc) is QWEN3_VL and type(model).__name__ in MODEL_LINES.values()


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_positions_and_batched_logits_equal_per_row(proc, rows, model, padding_side):
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=padding_side)
    invariants.assert_positions_match_rows(batch, rows, model=model)  # == Qwen3.5's get_rope_index per row
    logits = invariants.assert_batched_logits_match(model, rows, proc, batch=batch, rtol=0, atol=1e-4)
    gaps = []
    with torch.no_grad():
        for b, r in enumerate(rows):
            n, L = int(batch.seq_lengths[b]), logits.shape[1]
            alone = model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0]
            got = logits[b, L - n:] if padding_side == "left" else logits[b, :n]
            gaps.append(float((got - alone).abs().max()))
    assert max(gaps) < 1e-4, gaps
