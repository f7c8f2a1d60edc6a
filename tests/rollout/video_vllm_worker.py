"""Real vLLM on one tiny family with VIDEO rows, run as its own process (``vllm.LLM`` spawns
its engine); used by tests/rollout/test_video_vllm.py.

    python tests/rollout/video_vllm_worker.py FAMILY WORK_DIR OUT_JSON

Rows are made by the family's STOCK transformers processor (video processor included: the
torchvision transforms folder is on PYTHONPATH) from frames and video metadata, then taken
as mmpipe rows (`mmpipe.rows_from_processor_output`): 0, 1 and 2 videos, mixed with images,
odd frame counts, several frame rates (Qwen2.5-VL's 25 fps case among them). `to_vllm_prompts`
builds the vLLM prompts; `VLLMEngine` checks vLLM's expanded prompt ids == each row's
input_ids; the sampled-token logprobs are compared with the transformers model's on the
policy batch (the model sees the same frames in both). Writes everything to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

# (frames, height, width, source fps, sampled indices step) per video; per row a list of videos
# and a number of images
ROWS = [
    ([], 1),
    ([(4, 64, 96, 2.0, 1)], 0),
    ([(5, 90, 120, 25.0, 1)], 1),  # odd count: the processor repeats the last frame
    ([(6, 56, 84, 3.0, 3), (4, 120, 64, 30.0, 10)], 1),
    ([(8, 48, 48, 25.0, 2), (2, 100, 140, 1.0, 1)], 0),
    ([(52, 28, 28, 25.0, 1)], 0),  # 26 frame groups at 25 fps: Qwen2.5-VL's float32/float64 time index case
]


def build_rows(proc, photos):
    import mmpipe
    from mmpipe import testing

    rng = np.random.default_rng(0)
    rows, raw = [], []
    for r, (videos, n_images) in enumerate(ROWS):
        content = [{"type": "text", "text": f"Row {r}."}]
        frames, metas, images = [], [], []
        for v, (n, h, w, fps, step) in enumerate(videos):
            base = np.asarray(photos[v % len(photos)].convert("RGB").resize((w, h)), dtype=np.int16)
            frames.append(np.stack([np.clip(base + rng.integers(-30, 31, base.shape), 0, 255).astype(np.uint8)
                                    for _ in range(n)]))
            idx = [i * step for i in range(n)]
            metas.append({"fps": fps, "frames_indices": idx, "total_num_frames": idx[-1] + step,
                          "duration": (idx[-1] + step) / fps})
            content += [{"type": "video"}, {"type": "text", "text": f" clip {v}."}]
        for i in range(n_images):
            images.append(testing.tiny_image(70 + 13 * i, 90, seed=r + i))
            content += [{"type": "image"}, {"type": "text", "text": f" picture {i}."}]
        content.append({"type": "text", "text": " What happens?"})
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        kw = dict(text=[text], return_tensors="np")
        if frames:
            kw.update(videos=frames, video_metadata=metas, do_sample_frames=False)
        if images:
            kw.update(images=images)
        out = proc(**kw)
        rows.append(mmpipe.rows_from_processor_output(out, proc)[0])
        raw.append({"frames": [f.shape for f in frames], "metadata": metas,
                    "second_per_grid_ts": np.asarray(out.get("second_per_grid_ts", [])).tolist()})
    return rows, raw


def multiturn_check(engine, proc, model, photos) -> dict:
    """Two turns through `VLLMEngine`: an image prompt, then a tool turn returning a 5-frame
    clip (`append_observation(..., videos=[...])`), then the second reply; the finished
    conversation is one policy row: its sampled logprobs vs the forward's."""
    import mmpipe
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.multiturn import append_observation, append_response, start
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    rng = np.random.default_rng(5)
    clip = [rng.integers(0, 256, (60, 84, 3), dtype=np.uint8) for _ in range(5)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    conv = start({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Look."}]}],
                  "images": [photos[0]]}, proc, video_options={"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 24})
    sampled = []
    for turn in range(2):
        c = engine.generate([conv.row], params)[0].completions[0]  # checks vLLM's ids == the row's
        sampled.append(np.asarray(c.logprobs))
        conv = append_response(conv, c, done=turn == 1)
        if turn == 0:
            conv = append_observation(conv, [{"type": "text", "text": "Clip: "}, {"type": "video"}],
                                      videos=[{"frames": clip, "fps": 5.0}])
    batch = mmpipe.collate([conv.row], processor=proc)
    return {"gap": logprob_gap(policy_logprobs(model, batch), [np.concatenate(sampled)]),
            "videos": conv.row.num_videos, "video_grid": conv.row.video_grid_thw.tolist(),
            "tokens": conv.row.num_tokens}


def main(family: str, work_dir: str, out_json: str) -> None:
    import torch
    import transformers
    import vllm

    import mmpipe
    from mmpipe import testing
    from mmpipe.families import get_family
    from mmpipe.offline.checkpoints import save_checkpoint
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.inputs import to_vllm_prompts
    from mmpipe.rollout.results import unbatch_rollout
    from mmpipe.rollout.vllm_engine import VLLMEngine
    from mmpipe.testing.invariants import logprob_gap, policy_logprobs

    path = str(save_checkpoint(family, work_dir))
    proc = transformers.AutoProcessor.from_pretrained(path)
    model = getattr(transformers, get_family(family).model_class).from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    rows, raw = build_rows(proc, [im for _, im in testing.sample_photos()])
    prompts = to_vllm_prompts(rows, proc)
    t = time.perf_counter()
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
                   limit_mm_per_prompt={"image": 2, "video": 2}, gpu_memory_utilization=0.1)
    start_s = time.perf_counter() - t
    engine = VLLMEngine(llm, processor=proc)
    params = SamplingParams(max_new_tokens=16, n=2, temperature=1.0, seed=7)
    reqs = llm.generate(prompts, engine.sampling_params(params), use_tqdm=False)
    same_ids = [list(q.prompt_token_ids) == r.input_ids.tolist() for q, r in zip(reqs, rows)]
    gens = engine.generate(rows, params)  # raises unless vLLM's expanded ids == each row's input_ids
    samples = unbatch_rollout(rows, gens, processor=proc)
    batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
    got = policy_logprobs(model, batch)
    want = [s.logprobs for s in samples]
    result = {
        "family": family, "vllm": vllm.__version__, "transformers": transformers.__version__, "llm_start_s": start_s,
        "videos_per_row": [r.num_videos for r in rows], "images_per_row": [r.num_images for r in rows],
        "video_grids": [r.video_grid_thw.tolist() for r in rows],
        "second_per_grid_ts": [r.second_per_grid_ts.tolist() for r in rows],
        "prompt_lengths": [len(p["prompt_token_ids"]) for p in prompts], "row_lengths": [r.num_tokens for r in rows],
        "video_pads_in_prompts": [int(np.sum(np.asarray(p["prompt_token_ids"]) == proc.tokenizer.convert_tokens_to_ids(
            "<|video_pad|>"))) for p in prompts],
        "vllm_prompt_ids_equal_rows": same_ids,
        "vllm_prompt_lengths": [len(q.prompt_token_ids) for q in reqs],
        "completions_per_row": [g.n for g in gens],
        "gap": logprob_gap(got, want),
        "gap_per_sample": [float(np.abs(g - w).max()) if len(w) else 0.0 for g, w in zip(got, want)],
        "raw": raw,
        "multiturn": multiturn_check(engine, proc, model, [im for _, im in testing.sample_photos()]),
    }
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
