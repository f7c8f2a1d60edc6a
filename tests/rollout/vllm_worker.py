"""Real vLLM on one tiny family, run as its own process (``vllm.LLM`` spawns its engine, so it
is built under ``if __name__ == "__main__"``); used by tests/rollout/test_vllm_real.py.

    python tests/rollout/vllm_worker.py FAMILY WORK_DIR OUT_JSON [async]

Saves the family's vLLM-loadable checkpoint in WORK_DIR (`mmpipe.offline.checkpoints`), loads
its processor (the stock class; the torchvision backend where torchvision imports) and model,
starts one ``vllm.LLM`` and, for each image backend mmpipe can encode with ("pil": mmpipe's
pixels before issue 16; "torchvision": the engine's), encodes rows with 0, 1, 2 and 3 images
of several sizes, samples n=2 completions of 24 tokens at temperature 1.0 through
`VLLMEngine`, turns them into rollout samples and a policy batch, and compares vLLM's
sampled-token logprobs with the transformers model's logprobs on that batch. The same rows
are also given to vLLM with the ORIGINAL images (what a pipeline that hands vLLM the raw
images does) instead of mmpipe's stored resized ones. Writes everything to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

QUESTION = "Describe what you see, then count the objects."


def raw_rows(photos):
    """Rows with 0, 1, 2 and 3 images: a photo, random images of odd sizes, a 1:60 strip."""
    from mmpipe import testing

    rand = [testing.tiny_image(h, w, seed=s) for s, (h, w) in enumerate([(120, 160), (37, 101), (5, 300), (333, 29)])]
    image_sets = [[], [photos[0]], [rand[0], rand[1]], [photos[1], rand[2], rand[3]], [rand[1]]]
    rows = []
    for i, images in enumerate(image_sets):
        content = [{"type": "text", "text": f"Row {i}. {QUESTION}"}]
        for j in range(len(images)):
            content += [{"type": "image"}, {"type": "text", "text": f" (picture {j})"}]
        rows.append({"messages": [{"role": "user", "content": content}], "images": images})
    return rows


def run_backend(backend, llm, proc, model, raws, params):
    import mmpipe
    from mmpipe.encoding.encoder import Encoder
    from mmpipe.rollout.inputs import to_vllm_prompts
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.rollout.vllm_engine import VLLMEngine, generation_from_request_output
    from mmpipe.records.generation import Generation
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    enc = Encoder(proc, labels=False, image_backend=backend)
    rows = [enc.encode_row(r, i) for i, r in enumerate(raws)]
    engine = VLLMEngine(llm, processor=proc)
    out = {"backend": backend}

    def gap(gens: list[Generation], key: str):
        samples = unbatch_rollout(rows, gens, processor=proc)
        batch = mmpipe.collate([s.to_row() for s in samples], processor=proc, spec=enc.spec)
        got = policy_logprobs(model, batch)
        want = [s.logprobs for s in samples]
        out[key] = logprob_gap(got, want)
        out[key + "_per_row"] = [float(np.abs(g - w).max()) if len(w) else 0.0 for g, w in zip(got, want)]
        return samples, batch

    t = time.perf_counter()
    gens = engine.generate(rows, params)  # checks vLLM's expanded prompt ids == each row's input_ids
    out["generate_s"] = time.perf_counter() - t
    samples, batch = gap(gens, "engine_gap")
    out["images_per_row"] = [r.num_images for r in rows]
    out["completions_per_row"] = [g.n for g in gens]
    out["response_lengths"] = [len(s.response_ids) for s in samples]
    out["finish_reasons"] = [s.finish_reason for s in samples]
    out["distinct_in_group"] = [len({tuple(c.token_ids) for c in g.completions}) for g in gens]
    out["policy_batch"] = {"batch_size": batch.batch_size, "labelled": int((batch.labels != -100).sum()),
                           "pixel_rows": int(batch.pixel_values.shape[0]) if batch.pixel_values is not None else 0}
    # the same rows with the original images handed to vLLM (its own resize of each image)
    prompts = to_vllm_prompts(rows, proc)
    for p, raw in zip(prompts, raws):
        if raw["images"]:
            p["multi_modal_data"] = {"image": [im.convert("RGB") for im in raw["images"]]}
    reqs = llm.generate(prompts, engine.sampling_params(params), use_tqdm=False)
    raw_gens = [generation_from_request_output(o, i, expected_prompt_ids=rows[i].input_ids) for i, o in enumerate(reqs)]
    gap(raw_gens, "raw_images_gap")
    return out


def multiturn_check(llm, proc, model, photos) -> dict:
    """Two turns through `VLLMEngine` with a tool-style observation holding a second image
    appended in between (`mmpipe.rollout.multiturn`); the finished conversation is ONE policy
    row whose labelled tokens are both turns' samples: their logprobs vs the forward's."""
    import mmpipe
    from mmpipe import testing
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.multiturn import append_observation, append_response, start
    from mmpipe.rollout.vllm_engine import VLLMEngine
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    engine = VLLMEngine(llm, processor=proc)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=99)
    conv = start({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
                  "images": [photos[1]]}, proc)
    sampled = []
    for turn in range(2):
        c = engine.generate([conv.row], params)[0].completions[0]
        sampled.append(c.logprobs)
        conv = append_response(conv, c, done=turn == 1)
        if turn == 0:
            conv = append_observation(conv, [{"type": "image"}, {"type": "text", "text": "The next page."}],
                                      images=[testing.tiny_image(90, 150, seed=5)])
    batch = mmpipe.collate([conv.row], processor=proc)
    return {"gap": logprob_gap(policy_logprobs(model, batch), [np.concatenate(sampled)]),
            "images": conv.row.num_images, "tokens": conv.row.num_tokens,
            "labelled": int((conv.row.labels != -100).sum())}


async def async_checks(path, proc, model, raws, params) -> dict:
    """`AsyncVLLMEngine` on a real ``vllm.AsyncLLM``: one trajectory per row, all at once, plus
    a long call cancelled half-way; then the engine still serves, and the gap is measured."""
    import asyncio

    import mmpipe
    from mmpipe.encoding.encoder import Encoder
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.async_engine import AsyncVLLMEngine
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
        limit_mm_per_prompt={"image": 3}, gpu_memory_utilization=0.1))
    out = {"start_s": time.perf_counter() - t}
    try:
        engine = AsyncVLLMEngine(llm, processor=proc, max_concurrency=4)
        rows = [Encoder(proc, labels=False).encode_row(r, i) for i, r in enumerate(raws)]
        long = asyncio.ensure_future(engine.generate(rows[3:4], SamplingParams(max_new_tokens=3000, temperature=1.0)))
        calls = [engine.generate([r], params) for r in rows]
        await asyncio.sleep(0.5)
        long.cancel()
        gens = [g for c in await asyncio.gather(*calls) for g in c]
        try:
            await long
            out["long_call"] = "finished"
        except asyncio.CancelledError:
            out["long_call"] = "cancelled"
        for i, g in enumerate(gens):
            g.prompt_index = i
        samples = unbatch_rollout(rows, gens, processor=proc)
        batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
        out["gap"] = logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples])
        out["completions_per_row"] = [g.n for g in gens]
        out["response_lengths"] = [len(s.response_ids) for s in samples]
        out["max_in_flight"] = engine.gate.max_in_flight
        after = await engine.generate(rows[:1], SamplingParams(max_new_tokens=4))
        out["after_cancel"] = len(after[0].completions[0].token_ids)
    finally:
        llm.shutdown()
    return out


def main(family: str, work_dir: str, out_json: str, mode: str = "sync") -> None:
    import torch
    import transformers
    import vllm

    from mmpipe import testing
    from mmpipe.families import get_family
    from mmpipe.images.backends import processor_backend
    from mmpipe.offline.checkpoints import save_checkpoint
    from mmpipe.records.generation import SamplingParams

    t0 = time.perf_counter()
    path = str(save_checkpoint(family, work_dir))
    proc = transformers.AutoProcessor.from_pretrained(path)
    model = getattr(transformers, get_family(family).model_class).from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    t1 = time.perf_counter()
    raws = raw_rows([im for _, im in testing.sample_photos()])
    params = SamplingParams(max_new_tokens=24, n=2, temperature=1.0, seed=1234)
    if mode == "async":
        import asyncio

        with open(out_json, "w") as f:
            json.dump({"family": family, "async": asyncio.run(async_checks(path, proc, model, raws, params))}, f)
        return
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
                   limit_mm_per_prompt={"image": 3}, gpu_memory_utilization=0.1)
    t2 = time.perf_counter()
    result = {
        "family": family, "vllm": vllm.__version__, "transformers": transformers.__version__,
        "processor": type(proc).__name__, "image_processor": type(proc.image_processor).__name__,
        "engine_backend": processor_backend(proc), "checkpoint_s": t1 - t0, "llm_start_s": t2 - t1,
        "sampling": {"n": params.n, "temperature": params.temperature, "max_new_tokens": params.max_new_tokens},
        "backends": {b: run_backend(b, llm, proc, model, raws, params) for b in ("pil", "torchvision")},
        "multiturn": multiturn_check(llm, proc, model, [im for _, im in testing.sample_photos()]),
    }
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
