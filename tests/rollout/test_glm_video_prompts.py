"""GLM-4.1V video prompts for vLLM (`mmpipe.rollout.glm_video_prompts` via `to_vllm_prompts`): one
``<|begin_of_video|><|video|><|end_of_video|>`` per video, the stored frames and metadata under which
``Glm4vProcessor`` (what vLLM's glm4_1v calls) and vLLM's own placeholder rule re-create the row.

Main env: the real ``Glm4vProcessor`` text path (``replace_video_token`` with the prompt's metadata).
vLLM env: the stock processor with its ``Glm4vVideoProcessor`` on the prompt (ids, token types,
grids, pixel values) and vLLM 0.32's ``_get_video_second_idx_glm4v`` (its frame times).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import PlaceholderError
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.rollout import to_vllm_prompts
from mmpipe.rollout.glm_video_prompts import glm_video_ids

from helpers import VLLM_WORKER_S, all_frames, make_video

av = pytest.importorskip("av", reason="PyAV is a test extra")
BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}


def _rows(proc, tmp_path, *, videos_in_row_1: int = 2):
    frames = [np.random.default_rng(i).integers(0, 255, (56, 84, 3), dtype=np.uint8) for i in range(5)]
    two = [{"type": "text", "text": "See"}, {"type": "video"}, {"type": "text", "text": "then"}, {"type": "video"}]
    raw = [
        {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}],
         "videos": [{"frames": frames, "fps": 3.0}]},
        {"messages": [{"role": "user", "content": two[:2 * videos_in_row_1]}],
         "videos": [make_video(40, 25.0, 64, 80, seed=1), make_video(31, 29.97, 112, 84, seed=2)][:videos_in_row_1]},
        {"messages": [{"role": "user", "content": "text only"}]},
    ]
    return [mmpipe.encode_row(r, proc, idx=i, labels=False, video_options=BOUNDS) for i, r in enumerate(raw)]


def test_prompts_hold_one_video_token_per_video_and_re_create_the_row(tmp_path):
    proc = testing.build_processor("glm4v")
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    rows = _rows(proc, tmp_path)
    prompts = to_vllm_prompts(rows, proc)
    tok = proc.tokenizer
    bov, vid, eov = tok.convert_tokens_to_ids(["<|begin_of_video|>", "<|video|>", "<|end_of_video|>"])
    from transformers.video_utils import VideoMetadata

    for row, p in zip(rows, prompts):
        ids = np.asarray(p["prompt_token_ids"])
        videos = p.get("multi_modal_data", {}).get("video", [])
        assert len(videos) == row.video_grid_thw.shape[0] == (ids == vid).sum()
        if not videos:
            assert ids.tolist() == row.input_ids.tolist()
            continue
        assert [ids[i - 1] == bov and ids[i + 1] == eov for i in np.flatnonzero(ids == vid)] == [True] * len(videos)
        assert p["mm_processor_kwargs"]["videos_kwargs"] == {"do_resize": False, "do_sample_frames": False}
        # the processor's text path with the prompt's metadata gives the row's ids back
        reps = []
        for k, (frames, meta) in enumerate(videos):
            md = VideoMetadata(**{key: meta[key] for key in ("fps", "frames_indices", "total_num_frames", "duration")})
            reps.append(proc.replace_video_token({"video_grid_thw": row.video_grid_thw, "video_metadata": [md] * 2},
                                                 video_idx=k))
            assert frames.shape[0] == row.video_grid_thw[k, 0] * 2 and len(set(meta["frames_indices"])) == len(frames)
        texts, _ = proc.get_text_with_replacements([tok.decode(ids.tolist())], [], reps)
        assert tok(texts)["input_ids"][0] == row.input_ids.tolist()


def test_a_row_whose_times_were_edited_is_refused(tmp_path):
    proc = testing.build_processor("glm4v")
    row = _rows(proc, tmp_path)[0]
    tok = proc.tokenizer
    ids = row.input_ids.copy()
    eoi = tok.convert_tokens_to_ids("<|end_of_image|>")
    ids[np.flatnonzero(ids == eoi)[0] + 1] = tok.convert_tokens_to_ids("x")
    with pytest.raises(PlaceholderError, match="frame group 0"):
        glm_video_ids(ids, row.video_grid_thw.tolist(), row.fam, tok, 0)


@pytest.mark.needs_env("vllm")
def test_the_stock_processor_and_vllm_re_create_the_row_from_the_prompt(tmp_path):
    import transformers
    from vllm.model_executor.models.glm4_1v import Glm4vProcessingInfo

    from mmpipe.offline.glm4v import GLM4V_CHAT_TEMPLATE, build_image_processor, build_tokenizer

    video = transformers.Glm4vVideoProcessor(size={"shortest_edge": BOUNDS["min_pixels"],
                                                   "longest_edge": BOUNDS["max_pixels"]})
    stock = transformers.Glm4vProcessor(image_processor=build_image_processor(), tokenizer=build_tokenizer(),
                                        video_processor=video, chat_template=GLM4V_CHAT_TEMPLATE)
    proc = testing.build_processor("glm4v")
    rows = _rows(proc, tmp_path)
    spec = VisionSpec.from_processor(proc)
    info = SimpleNamespace(get_video_processor=lambda: video)
    for row, p in zip(rows[:2], to_vllm_prompts(rows[:2], proc)):
        frames, metas = zip(*p["multi_modal_data"]["video"])
        md = [{k: v for k, v in m.items() if k != "do_sample_frames"} for m in metas]
        out = stock(text=[proc.tokenizer.decode(p["prompt_token_ids"])], videos=list(frames), video_metadata=md,
                    return_tensors="np", **p["mm_processor_kwargs"]["videos_kwargs"])
        assert out["input_ids"][0].tolist() == row.input_ids.tolist()
        assert out["mm_token_type_ids"][0].tolist() == row.mm_token_type_ids.tolist()
        assert out["video_grid_thw"].tolist() == row.video_grid_thw.tolist()
        assert np.array_equal(out["pixel_values_videos"],
                              u8_video_to_pixel_values(row.pixel_values_videos_u8, spec.for_videos().lut()))
        tok = proc.tokenizer
        bov, eov = tok.convert_tokens_to_ids(["<|begin_of_video|>", "<|end_of_video|>"])
        spans = zip(np.flatnonzero(row.input_ids == bov), np.flatnonzero(row.input_ids == eov))
        for f, m, g, (s, e) in zip(frames, metas, row.video_grid_thw.tolist(), spans):  # vLLM's own frame times
            secs = Glm4vProcessingInfo._get_video_second_idx_glm4v(info, m, len(f))
            text = "".join(f"<|begin_of_image|>{'<|image|>' * (g[1] * g[2] // 4)}<|end_of_image|>{t}" for t in secs)
            assert tok(text, add_special_tokens=False)["input_ids"] == row.input_ids[s + 1:e].tolist()


@pytest.mark.needs_env("vllm")
def test_real_vllm_expands_glm_video_prompts_to_the_rows(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"vLLM cannot run on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    out = tmp_path / "result.json"
    tests = str(Path(__file__).resolve().parents[1])  # the worker imports tests/helpers.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, __file__, str(tmp_path / "checkpoint"), str(out), str(tmp_path)],
                         capture_output=True, text=True, timeout=VLLM_WORKER_S, cwd=Path(__file__).resolve().parents[2], env=env)
    if run.returncode != 0 or not out.exists():
        pytest.fail(f"the GLM video vLLM worker exited {run.returncode}:\n{(run.stdout + run.stderr)[-6000:]}")
    result = json.loads(out.read_text())
    print(f"\n[vllm glm4v video] start {result['start_s']:.1f}s, rollout/training logprob gap {result['gap']:.2e}")
    assert result["videos_per_row"] == [1, 1, 0] and result["completions_per_row"] == [2] * 3
    assert result["prompt_ids_equal_rows"] == [True] * 3
    assert result["gap"] < 1e-4


def _vllm_worker(ckpt: str, out: str, tmp: str) -> None:
    """Save the tiny GLM checkpoint, start vllm.LLM on it, generate from GLM video rows through
    VLLMEngine (which checks vLLM's expanded prompt ids == each row's input_ids) and compare
    vLLM's sampled-token logprobs with the transformers model's on the policy batch."""
    import json
    import time
    from pathlib import Path

    import torch
    import transformers
    import vllm

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
                   limit_mm_per_prompt={"image": 0, "video": 2}, gpu_memory_utilization=0.1)
    start_s = time.perf_counter() - t
    rows = _rows(proc, Path(tmp), videos_in_row_1=1)  # vLLM's glm4_1v takes at most 1 video per prompt
    prompts = to_vllm_prompts(rows, proc)
    reqs = llm.generate(prompts, vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    same = [list(o.prompt_token_ids) == r.input_ids.tolist() for o, r in zip(reqs, rows)]
    gens = VLLMEngine(llm, processor=proc).generate(rows, SamplingParams(max_new_tokens=8, n=2, temperature=1.0,
                                                                         seed=3))
    samples = unbatch_rollout(rows, gens, processor=proc)
    batch = mmpipe.collate([s.to_row() for s in samples], processor=proc)
    gap = logprob_gap(policy_logprobs(model, batch), [s.logprobs for s in samples])
    Path(out).write_text(json.dumps({
        "start_s": start_s, "prompt_ids_equal_rows": same, "gap": gap,
        "videos_per_row": [int(r.video_grid_thw.shape[0]) for r in rows], "completions_per_row": [g.n for g in gens]}))


if __name__ == "__main__":
    _vllm_worker(*sys.argv[1:4])
