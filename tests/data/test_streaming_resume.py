"""Streams resume exactly: a rank's `shard_for_rank` + `encode_stream` stream under torchdata's
StatefulDataLoader (num_workers=2, prefetch), SIGKILLed between checkpoints and resumed from the
last one, yields the batches (bytes of every tensor) of an uninterrupted run from that step on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mmpipe.data.streaming import exactly_once
from mmpipe.testing import invariants  # noqa: F401  (the stage harness; the rows are compared as bytes here)

TESTS = str(Path(__file__).resolve().parents[1])

CHILD = "TESTS = " + repr(TESTS) + "\n" + r'''import hashlib, json, os, signal, sys
sys.path.insert(0, TESTS)
import datasets, numpy as np, torch
from torchdata.stateful_dataloader import StatefulDataLoader
import mmpipe
from mmpipe.data.streaming import shard_for_rank, encode_stream
from conftest import processor_for
from helpers import raw_dataset

out, mode, kill_after, world, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
EPOCHS, EVERY = 2, 3
import pathlib
raw = raw_dataset(pathlib.Path(out) / mode)  # 14 rows, 0..3 images each
raw = datasets.concatenate_datasets([raw] * 3)
raw = raw.add_column("id", list(range(len(raw))))
stream = raw.to_iterable_dataset(num_shards=shards)
mine = shard_for_rank(stream, 0, world)
p = processor_for("qwen2_5_vl")
enc = encode_stream(mine, p, keep_columns=["id"], batch_size=4)
coll = mmpipe.Collator(p)
def collate(rows):
    ids = [r.pop("id") for r in rows]
    return ids, coll(rows)
def digest(b):
    h = hashlib.sha256()
    for k in sorted(vars(b)):
        v = getattr(b, k)
        if isinstance(v, torch.Tensor): v = v.numpy()
        h.update(k.encode()); h.update(v.tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
    return h.hexdigest()
loader = StatefulDataLoader(enc, batch_size=2, collate_fn=collate, num_workers=2, prefetch_factor=2)
step, first_epoch = 0, 0
if mode == "resume":
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    step, first_epoch = ck["step"], ck["epoch"]
    loader.load_state_dict(ck["loader"])
log = open(os.path.join(out, mode + ".jsonl"), "w")
for epoch in range(first_epoch, EPOCHS):
    enc.set_epoch(epoch)
    for ids, batch in loader:
        step += 1
        log.write(json.dumps({"step": step, "epoch": epoch, "ids": ids, "sha256": digest(batch)}) + "\n"); log.flush()
        if step % EVERY == 0:
            torch.save({"step": step, "epoch": epoch, "loader": loader.state_dict()}, os.path.join(out, "ckpt.tmp"))
            os.replace(os.path.join(out, "ckpt.tmp"), os.path.join(out, "ckpt.pt"))
        if step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def run_child(out, mode: str, kill_after: int, world: int, shards: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", CHILD, str(out), mode, str(kill_after), str(world), str(shards)],
                          env=env, capture_output=True, text=True, timeout=300)


def read_log(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


# (world size, shards): 4 shards over 2 ranks go whole to each rank ("shards"); over 3 ranks the
# rank keeps every 3rd row ("examples", a filter on stream positions)
@pytest.mark.parametrize("world,shards,kill_after", [(2, 4, 14), (3, 4, 10)], ids=["shards", "examples"])
def test_stream_sigkill_between_checkpoints_resumes_byte_equal(tmp_path, world, shards, kill_after):
    pytest.importorskip("torchdata.stateful_dataloader")
    ref, run_ = tmp_path / "ref", tmp_path / "run"
    ref.mkdir()
    run_.mkdir()
    done = run_child(ref, "full", -1, world, shards)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = run_child(run_, "run", kill_after, world, shards)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    resumed = run_child(run_, "resume", -1, world, shards)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = read_log(ref / "full.jsonl")
    before, after = read_log(run_ / "run.jsonl"), read_log(run_ / "resume.jsonl")
    ckpt = kill_after // 3 * 3
    assert ckpt < kill_after and len(before) == kill_after and before == want[:kill_after]
    assert after == want[ckpt:], "resumed batches differ from the uninterrupted run's"
    # resumed from the datasets stream state each worker saved, not by replaying the stream
    import torch

    snap = torch.load(run_ / "ckpt.pt", weights_only=False)["loader"]["_snapshot"]
    workers = snap["_worker_snapshots"]
    assert len(workers) == 2 and all(isinstance(w["dataset_state"], dict) and "examples_iterable" in w["dataset_state"]
                                     for w in workers.values()), workers
    per_epoch = len(want) // 2
    assert want[0]["epoch"] == 0 and want[-1]["epoch"] == 1 and per_epoch < ckpt, "resumed inside epoch 1"
    for e in (0, 1):  # the rank's rows, each once per epoch
        ids = [i for r in want if r["epoch"] == e for i in r["ids"]]
        assert exactly_once([ids], sorted(set(ids))).ok and len(ids) == len(set(ids)) > 0


def _shuffled_loader(world: int, epoch: int):
    import datasets
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mmpipe.data.streaming import epoch_shuffle, shard_for_rank

    raw = datasets.Dataset.from_dict({"id": list(range(48))}).to_iterable_dataset(num_shards=8)
    mine = epoch_shuffle(shard_for_rank(raw, 0, world), seed=5, buffer_size=6, num_workers=2)
    mine = mine.map(lambda b: {"twice": [2 * i for i in b["id"]]}, batched=True, batch_size=4)
    mine.set_epoch(epoch)
    return StatefulDataLoader(mine, batch_size=2, num_workers=2, prefetch_factor=2)


@pytest.mark.parametrize("world", [1, 2])
def test_epoch_shuffle_resumes_exactly_with_workers(world):
    """datasets' own shuffle (10 buffer shards) cannot load its state when a worker reads fewer
    shards; epoch_shuffle caps them, and the stream resumes exactly mid-epoch."""
    pytest.importorskip("torchdata.stateful_dataloader")
    ids = lambda batches: [i for b in batches for i in b["id"].tolist()]
    full = [list(_shuffled_loader(world, e)) for e in (0, 1)]
    assert ids(full[0]) != ids(full[1]), "a new order each epoch"
    for e in (0, 1):
        got = ids(full[e])
        assert sorted(got) == sorted(set(got)) and len(got) == 48 // world
    loader = _shuffled_loader(world, 1)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    fresh = _shuffled_loader(world, 1)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert ids(head) + ids(rest) == ids(full[1])
    assert all(a["twice"].tolist() == b["twice"].tolist() for a, b in zip(head + rest, full[1]))
