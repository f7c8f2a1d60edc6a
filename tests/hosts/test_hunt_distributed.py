"""Two-process (gloo, CPU) training loops: transformers.Trainer and TRL's SFTTrainer with
TrainerCollator (resumed, streaming, load_best_model_at_end, gradient checkpointing), mmpipe's
VisionGRPOTrainer, plain DDP loops over DistributedSampler and TokenBudgetBatchSampler (resumed
under StatefulDataLoader). Each family runs ONE 2-rank job (tests/hosts/dist_job.py; each
rank in its own session, killed past its deadline) whose per-scenario records these tests read:
the dataset rows of every batch the model received, whether the batch equalled a fresh collate of
those rows tensor for tensor (pixels vs grids, positions [3, B, L]), and the losses."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_job.py")
N_ROWS = 10  # dist_job.N_ROWS; rows i % 3 == 0 hold no image
TIMEOUT = 180  # the whole job (about 25 s here); each rank dumps its stack and exits 30 s before
QWEN = ["map", "map_resume", "iter_save", "iter_resume", "sft", "grpo", "best", "loop", "budget", "budget_resume", "full_stream", "rank_stream",
        "map_gc", "iter_plain"]
GEMMA = ["map", "iter_save"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(out, family: str, scenarios: list[str], world: int = 2) -> dict:
    """Run the 2-rank job; {scenario: [rank 0 record, rank 1 record]} for the scenarios that
    finished on both ranks, and "_log" with the ranks' output (a hang leaves the rest missing)."""
    port, procs = free_port(), []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", DIST_JOB_DUMP_AFTER=str(TIMEOUT - 30))
        procs.append(subprocess.Popen([sys.executable, JOB, str(out), family, *scenarios], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
    logs, deadline = [], time.monotonic() + TIMEOUT
    try:
        for p in procs:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        logs.append("killed past the deadline")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    found = {"_log": "\n".join(log[-4000:] for log in logs)}
    for name in scenarios:
        paths = [os.path.join(out, f"{name}.{r}.json") for r in range(world)]
        if all(os.path.exists(p) for p in paths):
            found[name] = [json.load(open(p)) for p in paths]
    return found


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl", QWEN)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("gemma3"), "gemma3", GEMMA)


def trained(job: dict, name: str) -> list[dict]:
    """Both ranks' records of a scenario that ran without an error, every batch intact."""
    assert name in job, f"{name} did not finish on both ranks:\n{job['_log']}"
    ranks = job[name]
    for rank, rec in enumerate(ranks):
        assert "error" not in rec, (rank, rec.get("trace"))
        assert all(rec["intact"]), (rank, rec["notes"])
        assert all(math.isfinite(x) for x in rec["losses"]), rec["losses"]
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"])  # DDP needs the same step count
    return ranks


def assert_epoch(steps: list[list[list[int]]]):
    """One epoch over both ranks (steps[rank][step] = rows): every row, and a row twice only where
    accelerate evens out the last step with rows of the epoch's first batch (even_batches)."""
    seen = Counter(i for rank in steps for batch in rank for i in batch)
    assert sorted(seen) == list(range(N_ROWS)), seen
    twice = {i for i, k in seen.items() if k > 1}
    assert all(k <= 2 for k in seen.values()) and twice <= set(steps[0][0]), (steps, twice)
    assert not twice & {i for rank in steps for batch in rank[:-1] for i in batch} - set(steps[0][0])


def test_trainer_each_row_once_per_epoch_and_batches_intact(qwen):
    ranks = trained(qwen, "map")
    assert ranks[0]["steps"] == 3 and ranks[0]["losses"] == ranks[1]["losses"]
    assert_epoch([r["batches"] for r in ranks])


def test_sft_trainer_on_two_ranks_sees_the_same_rows_as_the_trainer(qwen):
    ranks = trained(qwen, "sft")
    assert [r["batches"] for r in ranks] == [r["batches"] for r in qwen["map"]]


def test_vision_grpo_trainer_on_two_ranks(qwen):
    """mmpipe's VisionGRPOTrainer with GRPOConfig's defaults (gradient checkpointing on; TRL builds
    DDP with find_unused_parameters=True) and prompts of 0..3 images: 2 steps on each rank, every
    forward's pixel rows matching its grids."""
    ranks = trained(qwen, "grpo")
    assert [r["steps"] for r in ranks] == [2, 2] and all(len(r["intact"]) > 2 for r in ranks)


def test_load_best_model_at_end_on_two_ranks(qwen):
    """Evaluation every step on 5 rows (uneven over 2 ranks), best = step 1 (greater_is_better): both
    ranks agree on the eval losses and end with checkpoint-1's weights (restore_checkpoint_weights)."""
    ranks = trained(qwen, "best")
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(ranks[0]["losses"]) == 3
    assert [r["notes"][0].rsplit("/", 1)[-1] for r in ranks] == ["checkpoint-1"] * 2


def test_resumed_run_continues_with_the_uninterrupted_runs_rows_per_rank(qwen):
    """Checkpoint at step 1 of 3, restarted on 2 ranks: each rank's remaining batches and the
    losses of those steps equal the uninterrupted run's (weights through restore_checkpoint_weights)."""
    full, resumed = trained(qwen, "map"), trained(qwen, "map_resume")
    for f, r in zip(full, resumed):
        assert r["batches"] == f["batches"][1:]
        assert r["losses"][1:] == pytest.approx(f["losses"][1:], abs=1e-5)


def test_streaming_shards_rows_per_rank_and_resumes(qwen):
    full, resumed = trained(qwen, "iter_save"), trained(qwen, "iter_resume")
    assert_epoch([r["batches"][:3] for r in full])  # 10 rows, 2 x 2 per step: the epoch is 3 steps
    for f, r in zip(full, resumed):
        assert r["batches"] == f["batches"][2:]


def test_trainer_takes_the_whole_encoded_stream_not_a_ranks_part(qwen):
    """encode_stream over 2 raw shards: the Trainer gives each rank whole shards, every row once. A
    rank's part (shard_for_rank, the plain-loop recipe) is cut again by accelerate: rows never
    trained, as docs/how-to/sft.md and scale-out.md warn (accelerate's behaviour, pinned here)."""
    whole = trained(qwen, "full_stream")
    assert sorted(i for r in whole for b in r["batches"] for i in b) == list(range(N_ROWS))
    part = trained(qwen, "rank_stream")
    assert len({i for r in part for b in r["batches"] for i in b}) < N_ROWS


def test_gradient_checkpointing_with_an_imageless_step_on_one_rank_does_not_hang(qwen):
    """trainer_settings() + gradient_checkpointing=True: step 2 gives rank 0 two text-only rows while
    rank 1 has images; with the Trainer's find_unused_parameters=False the ranks hung (killed)."""
    ranks = trained(qwen, "map_gc")
    steps = list(zip(*[r["batches"] for r in ranks]))
    assert any(all(i % 3 == 0 for i in a) != all(i % 3 == 0 for i in b) for a, b in steps), steps
    assert [r["batches"] for r in ranks] == [r["batches"] for r in qwen["map"]]
    assert ranks[0]["losses"] == pytest.approx(qwen["map"][0]["losses"], abs=1e-5)


def test_plain_ddp_loop_distributed_sampler_with_set_epoch(qwen):
    ranks = trained(qwen, "loop")
    for epoch in (slice(0, 3), slice(3, 6)):
        rows = [i for r in ranks for b in r["batches"][epoch] for i in b]
        assert sorted(rows) == list(range(N_ROWS))  # 10 rows on 2 ranks: no padding row
    assert ranks[0]["batches"][:3] != ranks[0]["batches"][3:]  # set_epoch reshuffled


def test_token_budget_sampler_on_two_ranks_each_row_once_per_epoch(qwen):
    ranks = trained(qwen, "budget")
    per_epoch = [len(b) for b in ranks[0]["batches"]]
    for r in ranks:
        assert r["epochs"] == [0, len(r["batches"]) // 2]
    half = ranks[0]["epochs"][1]
    for epoch in (slice(0, half), slice(half, None)):
        rows = [i for r in ranks for b in r["batches"][epoch] for i in b]
        assert sorted(rows) == list(range(N_ROWS)), (per_epoch, rows)


def test_token_budget_sampler_resumes_under_stateful_dataloader_on_two_ranks(qwen):
    """Epoch 1 stopped after 2 steps, the loader state saved per rank, a fresh StatefulDataLoader
    with a worker loads it (load_loader_state): each rank's batches equal the uninterrupted epoch's."""
    full, resumed = trained(qwen, "budget"), trained(qwen, "budget_resume")
    for f, r in zip(full, resumed):
        assert r["cut"] == 2 and r["batches"] == f["batches"][f["epochs"][1]:]


def test_streaming_with_accelerates_default_dispatch_is_refused(qwen):
    """An IterableDataset without trainer_settings()' dispatch_batches=False: rank 0 builds every
    batch and accelerate slices pixel_values [N, D] / position_ids [3, B, L] on dim 0."""
    assert "iter_plain" in qwen, qwen["_log"]
    err = qwen["iter_plain"][0]  # rank 0 collates; was accelerate's RuntimeError (or a model size mismatch)
    assert err.get("error") == "mmpipe.errors.ArgumentError" and "dispatch_batches" in err["message"], err


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_dispatched_batches_are_refused_before_accelerate_slices_them(family, tmp_path):
    """One process, one row per step: accelerate's dispatch keeps input_ids whole but cuts
    pixel_values to B patch rows / B images (Gemma 3: the 2-image row got 1); the forward then
    failed with a bare size mismatch. Refused by name at collate instead."""
    import datasets
    from transformers import Trainer, TrainingArguments

    import mmpipe
    from mmpipe import testing
    from mmpipe.hosts import TrainerCollator

    from dist_job import rows

    processor = testing.build_processor(family)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(rows(3)), processor)  # 0, 1, 2 images
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=1, max_steps=3, report_to=[],
                             use_cpu=True, save_strategy="no", remove_unused_columns=False)
    trainer = Trainer(model=testing.build_model(family), args=args, train_dataset=enc.to_iterable_dataset(),
                      data_collator=TrainerCollator(processor))
    with pytest.raises(mmpipe.errors.ArgumentError, match="dispatch_batches.: False") as e:
        trainer.train()
    assert ("position_ids" if family == "qwen2_vl" else "pixel_values") in str(e.value)  # [3, B, L]; [I, 3, S, S]


def test_one_d_family_each_row_once_per_epoch_map_style_and_streaming(gemma):
    assert_epoch([r["batches"] for r in trained(gemma, "map")])
    assert_epoch([r["batches"][:3] for r in trained(gemma, "iter_save")])
