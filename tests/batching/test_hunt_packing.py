"""Packing as users drive it: the sampler's ``oversize="alone"`` rows through a
``PackingCollator`` with the same budget, budgets refused when the packer is built, and packs of
odd shapes (1- and 2-token rows beside multi-image rows, the budget hit exactly) exact on the
real tiny models of a patch-grid and a tiled family."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.batching.packing import PackingCollator, pack
from mmpipe.batching.sampler import TokenBudgetBatchSampler
from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing.invariants import assert_pack_roundtrip

from conftest import processor_for


def _raw(n_images: int, k: int, answer: bool = True) -> dict:
    content = [{"type": "text", "text": f"Row {k}: look " + "very " * (7 * k)}]
    for j in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" image {j}."}]
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": "fine " * (k + 1)})
    return {"messages": msgs,
            "images": [testing.tiny_image(40 + 30 * j, 60 + 11 * k, seed=10 * k + j) for j in range(n_images)]}


def _head(row: MultiModalInputs, m: int) -> MultiModalInputs:
    """The first ``m`` tokens of a text-only row (a 1- or 2-token row)."""
    d = dict(row.__dict__)
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "labels", "position_ids"):
        if d.get(key) is not None:
            d[key] = np.asarray(d[key])[..., :m].copy()
    return MultiModalInputs(**d)


def test_sampler_oversize_alone_rows_pack_with_oversize_alone():
    """TokenBudgetBatchSampler(oversize="alone") hands a row over max_tokens out alone; a
    PackingCollator with the same budget refused that batch mid-epoch, its fix naming the very
    sampler in use. The collator's oversize="alone" packs it; a 2-row pack over the budget is
    still refused, and the default's error now says what to do."""
    proc = processor_for("qwen2_vl")
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": "hi " * k},
                                            {"role": "assistant", "content": "ok"}]}, proc) for k in (2, 3, 40, 4)]
    lengths = [r.num_tokens for r in rows]
    budget = 40
    assert lengths[2] > budget and lengths[1] == budget  # one row over, one exactly at the budget
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=budget, cost="packed", oversize="alone", shuffle=False)
    collator = PackingCollator(proc, max_tokens=budget, oversize="alone")
    seen = []
    for idx in sampler:
        packed = collator([rows[i] for i in idx])
        assert packed.num_tokens <= budget or len(idx) == 1
        assert_pack_roundtrip([rows[i] for i in idx], packed=packed)
        seen += idx
    assert sorted(seen) == [0, 1, 2, 3]
    with pytest.raises(InputError, match=r"over the pack budget max_tokens=40.*oversize='alone'"):
        PackingCollator(proc, max_tokens=budget)([rows[2]])
    with pytest.raises(InputError, match=r"2 rows hold .* over the pack budget"):
        collator([rows[0], rows[1]])
    assert pack([rows[2]], processor=proc, max_tokens=budget, oversize="alone").num_tokens == lengths[2]


@pytest.mark.parametrize("kw, match", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1 or None"),
    (dict(max_tokens=-5), "max_tokens must be an integer >= 1 or None"),
    (dict(max_tokens="4096"), "max_tokens must be an integer >= 1 or None"),  # was a TypeError per batch
    (dict(max_images=-1), "max_images must be an integer >= 0 or None"),
    (dict(oversize="skip"), "oversize must be 'raise' or 'alone'"),
])
def test_bad_budgets_are_refused_when_the_packer_is_built(kw, match):
    """A budget of 0 / -5 made every batch fail as 'over the pack budget', the fix suggesting a
    sampler with that budget (which refuses it); now refused at construction."""
    proc = processor_for("qwen2_vl")
    with pytest.raises(ArgumentError, match=match):
        PackingCollator(proc, **kw)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc)
    with pytest.raises(ArgumentError, match=match):
        pack([row], processor=proc, **kw)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "glm4v", "llava_onevision"])
def test_odd_packs_equal_each_row_alone_on_the_real_model(family):
    """1- and 2-token rows between rows with 0 and 2 images and lengths 1..160, packed to exactly
    max_tokens: per-token logits equal each row alone, the packed loss the padded batch's, and no
    row's first token is a target."""
    proc, model = testing.build_processor(family), testing.build_model(family)
    model.set_attn_implementation("eager")
    base = [mmpipe.encode_row(_raw(n, k), proc) for k, n in enumerate([0, 2, 1, 0, 2])]
    one, two = _head(base[0], 1), _head(base[0], 2)
    rows = [one, base[1], two, base[3], base[2], one, base[4], base[0]]
    total = sum(r.num_tokens for r in rows)
    packed = pack(rows, processor=proc, max_tokens=total)
    cu = packed.cu_seqlens.long()
    assert (packed.labels[0, cu[:-1]] == IGNORE_INDEX).all()
    text_pos = packed.position_ids.reshape(-1, total)[0]  # [4, 1, T] row 0, or [1, T]
    assert text_pos[cu[:-1]].tolist() == [0] * len(rows)
    with torch.no_grad():
        out = model(**packed.model_inputs())
        for k, (got, r) in enumerate(zip(packed.split(out.logits), rows)):
            alone = model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0]
            torch.testing.assert_close(got, alone, rtol=0, atol=1e-4, msg=lambda m, k=k: f"row {k}: {m}")
        padded = mmpipe.collate(rows, processor=proc, padding_side="right")
        torch.testing.assert_close(out.loss, model(**padded.model_inputs()).loss, rtol=1e-5, atol=1e-5)
