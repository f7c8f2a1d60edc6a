"""TokenBudgetBatchSampler: resumable (state_dict, StatefulDataLoader, SIGKILL) and elastic
(2 -> 3 -> 1 ranks in one epoch, every row exactly once, the same global order)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from mmpipe.batching.sampler import TokenBudgetBatchSampler
from mmpipe.data.streaming import exactly_once
from mmpipe.testing import invariants  # noqa: F401  (the stage harness; rows here are plain ids)

CASES = [
    dict(max_tokens=64, cost="padded", bucket_size=8),
    dict(max_tokens=64, cost="packed", bucket_size=None),
    dict(max_tokens=40, max_rows=3, cost="padded", bucket_size=None, oversize="alone"),
]


def lengths_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 33, size=n)


def take(samplers: list[TokenBudgetBatchSampler], steps) -> list[list[int]]:
    """``steps`` lockstep steps (all when None) of simulated ranks: the batches in step order."""
    its = [iter(s) for s in samplers]
    out = []
    k = 0
    while steps is None or k < steps:
        step = [next(it, None) for it in its]
        if all(b is None for b in step):
            break
        assert all(b is not None for b in step), "ranks got different numbers of batches"
        out += step
        k += 1
    return out


@pytest.mark.parametrize("kw", CASES)
def test_elastic_2_3_1_every_row_once_in_the_global_order(kw):
    n = 30
    lengths = lengths_of(n)
    if kw.get("oversize") == "alone":
        lengths[[4, 17]] = 50  # rows over the budget: batches of their own
    make = lambda R, r, seed=11: TokenBudgetBatchSampler(lengths, num_replicas=R, rank=r, seed=seed, **kw)
    one = make(1, 0)
    one.set_epoch(3)
    order = [i for b in one.global_batches() for i in b]
    assert sorted(order) == list(range(n))

    reads = []
    two = [make(2, r) for r in range(2)]
    for s in two:
        s.set_epoch(3)
    reads += take(two, 2)
    state = two[0].state_dict()
    assert state == two[1].state_dict(), "every rank saves the same global position"
    assert state["consumed_rows"] == sum(len(b) for b in reads)

    three = [make(3, r, seed=0) for r in range(3)]  # wrong seed and epoch: the state carries both
    for s in three:
        s.load_state_dict(state)
    reads += take(three, 1)
    state = three[2].state_dict()
    assert state["epoch"] == 3 and state["consumed_rows"] == sum(len(b) for b in reads)

    last = make(1, 0, seed=5)
    last.load_state_dict(state)
    last.set_epoch(3)  # the loaded epoch again: keeps the position
    rest = len(last)
    reads += take([last], None)
    assert rest == len(reads) - 2 * 2 - 3 * 1

    rows = [i for b in reads for i in b]
    cov = exactly_once([rows], range(n))
    assert cov.ok, str(cov)
    assert len(rows) == n == 30
    assert rows == order, "the ranks together read the epoch's global order"
    for b in reads:  # budgets kept (split and cut batches only shrink)
        assert len(b) >= 1
        if len(b) > 1 or lengths[b[0]] <= kw["max_tokens"]:
            cost = int(lengths[b].sum()) if kw["cost"] == "packed" else len(b) * int(lengths[b].max())
            assert cost <= kw["max_tokens"]
        assert kw.get("max_rows") is None or len(b) <= kw["max_rows"]
    assert last.state_dict()["consumed_rows"] == n


def test_resume_same_ranks_continues_exactly_and_next_epoch_starts_fresh():
    lengths = lengths_of(50, seed=2)
    full = TokenBudgetBatchSampler(lengths, max_tokens=64, seed=7)
    full.set_epoch(1)
    want = list(full)
    s = TokenBudgetBatchSampler(lengths, max_tokens=64, seed=7)
    s.set_epoch(1)
    it = iter(s)
    head = [next(it) for _ in range(4)]
    state = s.state_dict()
    fresh = TokenBudgetBatchSampler(lengths, max_tokens=64)  # epoch 0, seed 0: not told again
    fresh.load_state_dict(state)
    assert len(fresh) == len(want) - 4
    assert head + list(fresh) == want
    fresh.set_epoch(2)
    full.set_epoch(2)
    assert list(fresh) == list(full), "after the resumed epoch the next one is whole, same seed"
    assert list(full) == list(full), "iterating again without a state repeats the epoch"


def test_state_from_other_rows_or_budgets_is_refused():
    lengths = lengths_of(20)
    state = TokenBudgetBatchSampler(lengths, max_tokens=64).state_dict()
    with pytest.raises(ValueError, match="other rows or budgets"):
        TokenBudgetBatchSampler(lengths, max_tokens=65).load_state_dict(state)
    other = lengths.copy()
    other[0] += 1
    with pytest.raises(ValueError, match="other rows or budgets"):
        TokenBudgetBatchSampler(other, max_tokens=64).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        TokenBudgetBatchSampler(lengths, max_tokens=64).load_state_dict({"epoch": 0})


# ---- SIGKILL between checkpoints, StatefulDataLoader(num_workers=2, prefetch) -----------------

CHILD = r'''
import hashlib, json, os, signal, sys
import datasets, numpy as np, torch
from torchdata.stateful_dataloader import StatefulDataLoader
from mmpipe.batching.sampler import TokenBudgetBatchSampler

out, mode, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
EPOCHS, EVERY = 2, 4
rng = np.random.default_rng(0)
ds = datasets.Dataset.from_dict({
    "id": list(range(60)),
    "input_ids": [rng.integers(0, 1000, size=int(k)).tolist() for k in rng.integers(3, 33, size=60)],
})

def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
    return {"id": torch.tensor([r["id"] for r in rows]), "input_ids": ids}

# resumed: a sampler NOT told the seed (nor the epoch) again; the checkpoint carries both
sampler = TokenBudgetBatchSampler.from_dataset(ds, max_tokens=96, bucket_size=16, seed=7 if mode != "resume" else 0)
loader = StatefulDataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2, prefetch_factor=2)
step, first_epoch = 0, 0
if mode == "resume":
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    step, first_epoch = ck["step"], ck["epoch"]
    loader.load_state_dict(ck["loader"])
log = open(os.path.join(out, mode + ".jsonl"), "w")
for epoch in range(first_epoch, EPOCHS):
    sampler.set_epoch(epoch)
    for batch in loader:
        step += 1
        raw = batch["id"].numpy().tobytes() + batch["input_ids"].numpy().tobytes()
        log.write(json.dumps({"step": step, "epoch": epoch, "ids": batch["id"].tolist(),
                              "sha256": hashlib.sha256(raw).hexdigest()}) + "\n")
        log.flush()
        if step % EVERY == 0:
            tmp = os.path.join(out, "ckpt.tmp")
            torch.save({"step": step, "epoch": epoch, "loader": loader.state_dict()}, tmp)
            os.replace(tmp, os.path.join(out, "ckpt.pt"))
        if step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def run_child(script: str, out, mode: str, kill_after: int = -1) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", script, str(out), mode, str(kill_after)], env=env,
                          capture_output=True, text=True, timeout=300)


def read_log(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_sigkill_resume(script: str, tmp_path, kill_after: int, every: int = 4) -> tuple[list, list]:
    ref = tmp_path / "ref"
    run_ = tmp_path / "run"
    ref.mkdir()
    run_.mkdir()
    done = run_child(script, ref, "full")
    assert done.returncode == 0, done.stderr[-3000:]
    killed = run_child(script, run_, "run", kill_after)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    resumed = run_child(script, run_, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = read_log(ref / "full.jsonl")
    before = read_log(run_ / "run.jsonl")
    after = read_log(run_ / "resume.jsonl")
    assert len(before) == kill_after and before == want[:kill_after]
    ckpt = kill_after // every * every
    assert ckpt < kill_after, "the kill falls between checkpoints"
    assert after == want[ckpt:], "resumed batches differ from the uninterrupted run's"
    import torch

    main = torch.load(run_ / "ckpt.pt", weights_only=False)["loader"]["_snapshot"]["_main_snapshot"]
    state = main["_index_sampler_state"]  # the sampler's own state, not a replay of its iterator
    assert state["seed"] == 7 and 0 < state["consumed_rows"] <= 60, state
    return want, after


@pytest.mark.parametrize("kill_after", [18, 22])  # last checkpoint: the end of epoch 0 (step 16); mid epoch 1
def test_sigkill_between_checkpoints_resumes_byte_equal(tmp_path, kill_after):
    pytest.importorskip("torchdata.stateful_dataloader")
    want, after = check_sigkill_resume(CHILD, tmp_path, kill_after=kill_after)
    epochs = Counter(r["epoch"] for r in want)
    assert epochs == {0: 16, 1: 17}, epochs  # the layout the kill points above are chosen for
    for e in (0, 1):  # every row once per epoch in the reference
        ids = [i for r in want if r["epoch"] == e for i in r["ids"]]
        assert sorted(ids) == list(range(60))
    assert len(after) == len(want) - kill_after // 4 * 4


def test_elastic_2_3_1_through_stateful_dataloader_checkpoints():
    """The loader checkpoint of any rank resumes loaders on another number of ranks
    (num_workers=2, prefetching): 30 rows, 30 reads, in the global order."""
    pytest.importorskip("torchdata.stateful_dataloader")
    import datasets
    from torchdata.stateful_dataloader import StatefulDataLoader

    lengths = lengths_of(30, seed=4)
    ds = datasets.Dataset.from_dict({"id": list(range(30)), "input_ids": [[1] * int(k) for k in lengths]})

    def loaders(R, seed=7, checkpoint=None):
        out = []
        for r in range(R):
            s = TokenBudgetBatchSampler.from_dataset(ds, max_tokens=64, seed=seed, num_replicas=R, rank=r)
            s.set_epoch(2)
            dl = StatefulDataLoader(ds, batch_sampler=s, num_workers=2, prefetch_factor=2,
                                    collate_fn=lambda rows: [row["id"] for row in rows])
            if checkpoint is not None:
                dl.load_state_dict(checkpoint)
            out.append(dl)
        return out

    reads = []
    for R, steps, seed in ((2, 2, 7), (3, 1, 0), (1, None, 0)):
        dls = loaders(R, seed, None if not reads else checkpoint)
        its = [iter(dl) for dl in dls]
        k = 0
        while steps is None or k < steps:
            step = [next(it, None) for it in its]
            if step[0] is None:
                assert all(b is None for b in step)
                break
            reads += step
            k += 1
        checkpoint = dls[-1].state_dict()  # any rank's: the same global position
        del its
    one = TokenBudgetBatchSampler.from_dataset(ds, max_tokens=64, seed=7)
    one.set_epoch(2)
    rows = [i for b in reads for i in b]
    assert exactly_once([rows], range(30)).ok and len(rows) == 30
    assert rows == [i for b in one.global_batches() for i in b]
