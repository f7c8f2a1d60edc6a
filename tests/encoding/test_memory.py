"""Memory bounded by the input (issue 15, item 4): encoding one big text row costs a fixed multiple
of its size, well under what the tokenizer alone costs on the same prompt in one call (long
texts are tokenized in verified pieces: mmpipe/encoding/tokenize.py).

Each figure comes from a fresh subprocess of the bench's memory case (`bench/memory.py`,
``--child``, quick size: a 1 MB row of varied words, ~830k tokens), which resets the peak RSS
after warming up and reads it after the one call. Before the fix, encoding with labels also kept
the tokenizer's input-id and attention-mask lists and its Rust encoding alive while converting
the offsets (+8% over the one-call tokenizer at 10 MB); tokenizing in pieces took the 10 MB row
from +3,032 MiB to +653 MiB (the one-call tokenizer: +3,096), i.e. ~69x the text, of which the
encoded record's own int64 arrays (ids, labels, token types, [3, L] positions, offsets) are most.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _child(what: str, workdir) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--child", what, "--quick", "--workdir", str(workdir)],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=600)  # a hang guard: a child took ~26 s at load average 5 here (180 s: 7x)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the peak RSS")
def test_text_row_with_labels_costs_a_fixed_multiple_of_its_size(tmp_path):
    ours, one_call = _child("enc_labels", tmp_path), _child("tok_labels", tmp_path)
    assert ours["check"] == one_call["check"]  # same token ids as the tokenizer on the whole prompt
    assert ours["input_bytes"] >= 900_000  # ~1 MB of text
    assert ours["peak_mib"] <= 0.35 * one_call["peak_mib"], (ours, one_call)  # measured 83 vs 397 MiB
    assert ours["peak_mib"] * 2**20 <= 120 * ours["input_bytes"], ours  # measured 87x
