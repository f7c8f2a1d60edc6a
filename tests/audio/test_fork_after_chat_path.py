"""A forked ``datasets.map`` worker after the parent ran the processor's own chat path.

The chat path on a long clip (30 s at 44.1 kHz) runs torch's parallel STFT in the parent; a forked
worker's first parallel torch op then waits forever on the parent's OpenMP pool. On the processor
path (Qwen2.5-Omni) the worker's first processor call is the layout probe, which ran before mmpipe
set torch to one thread: ``map(num_proc=2)`` hung. Run in a child process so a hang fails the test
instead of the whole run.
"""

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("soundfile")
pytest.importorskip("datasets")

SCRIPT = """
import io, sys, tempfile, numpy as np, soundfile, datasets, mmpipe
from mmpipe.offline.qwen_omni import build_processor
proc, tmp = build_processor(), tempfile.mkdtemp()
def tone(n, rate, seed=0):
    t = np.arange(n) / rate
    noise = 0.05 * np.random.default_rng(seed).uniform(-1, 1, n)
    return (0.3 * np.sin(2 * np.pi * (300 + 40 * seed) * t) + noise).astype(np.float32)
def msgs(n):
    return [{"role": "user", "content": [{"type": "audio"}] * n + [{"type": "text", "text": "what?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
path = f"{tmp}/long.wav"
soundfile.write(path, tone(30 * 44100, 44100), 44100, subtype="FLOAT")
chat = [{"role": "user", "content": [{"type": "audio", "path": path}, {"type": "text", "text": "what?"}]},
        msgs(1)[1]]
proc.apply_chat_template(chat, tokenize=True, return_dict=True, return_tensors="np")
def wav(n, seed):
    buf = io.BytesIO(); soundfile.write(buf, tone(n, 22050, seed), 22050, format="WAV", subtype="PCM_16")
    return buf.getvalue()
rows = [{"messages": msgs(i % 3), "audios": [{"bytes": wav(8000 + 3000 * k + 500 * i, i + k), "path": None}
                                              for k in range(i % 3)]} for i in range(4)]
ds = datasets.Dataset.from_list(rows).cast_column("audios", datasets.List(datasets.Audio(decode=False)))
enc = ds.map(mmpipe.Encoder(proc), with_indices=True, num_proc=2, remove_columns=ds.column_names)
one = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(ds)]
assert [list(r["input_ids"]) for r in enc] == [r.input_ids.tolist() for r in one]
print("encoded", len(enc))
"""


def test_map_workers_after_the_chat_path_on_a_long_clip_do_not_hang():
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the map's workers too: they hold the pipes
        child.communicate()
        pytest.fail("datasets.map(num_proc=2) hung after the processor's chat path ran in the parent")
    assert child.returncode == 0 and "encoded 4" in out, err[-2000:]
