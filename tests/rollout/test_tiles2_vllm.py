"""InternVL and LLaVA-OneVision with real vLLM (the vLLM environment, scripts/envs/vllm.sh): the
prompt form vLLM takes for these models - the rendered chat text with ONE ``<IMG_CONTEXT>`` /
``<image>`` per image, and the ORIGINAL images in ``multi_modal_data`` - expands to exactly
the ids mmpipe writes (`mmpipe.images.internvl` / `onevision` placeholder texts), for rows of
0..3 images; and vLLM's sampled-token logprobs equal a transformers forward of the same
checkpoint on the processor's own inputs (vLLM's processor is the torchvision backend there,
so the forward uses that backend's pixels too).

The uint8 tiles cannot stand in for the originals (vLLM re-tiles from the original image:
InternVL's thumbnail and OneVision's base tile are resizes of it), so mmpipe's prompts
(`to_vllm_prompts`) carry the source images: rows encoded with ``pixels="source"`` give
prompts that real vLLM expands to exactly the rows' ids too.

vLLM runs in its own process (this file as a script: ``vllm.LLM`` spawns its engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmpipe.offline.tile_builders import TILED2_FAMILIES

# rows for vLLM in its multi-image mode: LLaVA-OneVision's flat one (every image tiled; the default
# per-conversation rows of several images are refused by to_vllm_prompts, issue 28.4)
VLLM_MODE = {"llava_onevision": {"multi_image": "flat"}}


@pytest.mark.needs_env("vllm")
@pytest.mark.parametrize("name", TILED2_FAMILIES)
def test_real_vllm_expands_one_placeholder_per_image_to_the_rows(name, tmp_path):
    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"vLLM cannot run on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    out = tmp_path / "result.json"
    from helpers import VLLM_WORKER_S  # here: this file is also the worker script, run without tests/ on its path
    run = subprocess.run([sys.executable, __file__, name, str(tmp_path / "checkpoint"), str(out)],
                         capture_output=True, text=True, timeout=VLLM_WORKER_S, cwd=Path(__file__).resolve().parents[2])
    if run.returncode != 0 or not out.exists():
        pytest.fail(f"the {name} vLLM worker exited {run.returncode}:\n{(run.stdout + run.stderr)[-6000:]}")
    result = json.loads(out.read_text())
    print(f"\n[vllm {name}] start {result['start_s']:.1f}s, rollout/forward logprob gap {result['gap']:.2e} "
          f"(the forward on PIL-backend pixels, mmpipe's: {result['gap_pil']:.2e})")
    assert result["images_per_row"] == [0, 1, 2, 3]
    assert result["prompt_ids_equal_rows"] == [True] * 4
    assert result["mmpipe_prompts_equal_rows"] == [True] * 4  # to_vllm_prompts of pixels="source" rows
    assert result["gap"] < 1e-4


def _expanded_ids(proc, module, name, text, images):
    """The ids mmpipe writes for ``text`` (one placeholder per image): each placeholder
    replaced by the family module's text, then one tokenizer call."""
    ip = proc.image_processor
    if name == "internvl":
        ip.crop_to_patches = True  # what InternVLProcessor passes its image processor
    parts = text.split(proc.image_token)
    spliced = parts[0] + "".join(module.expand_placeholder(im.height, im.width, proc, ip) + rest
                                 for im, rest in zip(images, parts[1:]))
    return proc.tokenizer(spliced)["input_ids"]


def _vllm_worker(name: str, ckpt: str, out: str) -> None:
    import importlib
    import time

    import numpy as np
    import torch
    import transformers
    import vllm

    import mmpipe
    from mmpipe import testing
    from mmpipe.offline.tile_builders import build_tiled2_processor, save_tiled2_checkpoint
    from mmpipe.rollout import to_vllm_prompts

    path = str(save_tiled2_checkpoint(name, ckpt))
    proc = transformers.AutoProcessor.from_pretrained(path)
    module = importlib.import_module("mmpipe.images." + ("internvl" if name == "internvl" else "onevision"))
    cls = getattr(transformers, type(proc).__name__.replace("Processor", "ForConditionalGeneration"))
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    photos = [im.convert("RGB") for _, im in testing.sample_photos()]
    sets = [[], [photos[1]], [photos[0], testing.tiny_image(13, 200)], [photos[2], photos[1], testing.tiny_image(70, 30)]]
    texts, prompts, rows, src_rows = [], [], [], []
    pil = build_tiled2_processor(name)  # mmpipe's rows (the PIL backend: the same ids)
    for k, images in enumerate(sets):
        msgs = [{"role": "user", "content": [{"type": "image"}] * len(images) + [{"type": "text", "text": f"Q{k}?"}]}]
        src_rows.append(mmpipe.encode_row({"messages": msgs, "images": images}, pil, pixels="source", labels=False,
                                          images_kwargs=VLLM_MODE.get(name)))
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        texts.append(text)
        rows.append(_expanded_ids(proc, module, name, text, images))
        prompt = {"prompt_token_ids": proc.tokenizer(text)["input_ids"]}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        prompts.append(prompt)
    t = time.perf_counter()
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
                   limit_mm_per_prompt={"image": 3, "video": 0}, gpu_memory_utilization=0.1)
    start_s = time.perf_counter() - t
    outs = llm.generate(prompts, vllm.SamplingParams(max_tokens=6, temperature=1.0, logprobs=0, seed=3), use_tqdm=False)
    same = [list(o.prompt_token_ids) == ids for o, ids in zip(outs, rows)]
    mm_outs = llm.generate(to_vllm_prompts(src_rows, pil), vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    mmpipe_same = [list(o.prompt_token_ids) == r.input_ids.tolist() == ids for o, r, ids in zip(mm_outs, src_rows, rows)]
    gaps = {"torchvision": 0.0, "pil": 0.0}  # vLLM's image backend here, and mmpipe's (the PIL processor)
    for backend, p in (("torchvision", proc), ("pil", build_tiled2_processor(name))):
        for o, text, images in zip(outs, texts, sets):
            inputs = p(text=[text], images=images or None, return_tensors="pt")
            gen = list(o.outputs[0].token_ids)
            ids = torch.cat([inputs["input_ids"], torch.tensor([gen])], dim=1)
            kw = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "batch_num_images")}
            with torch.no_grad():
                logp = model(input_ids=ids, **kw).logits[0].log_softmax(-1)
            n = inputs["input_ids"].shape[1]
            mine = [float(logp[n - 1 + i, tok]) for i, tok in enumerate(gen)]
            theirs = [lp[tok].logprob for lp, tok in zip(o.outputs[0].logprobs, gen)]
            gaps[backend] = max(gaps[backend], float(np.max(np.abs(np.asarray(mine) - np.asarray(theirs)))))
    Path(out).write_text(json.dumps({"start_s": start_s, "prompt_ids_equal_rows": same, "gap": gaps["torchvision"],
                                     "mmpipe_prompts_equal_rows": mmpipe_same,
                                     "gap_pil": gaps["pil"], "images_per_row": [len(s) for s in sets]}))


if __name__ == "__main__":
    _vllm_worker(*sys.argv[1:4])
