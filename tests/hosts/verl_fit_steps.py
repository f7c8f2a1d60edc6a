"""Shared by tests/hosts/test_verl_fit.py and test_verl_vrag.py: verl 0.9.1's ``RayPPOTrainer.fit()``
steps run from verl's installed code on CPU, with the parts that cannot run here replaced:

- the LLM server (verl registers vllm / sglang / trtllm replicas only, GPU servers, none
  installed): `HFServer`, a tiny HF model's ``generate`` behind the same
  ``generate(...) -> TokenOutput`` call;
- ``AgentLoopWorker.__init__`` (it loads the processor from a model path with ``hf_processor``,
  which cannot reload the image-only tiny processor): `agent_worker` sets its attributes, the
  processor bound to the model's ``get_rope_index`` exactly as ``hf_processor`` binds it;
- the Ray worker group and the FSDP wrap around the actor (verl registers its FSDP engines for
  cuda / npu only): `Trainer` holds a ``TrainingWorker`` (verl's class, built with ``__new__``)
  over an ``FSDPEngineWithLMHead`` (``__new__``, the bare fp32 model, AdamW, no FSDP), in a
  one-process gloo group; ``RayPPOTrainer._compute_old_log_prob`` / ``_update_actor`` run as
  written on it (``self`` = `Trainer`, its ``actor_rollout_wg`` calling the worker in-process);
- the reward loop worker (a Ray actor): `rule_reward` writes ``rm_scores`` as
  ``AgentLoopOutput.as_dict`` writes a ``reward_score`` (on the last response token).
"""

from __future__ import annotations

import contextlib
import copy
import types
from pathlib import Path

import torch


class HFServer:
    """Stands in for verl's LLMServerClient: the tiny model samples on verl's prompt ids and
    images (seeded per call; vision tokens banned, as ``logit_bias`` would), or returns a scripted
    reply (``script``: one token-id list per call of a request, or ``f(k) -> ids`` for the k-th
    trajectory seen) scored by one forward. Returns a ``TokenOutput`` with the tokens' log-probs."""

    def __init__(self, model, processor, *, length, sample=True, script=None, banned=()):
        self.model, self.processor, self.length, self.sample = model, processor, length, sample
        self.script, self.banned, self.calls = script or [], list(banned), []

    async def generate(self, *, request_id, prompt_ids, sampling_params, image_data=None, **kw):
        from verl.workers.rollout.replica import TokenOutput

        ids = torch.tensor([prompt_ids])
        extra = {}
        if image_data:
            mm = self.processor.image_processor(images=image_data, return_tensors="pt")
            extra = {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"]}
        turn = sum(c["request_id"] == request_id for c in self.calls)
        trajectory = list(dict.fromkeys(c["request_id"] for c in self.calls) | {request_id: None}).index(request_id)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "images": image_data,
                           "params": dict(sampling_params), **extra})
        n = min(self.length, int(sampling_params.get("max_tokens", self.length)))
        with torch.no_grad():
            if turn < len(self.script):
                step = self.script[turn]
                toks = list(step(trajectory) if callable(step) else step)
                # (a scripted vision token is scored as token 0: the forward would read it as an image slot)
                full = torch.tensor([list(prompt_ids) + [0 if t in self.banned else t for t in toks]])
                types_ = (full == self.model.config.image_token_id).long() if extra else None
                logits = self.model(input_ids=full, attention_mask=torch.ones_like(full), mm_token_type_ids=types_,
                                    **extra).logits[0]
                lps = torch.log_softmax(logits[ids.shape[1] - 1:-1].float(), -1)
                return TokenOutput(token_ids=toks, log_probs=lps.gather(-1, torch.tensor(toks)[:, None])[:, 0].tolist(),
                                   stop_reason="completed")
            torch.manual_seed(len(self.calls))
            bad = [[t] for t in self.banned] or None
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=self.sample, top_k=0, output_logits=True,
                                      return_dict_in_generate=True, bad_words_ids=bad, **extra)
        toks = out.sequences[0, ids.shape[1]:].tolist()
        lps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.logits, toks)]
        return TokenOutput(token_ids=toks, log_probs=lps, stop_reason="completed")


def verl_config(**rollout):
    """verl's full default PPO config (``_generated_ppo_trainer.yaml``) set for GRPO on CPU:
    ``rollout`` entries override ``actor_rollout_ref.rollout``."""
    import verl
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    a = cfg.actor_rollout_ref
    a.actor.update(ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False, ppo_epochs=2,
                   shuffle=False, entropy_coeff=0.0, use_kl_loss=False)
    a.actor.optim.update(lr=1e-4)  # small: the second epoch stays inside the PPO clip range
    a.rollout.update(log_prob_micro_batch_size_per_gpu=2, temperature=1.0, top_k=-1, top_p=1.0,
                     calculate_log_probs=True, **rollout)
    cfg.algorithm.adv_estimator = "grpo"
    cfg.data.update(apply_chat_template_kwargs={}, mm_processor_kwargs={})
    return cfg


def agent_worker(processor, model, cfg, server, *, tools=(), dataset_cls=None):
    """verl's ``AgentLoopWorker`` with the attributes its ``__init__`` sets (see the module
    docstring); registers the agent loops of ``rollout.agent.agent_loop_config_path`` as
    ``__init__`` does."""
    from omegaconf import OmegaConf
    from transformers.models.qwen2_vl import Qwen2VLModel
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
    from verl.utils.rollout_trace import RolloutTraceConfig

    vproc = copy.copy(processor)
    vproc.config = model.config
    vproc.get_rope_index = types.MethodType(Qwen2VLModel.get_rope_index, vproc)
    vproc.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, vproc)
    path = cfg.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
    if path:
        for c in OmegaConf.load(path):
            _agent_loop_registry[c.name] = c
    w = AgentLoopWorker.__new__(AgentLoopWorker)
    w.config, w.rollout_config = cfg, cfg.actor_rollout_ref.rollout
    w.llm_client = server
    server.processor = vproc
    w.tokenizer, w.processor, w.hf_model_type = vproc.tokenizer, vproc, model.config.model_type
    w.dataset_cls, w.tools, w.reward_loop_worker_handles = dataset_cls, list(tools), None
    w.distillation_enabled, w.mm_processor_kwargs, w.teacher_client = False, {}, None
    RolloutTraceConfig.init("p", "e", None, False, None)
    return w


@contextlib.contextmanager
def cpu_world(tmp_path):
    """A one-process gloo group (verl's workers all-reduce and all-gather over the DP group),
    and verl's device helpers answering "cpu"."""
    import torch.distributed as dist
    import verl.workers.engine.fsdp.transformer_impl as impl

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'gloo'}", rank=0, world_size=1)
    saved = impl.get_device_id, impl.get_device_name
    impl.get_device_id = impl.get_device_name = lambda: "cpu"
    try:
        yield
    finally:
        impl.get_device_id, impl.get_device_name = saved
        dist.destroy_process_group()


class Trainer:
    """``self`` for ``RayPPOTrainer._compute_old_log_prob`` / ``_update_actor``: the config and an
    ``actor_rollout_wg`` that calls verl's ``TrainingWorker.infer_batch`` / ``train_mini_batch``
    in-process (what ``ActorRolloutRefWorker.compute_log_prob`` / ``update_actor`` call)."""

    def __init__(self, cfg, model):
        from functools import partial

        from omegaconf import OmegaConf
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine_workers import TrainingWorker
        from verl.workers.utils.losses import ppo_loss

        self.config, self.distillation_config = cfg, None
        actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        w = TrainingWorker.__new__(TrainingWorker)
        ecfg = actor_cfg.engine  # what ActorRolloutRefWorker.init_model sets on the actor's engine config
        a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        ecfg.use_dynamic_bsz, ecfg.use_remove_padding = a.use_dynamic_bsz, True
        ecfg.infer_max_token_len_per_gpu, ecfg.infer_micro_batch_size_per_gpu = (r.log_prob_max_token_len_per_gpu,
                                                                                   r.log_prob_micro_batch_size_per_gpu)
        ecfg.max_token_len_per_gpu, ecfg.micro_batch_size_per_gpu = a.ppo_max_token_len_per_gpu, a.ppo_micro_batch_size_per_gpu
        w.engine, w.engine_config = _engine(model, actor_cfg.optim, ecfg), ecfg
        w.model_config = OmegaConf.create({"use_remove_padding": True})
        w.flops_counter, w.device_name, w.loss_fn = None, "cpu", partial(ppo_loss, config=actor_cfg)
        w.profiler = types.SimpleNamespace(rank=0, step=lambda: None, check_enable=lambda: False,  # profiling off
                                           check_this_step=lambda: False, check_this_rank=lambda: False)
        self.worker = w
        self.actor_rollout_wg = types.SimpleNamespace(compute_log_prob=self._log_prob, update_actor=self._update)

    def _log_prob(self, td):
        from verl.utils import tensordict_utils as tu

        out = self.worker.infer_batch(td)
        tu.get(out, "metrics").setdefault("mfu", None)  # no FLOPs counter on CPU
        return out

    def _update(self, td):
        from verl.utils import tensordict_utils as tu

        out = self.worker.train_mini_batch(td)
        tu.get(out, "metrics").setdefault("mfu", None)
        return out


def _engine(model, optim, engine_config):
    import verl.workers.engine.fsdp.transformer_impl as impl
    from verl.utils.torch_functional import entropy_from_logits

    eng = impl.FSDPEngineWithLMHead.__new__(impl.FSDPEngineWithLMHead)
    eng.module, eng._autocast_dtype, eng.pad_to_length, eng.use_ulysses_sp = model, torch.float32, None, False
    eng.compute_entropy_from_logits, eng._get_packed_pad_size = entropy_from_logits, lambda n: 0
    eng.engine_config = engine_config
    eng.optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr)  # verl's build_optimizer: AdamW
    eng.optimizer_config = optim
    eng.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(eng.optimizer, lambda step: 1.0)
    eng.ulysses_sequence_parallel_size, eng.ulysses_device_mesh, eng.ulysses_parallel_group = 1, None, None
    eng._qat_enabled, eng.scaler, eng._is_offload_param, eng._is_offload_optimizer = False, None, False, False
    return eng


def rule_reward(batch, score):
    """``rm_scores`` [B, R]: ``score(response ids) -> float`` on each row's last response token."""
    resp, mask = batch.batch["responses"], batch.batch["response_mask"]
    out = torch.zeros(resp.shape, dtype=torch.float32)
    for j in range(len(resp)):
        n = int(batch.batch["attention_mask"][j, -resp.shape[1]:].sum())
        out[j, max(n - 1, 0)] = score(resp[j, :n][mask[j, :n].bool()].tolist())
    return out


def fit_tail(trainer, batch):
    """``fit()`` after the rollout's union, in its order, from verl's installed code:
    ``compute_response_mask`` -> ``extract_reward`` -> ``_compute_old_log_prob`` -> union ->
    ``token_level_scores`` / ``token_level_rewards`` -> ``compute_advantage`` (GRPO) ->
    ``_update_actor``. Returns (batch, actor metrics)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
    from verl.trainer.ppo.reward import extract_reward

    cfg = trainer.config
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, extra = extract_reward(batch)
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    old.batch.pop("entropys")
    batch = batch.union(old)
    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # use_kl_in_reward=False
    batch = compute_advantage(batch, adv_estimator=cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma,
                              lam=cfg.algorithm.lam, num_repeat=cfg.actor_rollout_ref.rollout.n,
                              norm_adv_by_std_in_grpo=cfg.algorithm.get("norm_adv_by_std_in_grpo", True),
                              config=cfg.algorithm)
    out = RayPPOTrainer._update_actor(trainer, batch)
    return batch, out.meta_info["metrics"]


def page_tool_source(name: str) -> str:
    """The text of a verl function-tool module: ``name(page)`` returns one tiny image per page (60 x
    44 + 8 * page, seeded by the page) and the text ``page N``, as a VRAG search tool returns a page."""
    return f'''
from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse
from mmpipe.testing import tiny_image


@function_tool
def {name}(page: int) -> ToolResponse:
    """Open one page of the document as an image.

    Args:
        page: the page number.
    """
    return ToolResponse(image=[tiny_image(60, 44 + 8 * page, seed=page)], text=f"page {{page}}")
'''

