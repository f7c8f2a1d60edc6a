"""Gemma 3 rows on real vLLM (the vLLM environment, scripts/envs/vllm.sh): mmpipe's prompts
(`to_vllm_prompts`: one ``<start_of_image>`` + the stored tile per image) expand in vLLM's
``gemma3_mm`` to exactly each row's ``input_ids`` (0..3 images per row), and the logprobs vLLM
gives its sampled tokens equal the transformers model's on mmpipe's rows (encoded with the
torchvision image processor vLLM loads; its tiles are reproduced bit for bit too). vLLM runs in its own
process (this file as a script: ``vllm.LLM`` spawns its engine, so it is built under
``if __name__ == "__main__"``)."""

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


def _rows(proc, **kw):
    photos = [im.convert("RGB") for _, im in testing.sample_photos()]
    sets = [[], [photos[0]], [testing.tiny_image(13, 200), testing.tiny_image(97, 211)],
            [photos[1], photos[2], testing.tiny_image(30, 60)]]
    rows = []
    for i, images in enumerate(sets):
        content = [{"type": "text", "text": f"Question {i}:"}]
        for j in range(len(images)):
            content += [{"type": "image"}, {"type": "text", "text": f" (image {j})"}]
        rows.append(mmpipe.encode_row({"messages": [{"role": "user", "content": content}], "images": images}, proc,
                                      labels=False, **kw))
    return rows


PAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}  # crops of the tiny 32x32 tiles


@pytest.mark.needs_env("vllm")
def test_real_vllm_expands_gemma3_prompts_to_the_rows(tmp_path):
    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"vLLM cannot run on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    out = tmp_path / "result.json"
    from helpers import VLLM_WORKER_S  # here: this file is also the worker script, run without tests/ on its path
    run = subprocess.run([sys.executable, __file__, str(tmp_path / "checkpoint"), str(out)], capture_output=True,
                         text=True, timeout=VLLM_WORKER_S, cwd=Path(__file__).resolve().parents[2])
    if run.returncode != 0 or not out.exists():
        pytest.fail(f"the Gemma 3 vLLM worker exited {run.returncode}:\n{(run.stdout + run.stderr)[-6000:]}")
    result = json.loads(out.read_text())
    print(f"\n[vllm gemma3] start {result['start_s']:.1f}s, rollout/training logprob gap {result['gap']:.2e} "
          f"(per row, 0..3 images: {', '.join(f'{g:.1e}' for g in result['gaps'])})")
    assert result["images_per_row"] == [0, 1, 2, 3]
    assert result["prompt_ids_equal_rows"] == [True] * 4
    assert result["gap"] < 1e-4
    # pixels="source" rows panned and scanned (several tiles per image): prompts from their files
    assert result["pan_and_scan_tiles"] == [0, 1, 8, 9]  # images of 1, 5 and 3 tiles
    assert result["pan_and_scan_ids_equal_rows"] == [True] * 4


@pytest.mark.needs_env("vllm")
@pytest.mark.parametrize("images_kwargs", [{}, {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}])
def test_torchvision_backend_rows_equal_its_processor(images_kwargs):
    """With torchvision importable (this environment), Gemma3ImageProcessor is the torchvision
    backend (what GPU users and vLLM load): mmpipe's tiles resize with torch's uint8 kernel and
    expand with its fused table, bit for bit (transformers 5.19 here)."""
    import transformers

    from mmpipe.offline.gemma3 import build_gemma3_processor

    proc = build_gemma3_processor()
    proc.image_processor = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})
    assert proc.image_processor.backend == "torchvision"
    images = [im.convert("RGB") for _, im in testing.sample_photos()] + \
        [testing.tiny_image(h, w) for h, w in [(1, 1), (1, 300), (33, 97), (130, 33)]]
    for im in images:
        raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
               "images": [im]}
        row = mmpipe.encode_row(raw, proc, images_kwargs=images_kwargs)
        text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=True)
        own = proc(text=[text], images=[im], return_tensors="np", **images_kwargs)
        assert np.array_equal(row.input_ids, own["input_ids"][0]), im.size
        assert np.array_equal(mmpipe.collate([row], processor=proc).pixel_values, own["pixel_values"]), im.size


def _teacher_forced(model, proc, row, generated: list) -> np.ndarray:
    """float [len(generated)]: the transformers model's logprobs of ``generated`` after ``row``."""
    import torch

    from mmpipe.records.row import MultiModalInputs

    ids = np.concatenate([row.input_ids, np.asarray(generated, np.int64)])
    full = MultiModalInputs(family=row.family, input_ids=ids, attention_mask=np.ones(len(ids), np.int64),
                       mm_token_type_ids=np.concatenate([row.mm_token_type_ids, np.zeros(len(generated), np.int64)]),
                       image_hw=row.image_hw, tiles_per_image=row.tiles_per_image, pixel_values_u8=row.pixel_values_u8)
    with torch.no_grad():
        logits = model(**mmpipe.collate([full], processor=proc).model_inputs()).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    n = len(row.input_ids)
    return np.array([float(lp[n - 1 + k, t]) for k, t in enumerate(generated)])


def _vllm_worker(ckpt: str, out: str) -> None:
    import time

    import torch
    import transformers
    import vllm

    from mmpipe.offline.gemma3 import save_gemma3_checkpoint
    from mmpipe.rollout import to_vllm_prompts

    path = str(save_gemma3_checkpoint(ckpt))
    proc = transformers.AutoProcessor.from_pretrained(path)
    assert proc.image_processor.backend == "torchvision"  # as vLLM loads it: mmpipe's rows use the same backend
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                                        attn_implementation="eager").eval()
    t = time.perf_counter()
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
                   limit_mm_per_prompt={"image": 3}, gpu_memory_utilization=0.1)
    start_s = time.perf_counter() - t
    rows = _rows(proc)
    reqs = llm.generate(to_vllm_prompts(rows, proc), vllm.SamplingParams(max_tokens=6, temperature=1.0, logprobs=0,
                                                                         seed=3), use_tqdm=False)
    gaps = []
    for row, req in zip(rows, reqs):
        done = req.outputs[0]
        want = np.array([done.logprobs[k][t].logprob for k, t in enumerate(done.token_ids)])
        gaps.append(float(np.abs(_teacher_forced(model, proc, row, list(done.token_ids)) - want).max()))
    pan = _rows(proc, images_kwargs=PAN, pixels="source")
    pan_outs = llm.generate(to_vllm_prompts(pan, proc), vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    Path(out).write_text(json.dumps({
        "pan_and_scan_ids_equal_rows": [list(o.prompt_token_ids) == r.input_ids.tolist() for o, r in zip(pan_outs, pan)],
        "pan_and_scan_tiles": [int(r.tiles_per_image.sum()) for r in pan],
        "start_s": start_s, "prompt_ids_equal_rows": [list(o.prompt_token_ids) == r.input_ids.tolist()
                                                      for o, r in zip(reqs, rows)],
        "gap": max(gaps), "gaps": gaps, "images_per_row": [r.num_images for r in rows]}))


if __name__ == "__main__":
    _vllm_worker(*sys.argv[1:3])
