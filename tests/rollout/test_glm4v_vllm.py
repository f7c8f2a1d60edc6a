"""GLM-4.1V vLLM prompts (`mmpipe.rollout.to_vllm_prompts`): one ``<|image|>`` per image inside
``<|begin_of_image|>``/``<|end_of_image|>`` (what vLLM's glm4_1v processor expands), the stored
resized images, and ``mm_processor_kwargs`` in GLM's ``size`` form under which the real
Glm4vProcessor - what vLLM calls - re-creates the row's ids, grids and pixel values exactly.

In the vLLM environment (scripts/envs/vllm.sh) a real ``vllm.LLM`` on the tiny GLM checkpoint
expands those prompts to each row's ``input_ids`` and samples tokens whose logprobs equal the
transformers forward on mmpipe's policy batch; it runs in its own process (this file as a
script: ``vllm.LLM`` spawns its engine, so it is built under ``if __name__ == "__main__"``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding.placeholders import expand_placeholders
from mmpipe.families import GLM4V
from mmpipe.rollout import to_vllm_prompts

FAM = GLM4V.name


@pytest.fixture(scope="module")
def proc():
    return testing.build_processor(FAM)


def _row(proc, images, idx=0):
    content = [{"type": "text", "text": f"Question {idx}:"}]
    for j in range(len(images)):
        content += [{"type": "image"}, {"type": "text", "text": f" (image {j})"}]
    return mmpipe.encode_row({"messages": [{"role": "user", "content": content}], "images": images}, proc,
                             labels=False)


def _reprocess(proc, prompt):
    """What vLLM does with the prompt: the HF processor on its text, images and mm_processor_kwargs."""
    text = proc.tokenizer.decode(prompt["prompt_token_ids"])
    images = prompt.get("multi_modal_data", {}).get("image")
    out = proc(text=[text], images=images, return_tensors="np", **prompt.get("mm_processor_kwargs", {}))
    return {k: np.asarray(v) for k, v in out.items()}


def test_prompts_hold_one_image_token_per_image_and_reprocess_to_the_row(proc):
    photos = [im.convert("RGB") for _, im in testing.sample_photos()][:2]
    rows = [_row(proc, [], 0), _row(proc, photos[:1], 1), _row(proc, photos + [testing.tiny_image(13, 200)], 2)]
    prompts = to_vllm_prompts(rows, proc)
    tok = proc.tokenizer
    image_id, start_id, end_id = (tok.convert_tokens_to_ids(t) for t in
                                  (GLM4V.image_token, GLM4V.vision_start_token, GLM4V.vision_end_token))
    assert "multi_modal_data" not in prompts[0]
    for row, prompt in zip(rows, prompts):
        ids = np.asarray(prompt["prompt_token_ids"])
        pads = np.flatnonzero(ids == image_id)
        assert len(pads) == row.num_images
        assert (ids[pads - 1] == start_id).all() and (ids[pads + 1] == end_id).all()
        np.testing.assert_array_equal(expand_placeholders(ids, row.image_grid_thw, family=proc), row.input_ids)
        if not row.num_images:
            continue
        kw = prompt["mm_processor_kwargs"]
        assert set(kw) == {"size"} and set(kw["size"]) == {"shortest_edge", "longest_edge"}
        again = _reprocess(proc, prompt)
        np.testing.assert_array_equal(again["input_ids"][0], row.input_ids)
        np.testing.assert_array_equal(again["image_grid_thw"], row.image_grid_thw)
        np.testing.assert_array_equal(again["pixel_values"], mmpipe.collate([row], processor=proc).pixel_values.numpy())


def test_stored_images_beyond_the_aspect_limit_are_not_resized_again():
    # 30 x 6000 (ratio 200) rounds to 28 x 5992 (ratio 214): the processor would refuse it, so do_resize=False
    big = testing.build_processor(FAM, max_pixels=2 * 28 * 28 * 300)
    row = _row(big, [testing.tiny_image(30, 6000)])
    assert tuple(row.image_grid_thw[0]) == (1, 2, 428)
    (prompt,) = to_vllm_prompts([row], big)
    assert prompt["mm_processor_kwargs"]["do_resize"] is False
    again = _reprocess(big, prompt)
    np.testing.assert_array_equal(again["input_ids"][0], row.input_ids)
    np.testing.assert_array_equal(again["pixel_values"], mmpipe.collate([row], processor=big).pixel_values.numpy())


def test_transformers_rollout_logprobs_equal_teacher_forcing(proc):
    """TransformersEngine.generate on GLM rows (left-padded, generate builds GLM's positions) ->
    rollout samples -> policy batch: teacher-forced logprobs == the sampled ones, and every
    response row's positions == the rule over prompt + response."""
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.rollout.transformers_engine import TransformersEngine
    from mmpipe.testing.invariants import assert_row_positions, logprob_gap, policy_logprobs

    model = testing.build_model(FAM)
    prompts = [_row(proc, [testing.tiny_image(48 + 20 * j, 64 + 12 * i, seed=7 * i + j) for j in range(k)], i)
               for i, k in enumerate([1, 0, 2])]
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=6, n=2, temperature=1.0,
                                                                            seed=3))
    samples = unbatch_rollout(prompts, gens)
    for side in ("left", "right"):
        batch = mmpipe.Collator(proc, padding_side=side)([s.to_row() for s in samples])
        assert logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples]) <= 1e-4
    for s in samples:
        assert_row_positions(s.to_row(), model=model)


@pytest.mark.needs_env("vllm")
def test_real_vllm_expands_the_prompts_to_the_rows(tmp_path):
    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"vLLM cannot run on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    out = tmp_path / "result.json"
    from helpers import VLLM_WORKER_S  # here: this file is also the worker script, run without tests/ on its path
    run = subprocess.run([sys.executable, __file__, str(tmp_path / "checkpoint"), str(out)], capture_output=True,
                         text=True, timeout=VLLM_WORKER_S, cwd=Path(__file__).resolve().parents[2])
    if run.returncode != 0 or not out.exists():
        pytest.fail(f"the GLM vLLM worker exited {run.returncode}:\n{(run.stdout + run.stderr)[-6000:]}")
    result = json.loads(out.read_text())
    print(f"\n[vllm glm4v] start {result['start_s']:.1f}s, rollout/training logprob gap {result['gap']:.2e}")
    assert result["processor"] == "Glm4vProcessor"
    assert result["images_per_row"] == [0, 1, 2, 3] and result["completions_per_row"] == [2] * 4
    assert result["prompt_ids_equal_rows"] == [True] * 4  # also checked by VLLMEngine for every request
    assert result["gap"] < 1e-4


def _vllm_worker(ckpt: str, out: str) -> None:
    """Save the tiny GLM checkpoint, start vllm.LLM on it, generate from mmpipe rows through
    VLLMEngine (which checks vLLM's expanded prompt ids == each row's input_ids) and compare
    vLLM's sampled-token logprobs with the transformers model's on the policy batch."""
    import time

    import torch
    import transformers
    import vllm

    from mmpipe.encoding.encoder import Encoder
    from mmpipe.offline.glm4v import save_checkpoint
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.rollout.vllm_engine import VLLMEngine
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    path = str(save_checkpoint(ckpt))
    proc = transformers.AutoProcessor.from_pretrained(path)
    model = transformers.Glm4vForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                                       attn_implementation="eager").eval()
    t = time.perf_counter()
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
                   limit_mm_per_prompt={"image": 3, "video": 0}, gpu_memory_utilization=0.1)
    start_s = time.perf_counter() - t
    photos = [im.convert("RGB") for _, im in testing.sample_photos()]
    sets = [[], [photos[0]], [testing.tiny_image(13, 200), testing.tiny_image(97, 211)],
            [photos[1], photos[2], testing.tiny_image(30, 600)]]
    rows = [_row(proc, images, i) for i, images in enumerate(sets)]
    assert all(r.fam.name == FAM for r in rows) and Encoder(proc).spec.resize_rule == "glm4v"
    prompts = to_vllm_prompts(rows, proc)
    reqs = llm.generate(prompts, vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    same = [list(o.prompt_token_ids) == r.input_ids.tolist() for o, r in zip(reqs, rows)]
    gens = VLLMEngine(llm, processor=proc).generate(rows, SamplingParams(max_new_tokens=12, n=2, temperature=1.0,
                                                                         seed=3))
    samples = unbatch_rollout(rows, gens, processor=proc)
    batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
    gap = logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples])
    Path(out).write_text(json.dumps({
        "processor": type(proc).__name__, "start_s": start_s, "prompt_ids_equal_rows": same, "gap": gap,
        "images_per_row": [r.num_images for r in rows], "completions_per_row": [g.n for g in gens]}))


if __name__ == "__main__":
    _vllm_worker(*sys.argv[1:3])
