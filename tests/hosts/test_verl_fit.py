"""verl 0.9.1's own ``RayPPOTrainer.fit()`` on mmpipe rows (`verl_prompt_rows`), run from verl's
installed code in fit()'s order: ``_get_gen_batch`` -> ``repeat`` -> the agent loop
(``AgentLoopWorker.generate_sequences`` -> ``SingleTurnAgentLoop.run`` -> verl's postprocess:
tokenize, ``multi_modal_inputs``, positions) -> ``batch.union`` -> ``compute_response_mask`` ->
``extract_reward`` -> ``_compute_old_log_prob`` (``to_tensordict`` / ``left_right_2_no_padding`` ->
``TrainingWorker.infer_batch`` -> ``FSDPEngineWithLMHead.forward_step``) -> ``compute_advantage``
(GRPO) -> ``_update_actor`` (``TrainingWorker.train_mini_batch`` -> ``ppo_loss`` -> optimizer step),
two optimizer steps. What is replaced and why (no CPU LLM server replica, no CPU FSDP engine, no
Ray): tests/hosts/verl_fit_steps.py.
"""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.hosts.verl import verl_prompt_rows, verl_rows

from conftest import model_for, processor_for
from verl_fit_steps import HFServer, Trainer, agent_worker, cpu_world, fit_tail, rule_reward, verl_config

pytestmark = pytest.mark.needs_env("verl")

KEEP = ["prompt", "data_source", "reward_model", "extra_info"]
PL, RL = 256, 6  # rollout.prompt_length, response_length


def _source(n=3):
    return [{"prompt": [{"role": "user", "content": "<image>" * (i % 2 + 1) + f"What is in picture {i}?"}],
             "images": [mmpipe.testing.tiny_image(40 + 8 * j, 56 + 8 * i, seed=i + j) for j in range(i % 2 + 1)],
             "data_source": "toy", "reward_model": {"ground_truth": str(i), "style": "rule"},
             "extra_info": {"index": i, "split": "train"}} for i in range(n)]


def _same_as_verls_dataset(rows, tmp_path):
    """verl's own RLHFDataset.__getitem__ on the source rows: the same keys and values, the same
    messages; only the images differ (verl's hold the source files, ours mmpipe's resized ones)."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    datasets.Dataset.from_list(_source()).to_parquet(tmp_path / "train.parquet")
    proc = processor_for("qwen2_vl")
    cfg = OmegaConf.create({"prompt_key": "prompt", "image_key": "images", "max_prompt_length": PL,
                            "filter_overlong_prompts": False})
    theirs = RLHFDataset(data_files=[str(tmp_path / "train.parquet")], tokenizer=proc.tokenizer, processor=proc,
                         config=cfg)
    assert len(theirs) == len(rows)

    def shape(messages):
        return [(m["role"], [(c["type"], c.get("text")) for c in m["content"]]) for m in messages]

    for i, ours in enumerate(rows):
        ref = theirs[i]
        assert set(ref) == set(ours)
        assert torch.equal(ref["dummy_tensor"], ours["dummy_tensor"])
        assert shape(ref["raw_prompt"]) == shape(ours["raw_prompt"]) == shape(ours["prompt"])
        for k in set(ref) - {"raw_prompt", "prompt", "dummy_tensor"}:
            assert ref[k] == ours[k], k


def test_verl_fit_data_path_runs_on_mmpipe_rows(tmp_path):
    import datasets
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class
    from verl.workers.utils.padding import left_right_2_no_padding

    import mmpipe.hosts.verl as host

    proc = processor_for("qwen2_vl")
    model = copy.deepcopy(model_for("qwen2_vl")).eval()  # trained below: not the shared cached model
    # what the user writes (docs/how-to/verl.md runs the same calls as a block, in the verl environment)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(_source()), proc, labels=False, keep_columns=KEEP)
    rows = verl_prompt_rows(enc, proc, keep_columns=KEEP)
    assert len(rows) == 3
    _same_as_verls_dataset(rows, tmp_path)
    recs = [mmpipe.MultiModalInputs.from_dict(r) for r in enc]
    ours = verl_rows(enc, proc, max_prompt_length=PL)  # mmpipe's ids / positions / pixels, verl's layout

    cfg = verl_config(prompt_length=PL, response_length=RL, n=2)
    batch = DataProto.from_single_dict(collate_fn(rows))  # fit(): batch_dict -> DataProto
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # uses no trainer state
    gen_batch = gen_batch.repeat(repeat_times=2, interleave=True)
    # the config a user writes: data.custom_cls -> MMPipeRLHFDataset, loaded by verl from the file
    dataset_cls = get_dataset_class(cfg.data.__class__({"custom_cls": {"path": host.__file__,
                                                                        "name": "MMPipeRLHFDataset"}}))
    assert dataset_cls.__name__ == "MMPipeRLHFDataset"
    vision = [v for v in mmpipe.families.resolve_family(proc).vision_token_ids(proc.tokenizer).values() if v is not None]
    worker = agent_worker(proc, model, cfg, HFServer(model, proc, length=RL, banned=vision), dataset_cls=dataset_cls)
    gen_out = asyncio.run(worker.generate_sequences(gen_batch))
    batch = batch.repeat(repeat_times=2, interleave=True).union(gen_out)  # fit()'s union
    batch.batch["response_mask"] = compute_response_mask(batch)
    td = left_right_2_no_padding(batch.to_tensordict())  # _compute_old_log_prob's steps 1-2
    assert td is not None

    # the rollout saw mmpipe's ids and images
    calls = worker.llm_client.calls  # concurrent tasks: in any order
    assert sorted(map(len, (c["prompt_ids"] for c in calls))) == sorted(r.num_tokens for r in recs for _ in "ab")
    for call in calls:
        i = [r.input_ids.tolist() for r in recs].index(call["prompt_ids"])  # mmpipe's expanded prompt
        assert torch.equal(call["pixel_values"], ours[i]["multi_modal_inputs"]["pixel_values"])
    ids, am, pos = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"]
    for j in range(len(batch)):
        mine = ours[j // 2]
        valid = mine["attention_mask"].bool()
        assert torch.equal(ids[j, :PL], mine["input_ids"]) and torch.equal(am[j, :PL], mine["attention_mask"])
        assert torch.equal(pos[j, :, :PL][:, valid], mine["position_ids"][:, valid])  # mmpipe's M-RoPE
        mmi = batch.non_tensor_batch["multi_modal_inputs"][j]
        for key in ("pixel_values", "image_grid_thw", "images_seqlens"):
            assert torch.equal(mmi[key], mine["multi_modal_inputs"][key]), key
        pad = ~am[j].bool()
        assert bool((pos[j, 0][pad] == 1).all()) and bool((pos[j, 1:][:, pad] == 0).all())  # verl's pads

    # old log-probs: an HF forward on verl's batch tensors (verl's engine worker replaced), against
    # (a) the same forward with the model's own positions and pixels from the images (a control:
    # equal data give gap 0) and (b) the rollout's log-probs (generate with a KV cache)
    def logprobs(j, **kw):
        resp = batch.batch["responses"][j]
        v = am[j].bool()
        logits = model(input_ids=ids[j][v][None], attention_mask=am[j][v][None], **kw).logits[0].float()
        return torch.log_softmax(logits[-RL - 1:-1], -1).gather(-1, resp[:, None])[:, 0]

    data_gap, rollout_gap = 0.0, 0.0
    with torch.no_grad():
        for j in range(len(batch)):
            mmi = batch.non_tensor_batch["multi_modal_inputs"][j]
            v = am[j].bool()
            old = logprobs(j, position_ids=pos[j][:, v][:, None], pixel_values=mmi["pixel_values"],
                           image_grid_thw=mmi["image_grid_thw"])
            mine = ours[j // 2]["multi_modal_inputs"]
            mm_types = (ids[j][v] == model.config.image_token_id).long()[None]
            control = logprobs(j, pixel_values=mine["pixel_values"], image_grid_thw=mine["image_grid_thw"],
                               mm_token_type_ids=mm_types)
            data_gap = max(data_gap, (old - control).abs().max().item())
            rollout_gap = max(rollout_gap, (old - batch.batch["rollout_log_probs"][j]).abs().max().item())
    # verl's actor step: FSDPEngineWithLMHead.forward_step (prepare_model_inputs -> module ->
    # prepare_model_outputs) on _compute_old_log_prob's tensordict, the FSDP wrap replaced by the
    # bare model on CPU (fp32, no remove-padding: sdpa/eager attention, no flash-attn)
    engine_lp = _engine_log_probs(model, td)
    engine_gap = engine_rollout_gap = 0.0
    for j in range(len(batch)):
        lp = engine_lp[j]  # [prompt+response valid tokens]: log p(token t+1 | ..t)
        n_resp = int(batch.batch["response_mask"][j].sum())
        with torch.no_grad():
            mmi = batch.non_tensor_batch["multi_modal_inputs"][j]
            v = am[j].bool()
            old = logprobs(j, position_ids=pos[j][:, v][:, None], pixel_values=mmi["pixel_values"],
                           image_grid_thw=mmi["image_grid_thw"])
        engine_rollout_gap = max(engine_rollout_gap,
                                 (lp[-RL - 1:-1] - batch.batch["rollout_log_probs"][j]).abs().max().item())
        engine_gap = max(engine_gap, (lp[-RL - 1:-1] - old).abs().max().item())
        assert n_resp == RL
    print(f"verl engine forward_step vs HF forward gap {engine_gap:.3g}; old-log-prob (engine) vs rollout "
          f"log-prob gap {engine_rollout_gap:.3g}")
    assert engine_rollout_gap < 5e-3
    rmpad = _engine_log_probs(model, td, remove_padding=True)  # verl's default: packed, no mask
    rmpad_gap = max((a - b).abs().max().item() for a, b in zip(rmpad, engine_lp))
    print(f"verl engine remove-padding vs padded gap {rmpad_gap:.3g}")
    assert rmpad_gap < 1e-5
    assert engine_gap < 1e-5
    print(f"old-log-prob vs control gap {data_gap:.3g}; vs rollout (HF generate) gap {rollout_gap:.3g}")
    assert data_gap == 0.0
    assert rollout_gap < 5e-3

    # fit() on from the reward: verl's own extract_reward -> _compute_old_log_prob -> compute_advantage
    # (GRPO) -> _update_actor (ppo_epochs=2: two optimizer steps on the whole batch)
    with cpu_world(tmp_path):
        trainer = Trainer(cfg, model)
        before = [p.detach().clone() for p in model.parameters()]
        batch.batch["rm_scores"] = rule_reward(batch, lambda toks: float(sum(t % 5 for t in toks)))
        batch, metrics = fit_tail(trainer, batch)
    fit_gap = ((batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]).abs()
               * batch.batch["response_mask"]).max().item()
    moved = max((p.detach() - b).abs().max().item() for p, b in zip(model.parameters(), before))
    print(f"fit: old_log_probs vs rollout gap {fit_gap:.3g}; pg_loss {metrics['actor/pg_loss']}; "
          f"grad_norm {metrics['actor/grad_norm']}; max weight change {moved:.3g}")
    assert fit_gap < 5e-3
    adv = batch.batch["advantages"]
    assert torch.isfinite(adv).all() and bool(adv.abs().sum() > 0)
    assert len(metrics["actor/grad_norm"]) == 2 and all(g > 0 for g in metrics["actor/grad_norm"])
    assert all(np.isfinite(x) for x in np.ravel(metrics["actor/pg_loss"])) and moved > 0


def _engine_log_probs(model, td, remove_padding=False):
    import verl.workers.engine.fsdp.transformer_impl as impl
    from omegaconf import OmegaConf
    from verl.utils import tensordict_utils as tu

    eng = impl.FSDPEngineWithLMHead.__new__(impl.FSDPEngineWithLMHead)
    eng.module, eng._autocast_dtype, eng.pad_to_length, eng.use_ulysses_sp = model, torch.float32, None, False
    eng.compute_entropy_from_logits = __import__("verl.utils.torch_functional", fromlist=["x"]).entropy_from_logits
    eng._get_packed_pad_size = lambda n: 0
    eng.engine_config = OmegaConf.create({"entropy_checkpointing": False, "entropy_from_logits_with_chunking": False})
    td = td.clone()
    tu.assign_non_tensor(td, use_remove_padding=remove_padding, calculate_entropy=True, compute_loss=False,
                         temperature=1.0)
    saved = impl.get_device_id, impl.get_device_name
    impl.get_device_id = impl.get_device_name = lambda: "cpu"
    try:
        with torch.no_grad():
            _, out = eng.forward_step(td, loss_function=None, forward_only=True)
    finally:
        impl.get_device_id, impl.get_device_name = saved
    lp = out["model_output"]["log_probs"]
    return [t for t in lp.unbind()] if lp.is_nested else list(lp)


def test_prompt_rows_errors_name_the_fix():
    import datasets

    from mmpipe.errors import ArgumentError

    proc = processor_for("qwen2_vl")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(_source(2)), proc, labels=False, keep_columns=KEEP)
    with pytest.raises(ArgumentError, match="keep_columns"):
        verl_prompt_rows(enc, proc, keep_columns=["data_source"])  # no prompt column kept
    bad = [dict(r, prompt=[{"role": "user", "content": "no placeholder here"}]) for r in enc]
    with pytest.raises(ArgumentError, match="row 0: the prompt places 0 images"):
        verl_prompt_rows(bad, proc, keep_columns=KEEP)
    # a string prompt and content-list prompts place the images as verl's _build_messages does
    lst = [dict(r, prompt=[{"role": "user", "content": [{"type": "image"}] * (i + 1) + [{"type": "text", "text": "q"}]}])
           for i, r in enumerate(enc)]
    out = verl_prompt_rows(lst, proc, keep_columns=KEEP)
    assert [[c["type"] for c in o["raw_prompt"][0]["content"]] for o in out] == [["image", "text"],
                                                                                  ["image", "image", "text"]]


def test_dataset_class_reads_mmpipe_encoded_rows(tmp_path):
    """``MMPipeRLHFDataset`` built as verl builds ``data.custom_cls`` (``data_files``, tokenizer,
    config, processor) on a parquet file of mmpipe-ENCODED rows: each item is `verl_prompt_rows`' dict
    (the images mmpipe resized, the kept columns), the overlong filter reads ``input_ids``, the items
    collate with verl's ``collate_fn``; a raw verl parquet still goes verl's own way."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    import mmpipe.hosts.verl as host

    proc = processor_for("qwen2_vl")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(_source()), proc, labels=False, keep_columns=KEEP)
    enc.to_parquet(tmp_path / "encoded.parquet")
    datasets.Dataset.from_list(_source()).to_parquet(tmp_path / "raw.parquet")
    cls = get_dataset_class(OmegaConf.create({"custom_cls": {"path": host.__file__, "name": "MMPipeRLHFDataset"}}))

    def build(name, max_len=PL):
        cfg = OmegaConf.create({"prompt_key": "prompt", "image_key": "images", "max_prompt_length": max_len,
                                "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1,
                                "cache_dir": str(tmp_path / "cache")})
        return cls(data_files=[str(tmp_path / name)], tokenizer=proc.tokenizer, processor=proc, config=cfg)

    ds, want = build("encoded.parquet"), verl_prompt_rows(enc, proc, keep_columns=KEEP)
    assert len(ds) == 3
    for i, ref in enumerate(want):
        got = ds[i]
        assert set(got) == set(ref) and got["extra_info"] == ref["extra_info"] and got["index"] == i
        images = [c["image"] for m in got["raw_prompt"] for c in m["content"] if c["type"] == "image"]
        ref_images = [c["image"] for m in ref["raw_prompt"] for c in m["content"] if c["type"] == "image"]
        assert [np.asarray(a).tolist() for a in images] == [np.asarray(b).tolist() for b in ref_images]
    batch = collate_fn([ds[i] for i in range(len(ds))])
    assert list(batch["index"]) == [0, 1, 2] and batch["dummy_tensor"].shape == (3, 1)
    lengths = [len(r["input_ids"]) for r in enc]
    short = build("encoded.parquet", max_len=sorted(lengths)[1])  # the overlong filter on stored ids
    assert len(short) == sum(n <= sorted(lengths)[1] for n in lengths) < 3
    raw = build("raw.parquet")  # verl's own path: source images, its own filter
    assert len(raw) == 3 and set(raw[0]) == set(want[0])
