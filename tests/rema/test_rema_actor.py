"""ReMA's actor with images (`mmpipe.rema.actor`): the forward is called as ReMA's
``DataParallelReMAPPOActor`` calls ``_forward_micro_batch`` (ReMA-public
``verl/workers/actor/dp_rema_actor.py``; ReMA's verl fork needs flash-attn and CUDA, so it is
not imported here: the micro batch is the dict its actor builds, ``{**DataProto.batch,
**DataProto.non_tensor_batch}`` after ``merge_roles_data`` and ``select(['input_ids', 'labels',
'attention_mask', 'position_ids'] (+ 'old_log_probs', 'advantages', 'step_ids'),
['multi_modal_inputs'])``), and its log-probs, entropy and PPO loss equal mmpipe's own model
forward on the same batch."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from mmpipe import rema
from mmpipe.errors import ArgumentError, InputError

from conftest import model_for, processor_for
from helpers import readme_block, tiny_text_model
from test_rema import FLAG, ScriptedEngine, _questions

ROLES = ["meta", "reasoning"]
SYSTEM = {"meta": "Plan.", "reasoning": "Solve."}


def _batch(proc, images=(1, 0, 2), n=3):
    qs, _ = _questions(n, images=images)
    engine = ScriptedEngine(proc, lambda row, turn: (f"answer {row} turn {turn} is {row + turn}", "stop"))
    return rema.rollout(qs, engine, proc, agent_roles=ROLES, max_num_turns=2, finish_flag=FLAG,
                        system_prompts=SYSTEM)


@pytest.fixture(scope="module")
def vision():
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    return _batch(proc), model


def _actor(model):
    """A stand-in for ReMA's actor instance: the attributes its forward reads."""
    return rema.patch_actor(types.SimpleNamespace(actor_module=model, use_ulysses_sp=False))


def _direct(model, batch, role, temperature):
    """mmpipe's own forward of one role: (entropy, log_probs at the shifted labels, 0 at -100)."""
    logits = model(**batch.model_inputs(role)).logits.float() / temperature
    logp = torch.log_softmax(logits, -1)
    labels = batch.batch[f"{role}_labels"]
    lp = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * (labels != -100)
    return -(logp.exp() * logp).sum(-1), lp


def _masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def _rema_pg_loss(old_log_prob, log_prob, advantages, mask, clip=0.2, clip_c=3.0, log_ratio_clip_c=3.0):
    """ReMA's ``compute_policy_loss`` (agg_mode='token', clip_mode='token'), restated: a
    clipped log-ratio, the PPO clip and the dual clip for negative advantages, a token mean."""
    log_ratio = torch.clamp(log_prob - old_log_prob, max=log_ratio_clip_c)
    ratio = torch.exp(log_ratio)
    clipped = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip))
    dual = torch.minimum(-advantages * clip_c, clipped)
    return _masked_mean(torch.where(advantages < 0, dual, clipped), mask)


def test_compute_log_prob_path_equals_mmpipe_forward(vision):
    """ReMA's ``_compute_log_prob``: micro batches of the merged roles, ``no_grad``, temperature
    from meta_info; rows with 0, 1 and 2 images; log-probs and entropy [b, L] as mmpipe's."""
    batch, model = vision
    assert [int(g) for g in np.diff(batch.image_offsets.numpy())] == [1, 0, 2]
    actor, T = _actor(model), 0.7
    merged = rema.actor_micro_batch(batch)
    B, L = len(batch), batch.batch["meta_input_ids"].shape[1]
    assert merged["position_ids"].shape == (2 * B, 3, L) and len(merged["multi_modal_inputs"]) == 2 * B
    out_e, out_lp = [], []
    with torch.no_grad():
        for s in range(0, 2 * B, 2):   # DataProto.chunk: tensors and the object array sliced alike
            mb = {k: v[s:s + 2] for k, v in merged.items()}
            e, lp = actor._forward_micro_batch(mb, temperature=T)
            assert e.shape == lp.shape == (len(mb["input_ids"]), L)
            out_e.append(e)
            out_lp.append(lp)
        want = [_direct(model, batch, r, T) for r in ROLES]
    entropy, log_probs = torch.cat(out_e), torch.cat(out_lp)
    labels = merged["labels"]
    torch.testing.assert_close(log_probs, torch.cat([w[1] for w in want]), rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy, torch.cat([w[0] for w in want]), rtol=0, atol=2e-5)
    assert torch.all(log_probs[labels == -100] == 0) and torch.all(log_probs[labels != -100] < 0)
    # the images reach the forward: other pixels change the rows that have images, not the others
    moved = {k: v for k, v in merged.items()}
    moved["multi_modal_inputs"] = np.array([dict(d, pixel_values=torch.flip(d["pixel_values"], dims=[1]))
                                            for d in merged["multi_modal_inputs"]], dtype=object)
    with torch.no_grad():
        _, lp2 = actor._forward_micro_batch(moved, temperature=T)
    changed = [not torch.allclose(lp2[i], log_probs[i]) for i in range(2 * B)]
    assert changed == [True, False, True] * 2


def test_positions_in_either_layout_and_the_text_family():
    batch, model = _batch(processor_for("qwen2_vl"), images=(2, 1), n=2), model_for("qwen2_vl")
    actor = _actor(model)
    mb = rema.actor_micro_batch(batch, roles=["reasoning"])
    with torch.no_grad():
        e1, lp1 = actor._forward_micro_batch(mb, temperature=1.0)
        e2, lp2 = actor._forward_micro_batch(dict(mb, position_ids=mb["position_ids"].transpose(0, 1)), 1.0)
        none, lp3 = actor._forward_micro_batch(mb, 1.0, calculate_entropy=False)
    assert torch.equal(lp1, lp2) and torch.equal(e1, e2) and torch.equal(lp1, lp3) and none is None
    # text: [b, L] positions, no multi_modal_inputs
    from mmpipe import testing

    tok = testing.build_tokenizer("qwen2_vl")
    tmodel = tiny_text_model(len(tok))
    tbatch = _batch(tok, images=(0,), n=2)
    tmb = rema.actor_micro_batch(tbatch)
    assert tmb["position_ids"].dim() == 2 and "multi_modal_inputs" not in tmb
    with torch.no_grad():
        _, lp = _actor(tmodel)._forward_micro_batch(tmb, temperature=1.0)
        want = torch.cat([_direct(tmodel, tbatch, r, 1.0)[1] for r in ROLES])
    torch.testing.assert_close(lp, want, rtol=0, atol=1e-5)


def test_update_policy_loss_equals_mmpipe_loss_and_gradients_flow(vision):
    """ReMA's ``update_policy`` step with old_log_probs = log_probs (ratio 1) and advantages 1:
    -mean(log_probs) over the label mask is mmpipe's loss, and the PPO loss's gradients are
    the gradients of mmpipe's loss (vision tower included)."""
    batch, model = vision
    actor = _actor(model)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for role in ROLES:
            mb = rema.actor_micro_batch(batch, roles=[role])
            label_mask = mb["labels"] != -100
            model.zero_grad(set_to_none=True)
            entropy, log_prob = actor._forward_micro_batch(micro_batch=mb, temperature=1.0)
            pg_loss = _rema_pg_loss(log_prob.detach(), log_prob, torch.ones_like(log_prob), label_mask)
            policy_loss = pg_loss - _masked_mean(entropy, label_mask) * 0.0
            policy_loss.backward()
            ours = [p.grad.clone() for p in params]
            torch.testing.assert_close(pg_loss.detach(), torch.tensor(-1.0))   # ratio 1, advantage 1
            model.zero_grad(set_to_none=True)
            loss = model(**batch.model_inputs(role, labels=True)).loss           # mmpipe's own loss
            torch.testing.assert_close(-_masked_mean(log_prob.detach(), label_mask), loss.detach(),
                                       rtol=1e-6, atol=1e-6)
            loss.backward()
            for p, g in zip(params, ours):
                torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
            vis = [p.grad for p in model.model.visual.parameters()]
            assert any(g is not None and g.abs().sum() > 0 for g in vis)   # the images are in the graph
    finally:
        model.zero_grad(set_to_none=True)


def test_errors_name_the_column_and_the_fix(vision):
    batch, model = vision
    actor = _actor(model)
    mb = rema.actor_micro_batch(batch, roles=["meta"])
    with pytest.raises(InputError, match="multi_modal_inputs.*expected 3 entries"):
        actor._forward_micro_batch(dict(mb, multi_modal_inputs=mb["multi_modal_inputs"][:2]), 1.0)
    with pytest.raises(InputError, match="position_ids"):
        actor._forward_micro_batch(dict(mb, position_ids=mb["position_ids"][:, :2]), 1.0)
    with pytest.raises(InputError, match="labels must be shifted"):
        actor._forward_micro_batch(dict(mb, labels=mb["labels"][:, 1:]), 1.0)
    with pytest.raises(ArgumentError, match="Ulysses"):
        rema.patch_actor(types.SimpleNamespace(actor_module=model, use_ulysses_sp=True))
    with pytest.raises(ArgumentError, match="agent_roles"):
        rema.actor_micro_batch(batch, roles=["critic"])


def test_readme_rema_actor_block_runs_as_written():
    ns: dict = {}
    exec(compile(readme_block("ReMA's actor with images"), "README.md", "exec"), ns)
    batch = ns["batch"]
    L = batch.batch["meta_thinking_labels"].shape[1]
    assert ns["log_probs"].shape == ns["entropy"].shape == (2 * len(batch), L)
    assert ns["actor"]._forward_micro_batch.__func__ is rema.forward_micro_batch
