"""torch's OpenMP pool does not survive fork(): a forked child whose parent already ran a parallel
torch op waits forever in its first parallel op, unless mmpipe sets torch to one thread there first
(`mmpipe._fork.torch_fork_safe`). Each route runs in a child process in its own session, killed
with its workers on timeout, so a hang fails the test instead of the whole run:

- ``pool_expand``: batches collated with ``pixels_on_device`` expanded by ``model_inputs("cpu")`` in a
  forked ``multiprocessing`` Pool (`mmpipe.images.pixels.u8_to_pixel_values_torch`'s gather; hung);
- ``map_video``: video rows (decode, torchvision-rule frame resize) encoded by
  ``datasets.map(num_proc=2)``;
- ``pool_collate`` / ``pool_pack``: long text rows (8 x ~4,500 tokens: torch's ops split the work
  past ~32k elements) collated with `Collator` + ``model_inputs`` and packed with `PackingCollator`
  in a forked Pool (``labels != -100`` in ``model_inputs``, the mask of ``pack_batch``; both hung).
"""

import os

import pytest

from helpers import run_child_group

pytest.importorskip("datasets")
pytest.importorskip("av")

HEAD = """
import sys, multiprocessing as mp, numpy as np, torch, datasets, mmpipe
sys.path.insert(0, {tests!r})
from helpers import make_video
from PIL import Image
from mmpipe.processors import load_processor
proc = load_processor("testing:qwen2_vl")
rng = np.random.default_rng(0)
def msgs(kind):
    return [{{"role": "user", "content": [{{"type": kind}}, {{"type": "text", "text": "what?"}}]}},
            {{"role": "assistant", "content": [{{"type": "text", "text": "ok"}}]}}]
def parent_op():  # the parent has used torch's OpenMP pool
    torch.nn.functional.pad(torch.randn(1, 1, 2_000_000), (200, 200), mode="reflect")
    (torch.randn(1000, 1000) @ torch.randn(1000, 1000)).sum()
"""

ROUTES = {
    "pool_expand": """
rows = [{"messages": msgs("image"), "images": [Image.fromarray(rng.integers(0, 255, (224, 224, 3), np.uint8))]}
        for _ in range(4)]
enc = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(rows)]
col = mmpipe.Collator(proc, pixels_on_device=True)
want = col(enc[:2]).model_inputs("cpu")["pixel_values"]
parent_op()
def work(i):
    return col(enc[i:i + 2]).model_inputs("cpu")["pixel_values"].numpy()
with mp.get_context("fork").Pool(2) as p:
    got = p.map(work, [0, 2])
assert np.array_equal(got[0], want.numpy())
print("done", len(got))
""",
    "map_video": """
rows = [{"messages": msgs("video"), "videos": [make_video(6, 4, 120, 160, seed=i)]} for i in range(4)]
ds = datasets.Dataset.from_list(rows)
parent_op()
enc = ds.map(mmpipe.Encoder(proc), with_indices=True, num_proc=2, remove_columns=ds.column_names)
print("done", len(enc))
""",
    "pool_collate": """
enc = long_rows()
col = mmpipe.Collator(proc)
want = col(enc).model_inputs("cpu")["labels"].numpy()
parent_op()
with mp.get_context("fork").Pool(2) as p:
    got = p.map(collate_labels, [0, 0])
assert all(np.array_equal(g, want) for g in got)
print("done", len(got))
""",
    "pool_pack": """
from mmpipe.batching.packing import PackingCollator
enc = long_rows()
col = PackingCollator(proc)
want = col(enc).input_ids.shape[-1]
parent_op()
with mp.get_context("fork").Pool(2) as p:
    got = p.map(pack_length, [0, 0])
assert got == [want, want]
print("done", len(got))
""",
}

LONG_ROWS = """
def long_rows():
    text = " ".join(["word"] * 4500)
    rows = [{"messages": [{"role": "user", "content": [{"type": "text", "text": text}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "ok " * 50}]}]} for _ in range(8)]
    return [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(rows)]
def collate_labels(_):
    return col(enc).model_inputs("cpu")["labels"].numpy()
def pack_length(_):
    return col(enc).input_ids.shape[-1]
"""


def run_child(script: str, timeout: float = 180):
    """Run ``script`` in a child process group; a hang (past ``timeout``) kills it and its workers and fails."""
    out = run_child_group(script, timeout, "forked workers hung after the parent ran a parallel torch op")
    assert "done" in out, out[-2000:]


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_forked_workers_after_a_parent_torch_op_do_not_hang(route):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run_child(HEAD.format(tests=tests) + LONG_ROWS + ROUTES[route])


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_fork_safe_lock_held_by_another_thread_is_free_in_a_forked_child(reentrant):
    """`mmpipe._fork.ForkSafeLock` (the encoder's probe and stats locks, the image file locks, the
    packer classes' lock): a child forked while a parent's thread holds it gets a fresh lock, not one
    that stays held forever."""
    run_child(f"""
import os, threading
from mmpipe._fork import ForkSafeLock
lock, held, release = ForkSafeLock(reentrant={reentrant}), threading.Event(), threading.Event()
def hold():
    with lock:
        held.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    with lock:
        os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
assert os.waitstatus_to_exitcode(status) == 0
print("done")
""", timeout=60)
