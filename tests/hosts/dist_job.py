"""One rank of a 2-process gloo job on CPU (run by tests/hosts/test_hunt_distributed.py, which
sets RANK / WORLD_SIZE / MASTER_* and runs each rank in its own session). Runs the scenarios named
on the command line in order and writes, per scenario, ``OUT/<scenario>.<rank>.json``: the rows
(dataset indices) of every batch the model received, whether each batch equalled a fresh collate
of those rows, and the losses, or the error a scenario raised.

    python dist_job.py OUT FAMILY SCENARIO [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import datasets
import torch
import torch.distributed as dist

import mmpipe
from mmpipe import testing
from mmpipe.hosts import TrainerCollator, trainer_settings
from mmpipe.hosts.resume import restore_checkpoint_weights

N_ROWS = 10  # 10 rows, 2 per device, 2 ranks: the epoch does not divide (5 batches, 3 steps)


def rows(n: int = N_ROWS) -> list[dict]:
    photos = [im.convert("RGB") for _, im in testing.sample_photos()]
    out = []
    for i in range(n):
        k = i % 3
        images = [photos[(i + j) % len(photos)].resize((40 + 8 * j, 36 + 4 * i)) for j in range(k)]
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"Row {i}: what is shown?"}]
        out.append({"messages": [{"role": "user", "content": content},
                                 {"role": "assistant", "content": [{"type": "text", "text": f"Picture {i}."}]}],
                    "images": images})
    return out


class Watch:
    """A forward pre-hook on the model: the rows each batch holds (by their unpadded ids) and
    whether the batch equals a fresh `TrainerCollator` of those rows, tensor for tensor."""

    def __init__(self, model, enc, processor):
        self.enc, self.collator = enc, TrainerCollator(processor)
        self.key = {tuple(r): i for i, r in enumerate(enc["input_ids"])}
        self.batches, self.intact, self.notes = [], [], []
        model.register_forward_pre_hook(self.saw, with_kwargs=True)

    def saw(self, module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        found = [self.key.get(tuple(r[m.bool()].tolist()), -1) for r, m in zip(ids, mask)]
        self.batches.append(found)
        if -1 in found:
            self.intact.append(False)
            self.notes.append("unknown row")
            return
        want = self.collator([self.enc[i] for i in found])
        want = {k: v for k, v in want.items()}
        bad = [k for k in set(want) | set(kwargs)
               if k in want and (k not in kwargs or not torch.is_tensor(kwargs[k])
                                 or kwargs[k].shape != want[k].shape or not torch.equal(kwargs[k].cpu(), want[k]))]
        self.intact.append(not bad)
        if bad:
            self.notes.append(f"differs: {sorted(bad)} " + str({k: tuple(kwargs[k].shape) for k in bad if k in kwargs}))


def trainer_run(name, family, out, enc, processor, *, settings, resume=None, stream=False, collate=None, **args):
    from transformers import Trainer, TrainingArguments

    model = testing.build_model(family)
    watch = Watch(model, enc, processor)
    targs = TrainingArguments(os.path.join(out, name), per_device_train_batch_size=2, logging_steps=1,
                              learning_rate=1e-2, report_to=[], seed=0, use_cpu=True, ddp_timeout=60,
                              **{"save_strategy": "no", **args}, **settings)
    trainer = restore_checkpoint_weights(Trainer(model=model, args=targs, train_dataset=enc.to_iterable_dataset() if stream else enc,
                                                 data_collator=TrainerCollator(processor, **(collate or {}))))
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"batches": watch.batches, "intact": watch.intact, "notes": watch.notes, "losses": losses,
            "steps": trainer.state.global_step}


def rank_stream_run(family, out, enc, processor, per_rank):
    """A raw stream of 2 shards encoded with encode_stream, given to the Trainer whole or (scale-out.md's
    recipe for plain loops) each rank's part (shard_for_rank)."""
    from transformers import Trainer, TrainingArguments

    from mmpipe.data.streaming import encode_stream, shard_for_rank

    raw = datasets.Dataset.from_list(rows()).to_iterable_dataset(num_shards=2)
    mine = encode_stream(shard_for_rank(raw, int(os.environ["RANK"]), 2) if per_rank else raw, processor)
    model = testing.build_model(family)
    watch = Watch(model, enc, processor)
    targs = TrainingArguments(os.path.join(out, f"stream{per_rank}"), per_device_train_batch_size=2, max_steps=3,
                              report_to=[], use_cpu=True, ddp_timeout=60, save_strategy="no", **trainer_settings())
    trainer = Trainer(model=model, args=targs, train_dataset=mine, data_collator=TrainerCollator(processor))
    trainer.train()
    return {"batches": watch.batches, "intact": watch.intact, "notes": watch.notes, "losses": [],
            "steps": trainer.state.global_step}


def grpo_run(family, out, processor, **over):
    """mmpipe's VisionGRPOTrainer on 2 ranks (GRPOConfig's own defaults + grpo_settings()): prompts
    with 0..3 images; every forward's pixel rows match its grids."""
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    prompts = []
    for i in range(8):
        k = i % 4
        prompts.append({"prompt": [{"role": "user", "content": [{"type": "image"}] * k + [
            {"type": "text", "text": f"Describe the {k} pictures ({i})."}]}],
            "images": [testing.tiny_image(28 * (2 + j % 2), 28 * (2 + i % 2), seed=10 * i + j) for j in range(k)]})
    model = testing.build_model(family)
    seen = []

    def saw(module, args, kwargs):
        grid, pv = kwargs.get("image_grid_thw"), kwargs.get("pixel_values")
        seen.append(pv is None or int(grid.prod(-1).sum()) == pv.shape[0])

    model.register_forward_pre_hook(saw, with_kwargs=True)
    args = GRPOConfig(os.path.join(out, "grpo"), **{**dict(
        per_device_train_batch_size=2, num_generations=2, max_completion_length=8, max_steps=2,
        learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no", seed=0, use_cpu=True,
        ddp_timeout=60), **over}, **grpo_settings())
    trainer = VisionGRPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(prompts),
                                processing_class=processor,
                                reward_funcs=lambda completions, **kw: [float(len(str(c))) for c in completions])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"batches": [], "intact": seen, "notes": [], "losses": losses, "steps": trainer.state.global_step,
            "gc": model.is_gradient_checkpointing,
            "find_unused": getattr(trainer.model_wrapped, "find_unused_parameters", None)}


def best_run(family, out, enc, processor):
    """load_best_model_at_end on 2 ranks (evaluation every step on 5 rows, uneven over the ranks):
    the final weights equal the best checkpoint's (the worst loss, step 1), read with load_checkpoint_weights."""
    from transformers import Trainer, TrainingArguments

    from mmpipe.hosts.resume import load_checkpoint_weights

    model = testing.build_model(family)
    targs = TrainingArguments(os.path.join(out, "best"), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                              num_train_epochs=1, learning_rate=5e-2, report_to=[], seed=0, use_cpu=True,
                              ddp_timeout=60, eval_strategy="steps", eval_steps=1, save_strategy="steps",
                              save_steps=1, load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True,
                              **trainer_settings())
    trainer = restore_checkpoint_weights(Trainer(model=model, args=targs, train_dataset=enc,
                                                 eval_dataset=enc.select(range(5)),
                                                 data_collator=TrainerCollator(processor)))
    trainer.train()
    best = testing.build_model(family)
    load_checkpoint_weights(best, trainer.state.best_model_checkpoint)
    same = all(torch.equal(a, b) for a, b in zip(best.state_dict().values(), trainer.model.state_dict().values()))
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    return {"batches": [], "intact": [same], "notes": [trainer.state.best_model_checkpoint], "losses": evals,
            "steps": trainer.state.global_step}


def sft_run(family, out, enc, processor):
    from trl import SFTConfig, SFTTrainer

    from mmpipe.hosts import sft_settings

    model = testing.build_model(family)
    watch = Watch(model, enc, processor)
    args = SFTConfig(os.path.join(out, "sft"), per_device_train_batch_size=2, num_train_epochs=1, logging_steps=1,
                     learning_rate=1e-2, report_to=[], seed=0, use_cpu=True, ddp_timeout=60, bf16=False,
                     save_strategy="no", **sft_settings())
    trainer = SFTTrainer(model=model, args=args, train_dataset=enc, processing_class=processor,
                         data_collator=TrainerCollator(processor))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"batches": watch.batches, "intact": watch.intact, "notes": watch.notes, "losses": losses,
            "steps": trainer.state.global_step, "gc": model.is_gradient_checkpointing,
            "find_unused": getattr(trainer.model_wrapped, "find_unused_parameters", None)}


def loop_run(family, enc, processor, budget=False):
    """A plain loop: DDP model, DistributedSampler (2 epochs, set_epoch) and mmpipe.Collator."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    model = testing.build_model(family)
    watch = Watch(model, enc, processor)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)  # imageless batches
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    collate = mmpipe.Collator(processor, padding_side="right")
    if budget:
        sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(enc, max_tokens=160, seed=0, num_replicas=2,
                                                              rank=dist.get_rank())
        loader = DataLoader(enc, batch_sampler=sampler, collate_fn=collate)
    else:
        sampler = DistributedSampler(enc, shuffle=True, seed=0)
        loader = DataLoader(enc, batch_size=2, sampler=sampler, collate_fn=collate)
    losses, epochs = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(len(watch.batches))
        for batch in loader:
            loss = ddp(**batch.model_inputs()).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
    return {"batches": watch.batches, "intact": watch.intact, "notes": watch.notes, "losses": losses,
            "epochs": epochs}


def budget_resume_run(family, enc, processor, stop=2, workers=1):
    """TokenBudgetBatchSampler under torchdata's StatefulDataLoader on 2 ranks (DDP): epoch 1 stopped
    after `stop` steps, its state saved, a fresh loader (workers) loads it and finishes the epoch."""
    from torch.nn.parallel import DistributedDataParallel
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mmpipe.data import load_loader_state

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    model = testing.build_model(family)
    watch = Watch(model, enc, processor)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)

    def loader(num_workers):
        sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(enc, max_tokens=160, seed=0, num_replicas=2,
                                                              rank=dist.get_rank())
        sampler.set_epoch(1)
        return StatefulDataLoader(enc, batch_sampler=sampler, num_workers=num_workers,
                                  collate_fn=mmpipe.Collator(processor, padding_side="right"))

    first = loader(0)
    for step, batch in enumerate(first):
        ddp(**batch.model_inputs()).loss.backward()
        if step + 1 == stop:
            state = first.state_dict()
            break
    cut = len(watch.batches)
    second = loader(workers)
    load_loader_state(second, state)
    for batch in second:
        ddp(**batch.model_inputs()).loss.backward()
    return {"batches": watch.batches, "intact": watch.intact, "notes": watch.notes, "losses": [], "cut": cut}


def main(out, family, scenarios):
    rank = int(os.environ["RANK"])
    if os.environ.get("DIST_JOB_DUMP_AFTER"):  # a hang prints where each rank stands, then exits
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["DIST_JOB_DUMP_AFTER"]), exit=True)
    processor = testing.build_processor(family)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows()), processor)
    plain = {"remove_unused_columns": False}
    runs = {
        "map": lambda: trainer_run("map", family, out, enc, processor, settings=trainer_settings(),
                                   num_train_epochs=1, save_strategy="steps", save_steps=1),
        "map_resume": lambda: trainer_run("map_resume", family, out, enc, processor, settings=trainer_settings(),
                                          num_train_epochs=1, resume=os.path.join(out, "map", "checkpoint-1")),
        "iter_save": lambda: trainer_run("iter_save", family, out, enc, processor, stream=True,
                                         settings=trainer_settings(), max_steps=4, save_strategy="steps", save_steps=2),
        "iter_resume": lambda: trainer_run("iter_resume", family, out, enc, processor, stream=True,
                                           settings=trainer_settings(), max_steps=4,
                                           resume=os.path.join(out, "iter_save", "checkpoint-2")),
        "map_gc": lambda: trainer_run("map_gc", family, out, enc, processor, settings=trainer_settings(),
                                      num_train_epochs=1, gradient_checkpointing=True),
        "budget": lambda: loop_run(family, enc, processor, budget=True),
        "budget_resume": lambda: budget_resume_run(family, enc, processor),
        "sft": lambda: sft_run(family, out, enc, processor),
        "grpo": lambda: grpo_run(family, out, processor),
        "best": lambda: best_run(family, out, enc, processor),
        "loop": lambda: loop_run(family, enc, processor),
        "rank_stream": lambda: rank_stream_run(family, out, enc, processor, per_rank=True),
        "full_stream": lambda: rank_stream_run(family, out, enc, processor, per_rank=False),
        "iter_padded": lambda: trainer_run("iter_padded", family, out, enc, processor, stream=True, settings=plain,
                                           collate={"pad_to_multiple_of": 128}, max_steps=2),
        "iter_split": lambda: trainer_run("iter_split", family, out, enc, processor, stream=True, max_steps=2,
                                          settings={**plain, "accelerator_config": {"split_batches": True}}),
        "iter_plain": lambda: trainer_run("iter_plain", family, out, enc, processor, stream=True,
                                          settings=plain, max_steps=2),
    }
    for name in scenarios:
        try:
            result = runs[name]()
        except Exception as e:  # noqa: BLE001  the test reads the error
            result = {"error": type(e).__module__ + "." + type(e).__name__, "message": str(e)[:2000],
                      "trace": traceback.format_exc()[-3000:]}
        with open(os.path.join(out, f"{name}.{rank}.json"), "w") as f:
            json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
