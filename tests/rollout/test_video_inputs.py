"""vLLM prompts for rows with videos (`mmpipe.rollout.to_vllm_prompts`, `mmpipe.rollout.videos`),
checked without vLLM: the prompt expanded by vLLM 0.32's rules (read from its qwen2_vl /
qwen2_5_vl / qwen3_vl multimodal processors and re-implemented here: one pad -> ``t*h*w/merge^2``
pads; Qwen3-VL: per frame group ``<{t:.1f} seconds>`` + ``<|vision_start|>`` pads
``<|vision_end|>``, ``t`` the mean of the group's ``frames_indices / fps``) gives back the row's
ids; the metadata re-creates ``second_per_grid_ts``; verl rows carry the same. Each video pad of
a prompt sits in the chat template's ``<|vision_start|>``/``<|vision_end|>`` pair on every
transformers line; where the processor drops that pair around the frame groups (transformers
5.25's Qwen3-VL), the expansion takes the pair with the pad, as that processor's own does. The
real engine runs the same prompts in tests/rollout/test_video_vllm.py (vLLM environment)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.encoding.videos import keeps_video_wrapper
from mmpipe.hosts.verl import verl_batch, verl_rows
from mmpipe.images.spec import VisionSpec
from mmpipe.rollout.images import row_video_frames
from mmpipe.rollout.inputs import to_vllm_prompts
from mmpipe.rollout.videos import video_fps_for

from conftest import FAMILIES, processor_for
from helpers import encode_mixed

LAYOUT = ["vIv", "", "v", "Ivv"]


def vllm_expand(prompt: dict, proc, family: str) -> list[int]:
    """vLLM 0.32's expansion of a prompt's video pads (and image pads, from the image sizes); for a
    processor that drops the template's pair around the frame groups, the pair goes with the pad."""
    tok = proc.tokenizer
    fam = mmpipe.family_of(family)
    m2 = fam.merge_size ** 2
    vt = fam.vision_token_ids(tok)
    videos = list(prompt.get("multi_modal_data", {}).get("video", []))
    images = list(prompt.get("multi_modal_data", {}).get("image", []))
    drop_pair = not keeps_video_wrapper(proc, fam)
    out, skip = [], False
    for t in prompt["prompt_token_ids"]:
        if skip:  # the pair's end, taken with its pad
            assert t == vt["vision_end"]
            skip = False
            continue
        if t == vt["video"] and drop_pair:
            assert out.pop() == vt["vision_start"]
            skip = True
        if t == vt["image"]:
            w, h = images.pop(0).size
            out += [t] * (h * w // fam.patch_size ** 2 // m2)
        elif t == vt["video"]:
            item = videos.pop(0)
            frames, meta = item if isinstance(item, tuple) else (item, None)
            n, H, W, _ = frames.shape
            T = fam.temporal_patch_size
            per_group = (H // fam.patch_size) * (W // fam.patch_size) // m2
            if fam.video_frames_are_blocks:  # qwen3_vl.py _calculate_timestamps + get_video_repl
                idx, fps = meta["frames_indices"], meta["fps"]
                for g in range(n // T):
                    ts = (idx[g * T] / fps + idx[g * T + T - 1] / fps) / 2
                    out += tok.encode(f"<{ts:.1f} seconds>", add_special_tokens=False)
                    out += [vt["vision_start"]] + [t] * per_group + [vt["vision_end"]]
            else:
                out += [t] * (n // T * per_group)
        else:
            out.append(t)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_expand_back_to_the_rows(family):
    proc = processor_for(family)
    rows = encode_mixed(LAYOUT, proc, labels=False, answer=False)
    prompts = to_vllm_prompts(rows, proc)
    spec = VisionSpec.from_processor(proc)
    pad = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    vt = mmpipe.family_of(family).vision_token_ids(proc.tokenizer)
    for r, p in zip(rows, prompts):
        ids = p["prompt_token_ids"]
        assert ids.count(pad) == r.num_videos
        # as the chat template writes a video, whatever the processor did with the pair
        assert all(ids[i - 1] == vt["vision_start"] and ids[i + 1] == vt["vision_end"]
                   for i, t in enumerate(ids) if t == pad)
        assert vllm_expand(p, proc, family) == r.input_ids.tolist()
        if not r.num_videos:
            assert "video" not in p.get("multi_modal_data", {})
            continue
        assert p["mm_processor_kwargs"]["videos_kwargs"] == {"do_resize": False, "do_sample_frames": False}
        frames = [v[0] if isinstance(v, tuple) else v for v in p["multi_modal_data"]["video"]]
        assert all(np.array_equal(a, b) for a, b in zip(frames, row_video_frames(r, spec)))
        assert all(f.dtype == np.uint8 and f.shape[0] == g[0] * 2 for f, g in zip(frames, r.video_grid_thw.tolist()))
        items = p["multi_modal_data"]["video"]
        assert all(isinstance(v, tuple) for v in items) == (family != "qwen2_vl")  # Qwen2-VL: frames alone
        for v, f, s in zip(items, frames, r.second_per_grid_ts.tolist()):
            if not isinstance(v, tuple):
                continue
            meta = v[1]
            assert meta["do_sample_frames"] is False and len(meta["frames_indices"]) == f.shape[0]
            if family == "qwen2_5_vl":  # transformers: T / sampled_fps, sampled_fps = len(indices) / total * fps
                assert 2 / (len(meta["frames_indices"]) / meta["total_num_frames"] * meta["fps"]) == s


def test_a_batch_and_stored_dicts_give_the_same_prompts():
    proc = processor_for("qwen3_vl")
    rows = encode_mixed(LAYOUT, proc, labels=False, answer=False)
    want = to_vllm_prompts(rows, proc)
    for got in (to_vllm_prompts(mmpipe.collate(rows, processor=proc), proc), to_vllm_prompts([r.to_dict() for r in rows], proc)):
        assert [g["prompt_token_ids"] for g in got] == [w["prompt_token_ids"] for w in want]
        assert [[m for _, m in g.get("multi_modal_data", {}).get("video", [])] for g in got] == \
               [[m for _, m in w.get("multi_modal_data", {}).get("video", [])] for w in want]


def test_qwen3_video_prompts_need_the_tokenizer():
    proc = processor_for("qwen3_vl")
    rows = encode_mixed(["v"], proc, labels=False, answer=False)
    with pytest.raises(ArgumentError, match="tokenizer"):
        to_vllm_prompts(rows, VisionSpec.from_processor(proc))
    assert to_vllm_prompts(rows, VisionSpec.from_processor(proc), tokenizer=proc)[0]["prompt_token_ids"] == \
        to_vllm_prompts(rows, proc)[0]["prompt_token_ids"]


def test_video_fps_for_recovers_second_per_grid_ts():
    """``T / fps`` (float64, as transformers divides) gives back the stored seconds per group:
    exactly for the common frame rates' values, within one float64 ulp for any value (no double
    fps hits some values exactly; vLLM's time index floors ``g * s * tokens_per_second``, which
    one ulp moves only at an exact integer, i.e. at such common values)."""
    common = 2 / np.asarray([1, 2, 3, 4, 7, 23.976, 24, 25, 29.97, 30, 50, 60], np.float32)
    assert all(2 / video_fps_for(float(s), 2) == float(s) for s in common)
    secs = np.random.default_rng(0).uniform(0.01, 30, 5000).astype(np.float32).astype(np.float64)
    got = np.asarray([2 / video_fps_for(float(s), 2) for s in secs])
    assert (np.abs(got - secs) <= np.spacing(secs)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_verl_rows_carry_videos(family):
    proc = processor_for(family)
    rows = encode_mixed(LAYOUT, proc, labels=False, answer=False)
    out = verl_rows(rows, proc)
    prompts = to_vllm_prompts(rows, proc)
    for r, o, p in zip(rows, out, prompts):
        assert o["raw_prompt_ids"] == p["prompt_token_ids"]
        assert ("video" in o["multi_modal_data"]) == bool(r.num_videos)
        assert ("image" in o["multi_modal_data"]) == bool(r.num_images)
        mmi = o["multi_modal_inputs"]
        if r.num_videos:
            assert mmi["video_grid_thw"].tolist() == r.video_grid_thw.tolist()
            assert mmi["pixel_values_videos"].shape == (r.num_video_patches, r.fam.patch_dim)
            assert ("second_per_grid_ts" in mmi) == r.fam.takes_second_per_grid_ts
        else:
            assert "video_grid_thw" not in mmi
    batch = verl_batch(out)
    assert batch["input_ids"].shape[0] == len(rows) and len(batch["multi_modal_data"]) == len(rows)


def test_readme_video_prompt_block_runs_as_written():
    from helpers import readme_block

    scope: dict = {}
    exec(readme_block("### Videos in vLLM prompts"), scope)
    assert scope["meta"]["frames_indices"] == [2, 2, 12, 12]  # groups at 0.2 s and 1.2 s, the row's timestamps
    assert scope["clip"].shape == (4, 64, 96, 3)
