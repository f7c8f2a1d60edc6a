"""Packing on transformers 4.57's model classes (scripts/envs/tf457.sh).

A pack hands the model one ``[1, T]`` sequence with ``position_ids [4, 1, T]`` (text positions
restarting per row, then the M-RoPE rows) and no attention mask. 4.57's Qwen-VL text stacks take
the text row to find the rows; 4.57's GLM-4.1V (``Glm4vTextModel``) has no such branch: it hands
the positions as they are to the mask builder, whose packed-sequence check expands them to the
batch and raises ``RuntimeError: expand(torch.LongTensor{[4, 1, T]}, size=[1, -1])``. So on 4.x
`check_packing` refuses GLM-4.1V (typed, naming transformers >= 5 and the padded collator),
while the families 4.57 packs exactly (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL,
LLaVA-OneVision) give each row's own logits under eager and sdpa attention.
"""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.batching.attention_layers import check_packing
from mmpipe.errors import PackingUnsupportedError
from mmpipe.testing.invariants import assert_packed_logits_match

pytestmark = pytest.mark.needs_env("tf457")

PACKS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision")


def _rows(proc, counts=(0, 2, 1)):
    rows = []
    for k, n in enumerate(counts):
        images = [testing.tiny_image(40 + 19 * i, 56 + 9 * k, seed=5 * k + i) for i in range(n)]
        content = [{"type": "image"}] * n + [{"type": "text", "text": f"row {k}: what is here?"}]
        raw = {"messages": [{"role": "user", "content": content},
                            {"role": "assistant", "content": [{"type": "text", "text": "a thing" + " too" * k}]}],
               "images": images}
        rows.append(mmpipe.encode_row(raw, proc))
    return rows


def test_the_line_is_4_57():
    import transformers

    assert transformers.__version__.startswith("4.57")


def test_glm4v_packing_is_refused_on_4x():
    """Before: check_packing passed, PackingCollator(model=...) was built, and the forward of its
    pack raised transformers' RuntimeError (expand of the [4, 1, T] positions) - no typed error,
    no fix named."""
    proc, model = testing.build_processor("glm4v"), testing.build_model("glm4v")
    rows = _rows(proc)
    for given in (model, model.config, model.config.to_dict()):
        with pytest.raises(PackingUnsupportedError, match=r"transformers 4\.57.*transformers>=5.*mmpipe\.Collator"):
            check_packing(given)
        with pytest.raises(PackingUnsupportedError, match="glm4v"):
            mmpipe.PackingCollator(proc, model=given)
    with pytest.raises(PackingUnsupportedError, match="glm4v"):
        mmpipe.pack(rows, processor=proc, model=model)
    # the refusal is needed: the pack (built here as transformers 5 would allow it; without the model
    # 4.x refuses it too, tests/batching/test_hunt_tf457b_packing.py) does not run on 4.57's class
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("mmpipe.batching.attention_layers.transformers_version", lambda: (5, 0))
        packed = mmpipe.pack(rows, processor=proc)
    with pytest.raises(RuntimeError, match="expand"), torch.no_grad():
        model(**packed.model_inputs(labels=False))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", PACKS)
def test_packs_equal_each_row_alone(family, attn):
    """Guard: the families 4.57 packs give each row its own logits (checked collator, eager and
    sdpa attention), rows with 0..2 images."""
    proc, model = testing.build_processor(family), testing.build_model(family)
    model.set_attn_implementation(attn)
    collator = mmpipe.PackingCollator(proc, model=model)
    assert collator.layers.attn_implementation == attn
    rows = _rows(proc)
    assert_packed_logits_match(model, rows, proc, packed=collator(rows), rtol=0, atol=1e-4)
