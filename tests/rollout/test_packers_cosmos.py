"""mmpipe's packers against the real cosmos-rl 0.4.7 package (scripts/envs/cosmos.sh:
transformers 4.57, cosmos-rl installed with --no-deps plus its import dependencies).

- the packers subclass cosmos-rl's BaseDataPacker, and cosmos-rl's own ``init_data_packer``
  (comm/base.py) builds them with no arguments through ``get_default_data_packer`` and sets
  them up from a real cosmos-rl ``Config``;
- cosmos-rl's own ``compute_logprobs`` reading our ``logprob_masks`` scores every sample's
  response tokens with the rollout's logprobs (6/6), where the unshifted label mask scores
  0/6, and our masks equal the masks cosmos-rl's own Qwen2.5-VL packer builds for the same
  samples;
- our rollout inputs pass cosmos-rl's ``decode_vision_info`` (what its vLLM rollout runs on
  every VLM prompt) and decode to the stored resized images.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.images import row_images, vision_spec_for
from mmpipe.rollout.packers import DataPackerCore, QwenVLDataPacker, register_with_cosmos
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from test_packers import vl_items

pytestmark = pytest.mark.needs_env("cosmos")
FAMILY = "qwen2_5_vl"  # cosmos-rl ships a Qwen2.5-VL packer to compare with


def cosmos_config(model_dir):
    from cosmos_rl.policy.config import Config

    return Config.from_dict({"train": {"train_policy": {"type": "grpo"}, "output_dir": str(model_dir / "out")},
                             "policy": {"model_name_or_path": str(model_dir)}})


@pytest.fixture
def model_dir(tmp_path):
    """A Qwen2.5-VL model directory as cosmos-rl reads it: config.json + the processor's files."""
    model_for(FAMILY).config.save_pretrained(tmp_path)
    processor_for(FAMILY).save_pretrained(tmp_path)
    return tmp_path


def test_cosmos_builds_and_sets_up_our_packer(model_dir):
    from cosmos_rl.comm.base import CommMixin
    from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker

    assert issubclass(QwenVLDataPacker, BaseDataPacker)
    register_with_cosmos(QwenVLDataPacker, [FAMILY])
    host = types.SimpleNamespace(config=cosmos_config(model_dir), _attach_payload_transport=lambda: None)
    # cosmos-rl's own worker code: get_default_data_packer(model_type) -> cls(), then setup(config)
    CommMixin.init_data_packer(host)
    for packer in (host.data_packer, host.val_data_packer):
        assert type(packer) is QwenVLDataPacker and isinstance(packer, BaseDataPacker)
        assert packer.config is host.config and packer.encoder.family.name == FAMILY
        assert packer.tool_agent is None  # multi-turn off in the config
        assert packer.get_rollout_input("hi")["prompt_token_ids"]
    # a user-provided instance passes comm/base.py's check; a class without the base does not
    CommMixin.init_data_packer(host, data_packer=QwenVLDataPacker())
    assert host.data_packer.processor is not None
    with pytest.raises(ValueError, match="BaseDataPacker instance"):
        CommMixin.init_data_packer(host, data_packer=DataPackerCore())


def _cosmos_packer(proc, model):
    """cosmos-rl's own Qwen2_5_VLM_DataPacker with this processor (what its setup() loads
    from a model directory with AutoProcessor / AutoConfig)."""
    from cosmos_rl.dispatcher.data.packer import Qwen2_5_VLM_DataPacker

    cp = Qwen2_5_VLM_DataPacker()
    cp.hf_processor, cp.tokenizer, cp.hf_config = proc, proc.tokenizer, model.config
    cp.image_token_id, cp.video_token_id = model.config.image_token_id, model.config.video_token_id
    cp.vision_ids = [cp.image_token_id, cp.video_token_id]
    return cp


def test_cosmos_compute_logprobs_reads_our_masks_6_of_6():
    from cosmos_rl.utils.util import compute_logprobs

    proc, model = processor_for(FAMILY), model_for(FAMILY)
    packer = QwenVLDataPacker(proc)
    items = vl_items()
    gens = TransformersEngine(model, proc).generate([packer.encode_prompt(it) for it in items],
                                                    SamplingParams(max_new_tokens=5, n=2, temperature=1.0, seed=0))
    samples = [(it, c) for it, g in zip(items, gens) for c in g.completions]
    assert len(samples) == 6
    policy = [packer.get_policy_input(it, list(c.token_ids)) for it, c in samples]
    batch = packer.policy_collate_fn(policy, packer.policy_compute_max_len(policy))
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in packer.model_keys(batch)}).logits.float()

    def n_correct(mask):
        logps, cu, _ = compute_logprobs(batch["input_ids"], mask, logits, is_full_logits=True)
        ok = 0
        for b, (_, c) in enumerate(samples):
            got = logps[cu[b]:cu[b + 1]].numpy()
            ok += len(got) == len(c.token_ids) and np.allclose(got, np.asarray(c.logprobs), atol=1e-4)
        return ok

    assert n_correct(batch["logprob_masks"]) == 6
    # the label mask itself, unshifted (what the packers returned before): no sample right
    labels = torch.tensor(np.stack([np.pad(r.labels, (0, batch["input_ids"].shape[1] - r.num_tokens),
                                           constant_values=-100) for r in policy]))
    assert n_correct(labels != -100) == 0

    # cosmos-rl's own Qwen2.5-VL packer on the same samples builds the same ids and masks
    cp = _cosmos_packer(proc, model)
    convs = [[{"role": "user", "content": it}] if isinstance(it, str) else it for it, _ in samples]
    theirs = [cp.get_policy_input(conv, list(c.token_ids)) for conv, (_, c) in zip(convs, samples)]
    L = batch["input_ids"].shape[1]
    their_mask = torch.zeros_like(batch["logprob_masks"])
    for b, (t, row) in enumerate(zip(theirs, policy)):
        n = row.num_tokens
        assert t["input_ids"] == batch["input_ids"][b, :n].tolist()
        their_mask[b, :n] = torch.tensor(t["logprob_masks"][:n], dtype=torch.bool)
        assert not any(t["logprob_masks"][n:])
    assert torch.equal(their_mask, batch["logprob_masks"])
    assert n_correct(their_mask) == 6 and L == packer.policy_compute_max_len(policy)
    # (cosmos-rl's own VL collate refuses this batch: it needs all rows or none to hold images)
    with pytest.raises(AssertionError, match="pixel_values should be None"):
        cp.policy_collate_fn(theirs, cp.policy_compute_max_len(theirs))


def test_rollout_inputs_pass_cosmos_decode_vision_info():
    from cosmos_rl.utils.util import decode_vision_info

    proc = processor_for(FAMILY)
    packer = QwenVLDataPacker(proc)
    items = vl_items()
    prompts = packer.rollout_collate_fn([packer.get_rollout_input(it) for it in items])
    decoded = decode_vision_info(prompts)
    for it, p, d in zip(items, prompts, decoded):
        row = packer.encode_prompt(it)
        assert d["prompt_token_ids"] == p["prompt_token_ids"]
        if row.num_images:
            want = row_images(row, vision_spec_for(proc, row.fam))
            got = d["multi_modal_data"]["image"]
            assert len(got) == len(want) == row.num_images
            for g, w in zip(got, want):
                assert g.size == w.size and np.array_equal(np.asarray(g.convert("RGB")), np.asarray(w))
            assert d["mm_processor_kwargs"] == p["mm_processor_kwargs"]
        else:
            assert "multi_modal_data" not in d


def test_readme_block_runs_as_written(model_dir):
    from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker

    from helpers import readme_block

    proc, model = processor_for(FAMILY), model_for(FAMILY)
    items = vl_items()
    gens = TransformersEngine(model, proc).generate([QwenVLDataPacker(proc).encode_prompt(it) for it in items],
                                                    SamplingParams(max_new_tokens=4))
    ns = {"config": cosmos_config(model_dir), "items": items,
          "completion_ids": [list(g.completions[0].token_ids) for g in gens]}
    exec(compile(readme_block("## cosmos-rl"), "README.md", "exec"), ns)
    assert type(BaseDataPacker.get_default_data_packer(FAMILY)) is QwenVLDataPacker
    assert len(ns["prompts"]) == 3 and ns["masks"].shape == ns["batch"]["input_ids"].shape
    assert ns["masks"].sum(1).tolist() == [len(c) for c in ns["completion_ids"]]
