"""Nothing hangs when a worker dies with mmpipe code in the loop (error-routes hunt, guards).

A worker that exits abruptly (``os._exit``, what the kernel's OOM killer leaves behind) or raises
``MemoryError`` inside mmpipe code, under ``datasets.map(num_proc=2)`` (`mmpipe.encode_dataset`) and
a torch ``DataLoader(num_workers=2)`` (`mmpipe.Collator`, `mmpipe.data.streaming.encode_stream`):
the caller gets an error, never a hang. Under ``on_error="skip"`` a ``MemoryError`` raised while
encoding one row is that row's record (stage ``encode``), counted like any failure. Each route runs
in a child process in its own session, killed with its workers on timeout."""

from __future__ import annotations

import pytest

from helpers import run_child_group

HANG_S = 240  # generous: the shared machine is slow; a hang is forever

HEAD = """
import os, sys, datasets, torch, mmpipe
from torch.utils.data import DataLoader
from mmpipe import testing
from mmpipe.encoding.encoder import Encoder
proc = testing.build_processor("qwen2_vl")
def raw(i):
    return {"id": i, "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"row {i}"}]},
                                  {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
            "images": [testing.tiny_image(28, 28, seed=i)]}
RAWS = [raw(i) for i in range(8)]
real = Encoder._encode_row
def dying(how):
    def encode_row(self, example, idx=None, prefetched=None):
        if example.get("id") == 5:
            if how == "exit":
                os._exit(9)
            raise MemoryError("out of memory in row 5")
        return real(self, example, idx, prefetched)
    return encode_row
def outcome(fn):
    try:
        fn()
        return "no error"
    except BaseException as e:
        return type(e).__name__
"""

ROUTES = {
    "encode_dataset": """
ds = datasets.Dataset.from_list(RAWS)
Encoder._encode_row = dying("exit")
print("exit", outcome(lambda: mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=2, keep_columns=["id"])))
Encoder._encode_row = dying("memory")
print("memory", outcome(lambda: mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=2)))
out, report = mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=2, on_error="skip")
print("skip", len(out), [(e["row"], e["stage"]) for e in report.errors], "MemoryError" in report.errors[0]["reason"])
print("done")
""",
    "dataloader": """
rows = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(RAWS)]
class Items(torch.utils.data.Dataset):
    def __init__(self, how):
        self.how = how
    def __len__(self):
        return len(rows)
    def __getitem__(self, i):
        if i == 5:
            if self.how == "exit":
                os._exit(9)
            raise MemoryError("out of memory in item 5")
        return rows[i]
for how in ("exit", "memory"):
    loader = DataLoader(Items(how), batch_size=2, num_workers=2, collate_fn=mmpipe.Collator(proc))
    print(how, outcome(lambda: list(loader)))
Encoder._encode_row = dying("exit")
stream = mmpipe.data.streaming.encode_stream(datasets.Dataset.from_list(RAWS).to_iterable_dataset(num_shards=2), proc,
                                             batch_size=2)
print("stream", outcome(lambda: list(DataLoader(stream, batch_size=2, num_workers=2, collate_fn=mmpipe.Collator(proc)))))
print("done")
""",
}

WANT = {
    "encode_dataset": ["exit RuntimeError", "memory MemoryError", "skip 7 [(5, 'encode')] True", "done"],
    "dataloader": ["exit RuntimeError", "memory MemoryError", "stream RuntimeError", "done"],
}


def run_child(script: str, timeout: float = HANG_S) -> list:
    """``script``'s output lines; a hang (past ``timeout``) kills it and its workers and fails."""
    return run_child_group(script, timeout, "a dead worker hung the caller").splitlines()


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_dying_worker_gives_an_error_not_a_hang(route):
    assert run_child(HEAD + ROUTES[route]) == WANT[route]
