"""mmpipe's packers inside cosmos-rl 0.4.7's own GRPO trainer, in each mode that runs on CPU
(scripts/envs/cosmos.sh): cosmos-rl's real ``GRPOTrainer.step_training`` (its per-sample reads of
what ``get_policy_input`` returns, its mini-batching, ``collate_teacher_logprobs``,
``compute_logprobs``, ``compute_loss``, gradient clipping) runs one training step on a tiny
Qwen2.5-VL (rows with 0, 1 and 2 images in one batch) wrapped in cosmos-rl's own ``HFModel``.

What is NOT cosmos-rl's code here, and why:
- the trainer object is made with ``GRPOTrainer.__new__`` and given its attributes by hand
  (``__init__`` builds FSDP / NCCL meshes, CUDA streams and a GPU model): a CPU
  ``parallel_dims`` (no PP/CP/DP), a torch SGD optimizer and a no-op LR scheduler;
- ``all_reduce_states`` (the cross-replica gradient all-reduce: NCCL on CUDA buffers) is the
  one-replica step: cosmos-rl's own ``gradient_norm_clipping``, then the optimizer step;
- ``torch.cuda.Event`` (step timing only) is a no-op stand-in: CPU torch cannot build one;
- distillation: the teacher's results are put into cosmos-rl's own ``TeacherResultInbox`` by
  uuid (what its teacher transport does), and the inter-replica communicator is a one-replica
  stand-in (``operation_scope`` / ``allreduce`` of the vote with nobody else);
- importing the trainer needs two things CPU torch 2.13 lacks, filled in for the import only:
  the ``torchao`` package (its FP8 converter, unused here) and
  ``torch.distributed.pipelining.stage._RootArgPlaceholder`` (its pipeline-parallel patch).

Modes: the default (old logprobs = the current ones), ``use_rollout_logprobs_for_loss`` (cosmos
reads each sample's ``logprob_masks`` to pick the rollout logprobs: they must line up with the
batch's scored tokens; the rollout/training gap is measured), ``use_decoupled_loss``, and on-policy
distillation with ``include_prompt`` (cosmos REPLACES each sample's ``logprob_masks`` with all
ones but the last; the batch our collate builds must follow, and the teacher logprobs must land
on the same tokens), plus SFT's per-sample read (the load balancer's ``get_sample_length``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.machinery
import sys
import types

import msgpack
import numpy as np
import pytest
import torch

from mmpipe.records.generation import SamplingParams
from mmpipe import testing
from mmpipe.rollout.packers import CosmosRow, DecoderOnlyLLMDataPacker, QwenVLDataPacker
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from helpers import tiny_text_model
from test_packers import vl_items

pytestmark = pytest.mark.needs_env("cosmos")
FAMILY = "qwen2_5_vl"


def _stub_module(name):
    """An empty package whose every public attribute is a do-nothing class; it has a module spec
    (diffusers, which the distillation teacher imports, looks one up)."""
    m = types.ModuleType(name)
    m.__path__, m.__spec__ = [], importlib.machinery.ModuleSpec(name, None, is_package=True)

    def attr(a):
        if a.startswith("__"):
            raise AttributeError(a)
        return type(a, (), {"__init__": lambda self, *args, **kw: None})
    m.__getattr__ = attr
    return m


@pytest.fixture(scope="module")
def cosmos():
    """cosmos-rl's trainer modules, imported with the two CPU gaps filled (module doc)."""
    with pytest.MonkeyPatch.context() as mp:
        try:
            importlib.import_module("torchao.float8")
        except ModuleNotFoundError:
            for n in ("torchao", "torchao.float8"):
                mp.setitem(sys.modules, n, _stub_module(n))
        stage = importlib.import_module("torch.distributed.pipelining.stage")
        if not hasattr(stage, "_RootArgPlaceholder"):
            mp.setattr(stage, "_RootArgPlaceholder", type("_RootArgPlaceholder", (), {}), raising=False)
        grpo = importlib.import_module("cosmos_rl.policy.trainer.llm_trainer.grpo_trainer")
        sft = importlib.import_module("cosmos_rl.policy.trainer.llm_trainer.sft_trainer")
        from cosmos_rl.policy.kernel.loss import CrossEntropyLoss
        from cosmos_rl.dispatcher.data.load_balanced_dataset import get_sample_length
        from cosmos_rl.dispatcher.data.schema import Rollout
        from cosmos_rl.policy.config import Config
        from cosmos_rl.policy.model.hf_models import HFModel
        from cosmos_rl.utils import distributed as dist_util
        from cosmos_rl.utils.teacher_results import TeacherResultInbox
        yield types.SimpleNamespace(grpo=grpo, sft=sft, CrossEntropyLoss=CrossEntropyLoss, Rollout=Rollout, Config=Config, HFModel=HFModel,
                                    get_sample_length=get_sample_length, dist_util=dist_util,
                                    TeacherResultInbox=TeacherResultInbox)


class _OneReplica:
    """The inter-replica communicator of a run with one policy replica: nothing to reduce."""
    default_timeout_ms = 60_000

    def operation_scope(self):
        return contextlib.nullcontext()

    def allreduce(self, src, dst, op=None, **kw):
        if dst is not src:
            dst.copy_(src)

    def world_size(self):
        return 1


class _Event:  # torch.cuda.Event stand-in (step timing only)
    def __init__(self, *a, **k):
        pass

    def record(self, *a):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


TEXT_ITEMS = ["Once upon a time", [{"role": "user", "content": "Why is the sky blue?"}],
              [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]]


@functools.lru_cache(maxsize=None)
def _kind(kind):
    """(processor, model, packer class, items) of a packer kind: Qwen2.5-VL rows with 1, 0 and 2
    images, or a decoder-only text model with a raw string and two chats."""
    if kind == "vl":
        return processor_for(FAMILY), model_for(FAMILY), QwenVLDataPacker, vl_items()
    tok = testing.build_tokenizer("qwen2_vl")
    return tok, tiny_text_model(len(tok)), DecoderOnlyLLMDataPacker, TEXT_ITEMS


@functools.lru_cache(maxsize=None)
def _generated(kind):
    """Rollouts of the tiny model: 3 items x 2 samples, with their logprobs."""
    proc, model, cls, items = _kind(kind)
    packer = cls(proc)
    gens = TransformersEngine(model, proc).generate([packer.encode_prompt(it) for it in items],
                                                    SamplingParams(max_new_tokens=5, n=2, temperature=1.0, seed=0))
    return [(it, packer.encode_prompt(it).num_tokens, c) for it, g in zip(items, gens) for c in g.completions]


@pytest.fixture(scope="module")
def generated():
    return _generated("vl")


def _teacher_logprobs(model, packer, item, ids):
    """The model's own logprob of every next token of prompt + response (a 'teacher' that is the
    student: its reverse KL is 0 wherever the tokens line up), as cosmos-rl stores them."""
    row = packer.get_policy_input(item, ids)
    batch = packer.policy_collate_fn([row], row.num_tokens)
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in packer.model_keys(batch)}).logits.float()
    lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, batch["input_ids"][0, 1:, None])[:, 0]
    return [[float(x)] for x in lp]


def _config(cosmos, model_dir, mode):
    tp = {"type": "grpo", "mini_batch": 2, "kl_beta": 0.0, "rollout_as_token_ids": True}
    d = {"train": {"train_policy": tp, "output_dir": str(model_dir / "out"), "optm_grad_norm_clip": 1.0},
         "policy": {"model_name_or_path": str(model_dir)}, "logging": {"logger": []}}
    if mode == "rollout_logprobs":
        tp["use_rollout_logprobs_for_loss"] = True
    elif mode == "decoupled":
        tp["use_decoupled_loss"] = True
    elif mode == "distill_prompt":
        d["distillation"] = {"enable": True, "include_prompt": True, "top_k": 0,
                             "model_name_or_path": str(model_dir)}
    return cosmos.Config.from_dict(d)


def _trainer(cosmos, config, packer, model):
    """A GRPOTrainer for one CPU process (module doc: what is set by hand)."""
    GRPOTrainer = cosmos.grpo.GRPOTrainer
    t = GRPOTrainer.__new__(GRPOTrainer)
    model.config._attn_implementation = "eager"
    hf = cosmos.HFModel(model.config, model, type(model), is_vlm=isinstance(packer, QwenVLDataPacker))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    t.__dict__.update(
        config=config, data_packer=packer, device=torch.device("cpu"), tokenizer=packer.tokenizer,
        parallel_dims=types.SimpleNamespace(pp_enabled=False, cp_enabled=False, dp_enabled=False,
                                            dp_replicate_enabled=False, dp_shard_enabled=False,
                                            dp_shard_coord=(0, 1), pp_cp_tp_coord=(0, 1), world_size=1, mesh={}),
        model=hf, forward_model=hf, model_parts=[hf], train_stream=None, batch_size_per_optimize=None,
        mini_batch=config.train.train_policy.mini_batch, mu_iterations=1, seq_len_multiple=1, mini_step=0,
        act_offloading_ctx_manager=contextlib.nullcontext(), global_rank=0, world_size=1,
        optimizers=types.SimpleNamespace(step=opt.step, zero_grad=opt.zero_grad),
        lr_schedulers=types.SimpleNamespace(step=lambda: None, get_last_lr=lambda: [1e-3]),
        teacher_results=cosmos.TeacherResultInbox(), fetched_teacher_uuids=set(),
    )

    def all_reduce_states(inter_policy_nccl):  # one replica: no NCCL reduce (CUDA buffers)
        norm = cosmos.dist_util.gradient_norm_clipping(list(model.parameters()), config.train.optm_grad_norm_clip,
                                                       foreach=True, pp_mesh=None)
        opt.step()
        opt.zero_grad()
        return norm
    t.all_reduce_states = all_reduce_states
    seen = {"loss": [], "teacher": []}

    def loss_fn(current, old, ref, advantages, cu_seqlens, cfg, logprob_masks, **kw):
        seen["loss"].append(dict(current=current.detach().clone(), old=old.detach().clone(),
                                 masks=logprob_masks.detach().clone(), cu=cu_seqlens.clone()))
        return cosmos.grpo.compute_loss(current, old, ref, advantages, cu_seqlens, cfg, logprob_masks, **kw)

    def teacher_kl(current_logprobs, teacher_logprobs, current_advantages, logprob_masks, cu_seqlens):
        seen["teacher"].append(current_logprobs.detach() - torch.masked_select(teacher_logprobs, logprob_masks))
        return GRPOTrainer.compute_teacher_kl_advantages(t, current_logprobs, teacher_logprobs, current_advantages,
                                                         logprob_masks, cu_seqlens)
    t.loss_fn = loss_fn
    t.compute_teacher_kl_advantages = teacher_kl
    return t, seen


@pytest.fixture
def model_dir(tmp_path):
    model_for(FAMILY).config.save_pretrained(tmp_path)
    processor_for(FAMILY).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("kind", ["vl", "text"])
@pytest.mark.parametrize("mode", ["default", "rollout_logprobs", "decoupled", "distill_prompt"])
def test_cosmos_grpo_step_training_reads_our_samples(cosmos, model_dir, kind, mode, monkeypatch):
    proc, model, cls, _ = _kind(kind)
    model = copy.deepcopy(model)
    packer = cls(proc)
    generated = _generated(kind)
    config = _config(cosmos, model_dir, mode)
    packer.setup(config)
    rollouts, lengths, teacher = [], [], {}
    for k, (item, P, c) in enumerate(generated):
        ids = list(c.token_ids)
        r = cosmos.Rollout(prompt=item, completion="", advantage=(1.0 if k % 2 else -1.0),
                           completion_token_ids=[[i] for i in ids],
                           completion_logprobs=[[float(x)] for x in c.logprobs],
                           prompt_logprobs=[[0.0]] * (P - 1))
        if mode == "distill_prompt":  # what the teacher replica sends, by uuid (fetch_teacher_logprobs)
            r.teacher_result_uuid = f"t{k}"
            teacher[r.teacher_result_uuid] = _teacher_logprobs(model, packer, item, ids)
        rollouts.append(r)
        lengths.append((P, len(ids)))
    before = [p.detach().clone() for p in model.parameters()]

    trainer, seen = _trainer(cosmos, config, packer, model)
    for uuid, lps in teacher.items():
        trainer.teacher_results.admit(uuid)
        trainer.teacher_results.complete(uuid, msgpack.packb({"teacher_logprobs": lps}))
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    report = trainer.step_training(rollouts, current_step=1, total_steps=1, remain_samples_num=0,
                                   inter_policy_nccl=_OneReplica() if teacher else None, is_master_replica=True)
    assert "train/teacher_update_skipped" not in report
    if teacher:
        assert all(r.teacher_logprobs is not None for r in rollouts)

    assert len(seen["loss"]) == 3  # 6 samples in mini-batches of 2
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))  # a step was taken
    for mb, call in enumerate(seen["loss"]):
        for j in range(2):
            P, C = lengths[2 * mb + j]
            m = call["masks"][j]
            want = torch.zeros_like(m)
            if mode == "distill_prompt":  # cosmos's include_prompt: every position but the last
                want[:P + C - 1] = True
            else:                         # the logits that predict the response tokens
                want[P - 1:P + C - 1] = True
            assert torch.equal(m, want), (mode, mb, j)
        gap = (call["current"] - call["old"]).abs().max().item()
        print(f"[cosmos {kind} {mode}] mini-batch {mb}: {int(call['masks'].sum())} scored tokens, "
              f"max |training - old| logprob gap {gap:.2e}")
        if mode == "rollout_logprobs":
            # old = the rollout's logprobs cosmos picked with each sample's logprob_masks
            want_old = torch.cat([torch.tensor([x[0] for x in rollouts[2 * mb + j].completion_logprobs])
                                  for j in range(2)])
            assert torch.equal(call["old"], want_old)
            assert gap < 1e-4, gap  # rollout vs training logprobs, same weights
        else:
            assert gap == 0.0
    if mode == "distill_prompt":
        kl = torch.cat(seen["teacher"])
        assert kl.numel() == sum(P + C - 1 for P, C in lengths) and kl.abs().max().item() < 1e-4


def test_cosmos_reads_our_samples_as_its_own(cosmos, generated):
    """The per-sample reads of cosmos-rl's trainer and SFT load balancer, on what our packer returns."""
    proc = processor_for(FAMILY)
    packer = QwenVLDataPacker(proc)
    item, P, c = generated[0]
    s = packer.get_policy_input(item, list(c.token_ids), n_ignore_prefix_tokens=1)
    assert isinstance(s, CosmosRow) and hasattr(s, "logprob_masks")
    C, L = len(c.token_ids), s.num_tokens
    cosmos_mask = [0] * (P - 1 + 1) + [1] * (C - 1) + [0]  # cosmos-rl's VL packer, n_ignore 1
    assert s.logprob_masks == s["logprob_masks"] == cosmos_mask and len(s.logprob_masks) == L
    assert s["input_ids"] == s.input_ids.tolist() and "input_ids" in s
    s["logprob_masks"] = [1] * L
    s.logprob_masks[-1] = 0  # in place, as cosmos-rl's distillation does
    batch = packer.policy_collate_fn([s], L + 2)
    assert batch["logprob_masks"][0].tolist() == [True] * (L - 1) + [False] * 3
    with pytest.raises(ValueError, match="one value per token"):
        s.logprob_masks = [1] * (L - 1)
    sft = packer.sft_process_sample(item + [{"role": "assistant", "content": "A red square."}])
    assert cosmos.get_sample_length(sft) == sft.num_tokens
    assert sft["label_ids"] == sft.labels.tolist()


@pytest.fixture
def one_process_group(tmp_path):
    """torch.distributed with one gloo process (SFT's loss all-reduce over its loss_parallel mesh)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_cosmos_sft_step_training_on_our_samples(cosmos, model_dir, one_process_group, monkeypatch):
    """cosmos-rl's own ``SFTTrainer.step_training`` (its mini-batching, ``sft_compute_max_len`` /
    ``sft_collate_fn`` calls, its ``async_safe_ce`` + ``CrossEntropyLoss`` loss, its gradient
    clipping) on what our ``sft_process_sample`` returns: rows with 1, 0 and 2 images; the loss it
    computes is the model's next-token cross entropy on the assistant tokens."""
    proc = processor_for(FAMILY)
    model = copy.deepcopy(model_for(FAMILY))
    model.config._attn_implementation = "eager"
    packer = QwenVLDataPacker(proc)
    config = cosmos.Config.from_dict({
        "train": {"train_policy": {"type": "sft", "mini_batch": 2}, "output_dir": str(model_dir / "out"),
                  "optm_grad_norm_clip": 1.0},
        "policy": {"model_name_or_path": str(model_dir)}, "logging": {"logger": []}})
    packer.setup(config)
    convs = [([{"role": "user", "content": it}] if isinstance(it, str) else it)
             + [{"role": "assistant", "content": f"Answer {k}."}] for k, it in enumerate(vl_items())]
    global_batch = [packer.sft_process_sample(c) for c in convs]  # what cosmos-rl's SFT dataset yields
    assert [cosmos.get_sample_length(s) for s in global_batch] == [s.num_tokens for s in global_batch]

    SFTTrainer = cosmos.sft.SFTTrainer
    t = SFTTrainer.__new__(SFTTrainer)
    hf = cosmos.HFModel(model.config, model, type(model), is_vlm=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    group = types.SimpleNamespace(get_group=lambda: one_process_group)
    losses = []
    ce = functools.partial(cosmos.sft.async_safe_ce, ce_impl=cosmos.CrossEntropyLoss(config), dp_group=None,
                           cp_group=None)
    t.__dict__.update(
        config=config, data_packer=packer, device=torch.device("cpu"), global_rank=0,
        parallel_dims=types.SimpleNamespace(pp_enabled=False, cp_enabled=False, dp_enabled=False,
                                            dp_replicate_enabled=False, dp_shard_enabled=False,
                                            mesh={"loss_parallel": group}),
        model=hf, forward_model=hf, model_parts=[hf], seq_len_multiple=1, enable_dp_load_balancing=False,
        act_offloading_ctx_manager=contextlib.nullcontext(),
        optimizers=types.SimpleNamespace(step=opt.step, zero_grad=opt.zero_grad),
        lr_schedulers=types.SimpleNamespace(step=lambda: None, get_last_lr=lambda i=0: [1e-3]),
        loss_fn=lambda logits, labels, **kw: losses.append((logits.detach(), labels.clone(), kw)) or ce(logits, labels, **kw),
    )
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    before = [p.detach().clone() for p in model.parameters()]
    t.step_training(global_batch, total_steps=1, train_step=1, save_freq=100)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))  # a step was taken
    assert len(losses) == 2  # 3 samples in mini-batches of 2
    for logits, labels, kw in losses:  # cosmos's loss shifts: labels[:, 1:] against logits[:, :-1]
        want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        got = ce(logits, labels, loss_scaling_factor=1.0)
        assert torch.allclose(got, want, atol=1e-5) and (labels != -100).sum() > 0
    targets = sum(int((s.labels != -100).sum()) for s in global_batch)
    assert targets == sum(int((lab != -100).sum()) for _, lab, _ in losses)
