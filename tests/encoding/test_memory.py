"""Memory bounded by the input (issue 15, item 4): encoding one big text row costs no more peak
RSS than the tokenizer alone on the same prompt (the floor mmpipe cannot go under), within 10%.

Each figure comes from a fresh subprocess of the bench's memory case (`bench/memory.py`,
``--child``, quick size: a 1 MB row of varied words, ~830k tokens), which resets the peak RSS
after warming up and reads it after the one call. Before the fix, encoding with labels also kept
the tokenizer's input-id and attention-mask lists and its Rust encoding alive while converting
the offsets (+8% over the floor at 10 MB; now -2%).
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
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the peak RSS")
def test_text_row_with_labels_costs_no_more_than_the_tokenizer(tmp_path):
    ours, floor = _child("enc_labels", tmp_path), _child("tok_labels", tmp_path)
    assert ours["check"] == floor["check"]  # same token ids as the tokenizer on the rendered prompt
    assert ours["input_bytes"] >= 900_000  # ~1 MB of text
    assert ours["peak_mib"] <= 1.10 * floor["peak_mib"], (ours, floor)
