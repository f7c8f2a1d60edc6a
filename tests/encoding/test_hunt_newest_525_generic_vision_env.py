"""NemotronH Omni (transformers 5.25 ``nemotron_h_omni``: ``NemotronH_Omni_Reasoning_V3Processor`` around
its torchvision-only image processor, a video processor and Parakeet's audio feature extractor) takes
the generic path: rows of 1, 0 and 2 images == the processor's own call (ids, ``pixel_values`` [N, 768],
``image_grid_hw`` [I, 2]), the batch == its own batch call on both padding sides, and the positions
1-D (its text model, NemotronH, has no M-RoPE: `mmpipe.model_rope`); packing refused (generic path,
and its Mamba layers carry state across rows). Environment "vision" (torchvision's Python part)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.families import GENERIC, resolve_family
from mmpipe.model_rope import model_rope
from mmpipe.testing import invariants

from helpers import generic_chat_rows

pytestmark = pytest.mark.needs_env("vision")
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}"
            "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}")


@pytest.fixture(scope="module")
def line():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "NemotronH_Omni_Reasoning_V3Processor"):
        pytest.skip(f"transformers {transformers.__version__} has no nemotron_h_omni")
    from mmpipe.offline.vision_env_vlms import offline_tokenizer

    tok = offline_tokenizer(("<image>", "<img>", "</img>", "<video>", "<so_embedding>", "<so_start>", "<so_end>",
                             "<|im_start|>", "<|im_end|>", "<pad>"), eos="<|im_end|>", pad="<pad>")
    proc = transformers.NemotronH_Omni_Reasoning_V3Processor(
        image_processor=transformers.NemotronH_Omni_Reasoning_V3ImageProcessor(),
        video_processor=transformers.NemotronH_Omni_Reasoning_V3VideoProcessor(), tokenizer=tok,
        feature_extractor=transformers.ParakeetFeatureExtractor(), chat_template=TEMPLATE)
    raws = generic_chat_rows([1, 0, 2], sizes=[(64, 100), (120, 80), (48, 48)])
    return proc, raws, [mmpipe.encode_row(r, proc) for r in raws]


def test_rows_equal_the_processors_own_call(line):
    proc, raws, rows = line
    assert resolve_family(proc) is GENERIC and model_rope(type(proc).__name__).one_d
    for raw, row in zip(raws, rows):
        own = proc(text=[proc.apply_chat_template(raw["messages"], tokenize=False)], images=raw["images"] or None,
                   return_tensors="pt")
        assert row.input_ids.tolist() == own["input_ids"][0].tolist()
        assert set(own) - {"input_ids", "attention_mask"} == set(row.vision)
        for k, v in row.vision.items():
            assert np.array_equal(v, own[k].numpy()) and v.dtype == own[k].numpy().dtype, k


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_equals_the_processors_own_batch_call(line, side):
    proc, raws, rows = line
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in raws]
    own = proc(text=texts, images=[im for r in raws for im in r["images"]], return_tensors="pt", padding=True,
               padding_side=side)
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
    got = batch.model_inputs()
    for k, v in own.items():
        assert torch.equal(torch.as_tensor(got[k]), v), k
    real = got["attention_mask"].bool()
    assert got["position_ids"].shape == real.shape  # 1-D: [B, L], 0..n-1 over each row's real tokens
    assert [got["position_ids"][b][real[b]].tolist() for b in range(3)] == [list(range(int(n))) for n in real.sum(1)]
