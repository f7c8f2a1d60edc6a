"""Video rows of the newest families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V) against the
STOCK processors' own video path: the real video processors (torchvision's Python transforms, so
the "vision" environment, scripts/envs/vision.sh) on the same frames, the processor's own text
step (``replace_video_token`` -> ``get_text_with_replacements`` -> the tokenizer), the real model
classes (tiny, random) for positions and logits, and the processor on the rows' vLLM prompts.

Rows: frame lists of odd sizes and rates (8 frames of 64x96 at 3 fps, 6 of 50x70 at 7.5 fps, 4 of
33x130 at 25 fps), two videos and an image in one turn, a video in a later turn, rows without
videos, multi-turn. Qwen2/2.5-VL clips keep their temporal extent within max(h, w)/merge (where
transformers 5 and the original Qwen position rule agree, FACTS.md).

Found here (transformers 5.25's Qwen3-VL processor drops the template's outer
``<|vision_start|>``/``<|vision_end|>``, so a video's first ``<t seconds>`` follows the text before
it and is tokenized WITH it): with a vocabulary that merges ``" <"`` (the real Qwen vocabularies
hold that token) mmpipe wrote ``" ", "<"`` where the processor writes ``" <"`` (55 ids vs 54), and
the row's vLLM prompt failed with a PlaceholderError (no timestamp at a token boundary).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, frame_bounds
from mmpipe.testing.invariants import assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip

pytestmark = pytest.mark.needs_env("vision")

U, A = "user", "assistant"


def _bounds(family: str) -> dict:
    f = 32 if family.startswith("qwen3") else 28
    return {"min_pixels": f * f * 4, "max_pixels": f * f * 16}


def _clips(short: bool) -> list:
    rng = np.random.default_rng(0)
    sizes = [(6, 64, 96), (4, 50, 70), (4, 33, 130)] if short else [(8, 64, 96), (6, 50, 70), (4, 33, 130)]
    return [rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8) for n, h, w in sizes]


def _cases(clips, image):
    """(messages, videos, fps per video, images) per row: two videos and an image, a text row, one video."""
    first = [{"role": U, "content": [{"type": "video"}, {"type": "text", "text": "and"}, {"type": "image"},
                                     {"type": "video"}, {"type": "text", "text": "Describe"}]},
             {"role": A, "content": "A thing."}, {"role": U, "content": [{"type": "text", "text": "More?"},
                                                                          {"type": "video"}]},
             {"role": A, "content": "No."}]
    return [(first, clips, [3.0, 7.5, 25.0], [image]),
            ([{"role": U, "content": [{"type": "text", "text": "Hi"}]}, {"role": A, "content": "Hello there."}], [], [], []),
            ([{"role": U, "content": [{"type": "video"}, {"type": "text", "text": "what?"}]},
              {"role": A, "content": "Noise."}], clips[2:], [2.0], [])]


def _raw(msgs, videos, fps, images) -> dict:
    raw = {"messages": msgs}
    if videos:
        raw["videos"] = [{"frames": list(v), "fps": f} for v, f in zip(videos, fps)]
    if images:
        raw["images"] = images
    return raw


def _oracle(family, proc, msgs, videos, fps, images, opts) -> dict:
    """The stock processor's outputs for these frames (no re-sampling, mmpipe's per-video bounds:
    Qwen3-VL's video processor bounds the whole clip, so n times the per-frame bounds)."""
    from transformers.video_utils import VideoMetadata

    spec, vp = VisionSpec.from_processor(proc), proc.video_processor
    text = proc.apply_chat_template(msgs, tokenize=False)
    out, vo = {}, []
    for v, f in zip(videos, fps):
        lo, hi = frame_bounds(len(v) + len(v) % 2, spec, VideoOptions(**opts))
        k = len(v) if family.startswith("qwen3") else 1
        meta = VideoMetadata(total_num_frames=len(v), fps=f, frames_indices=list(range(len(v))))
        vo.append(vp(videos=[v], video_metadata=[meta], do_sample_frames=False, return_tensors="np",
                     size={"shortest_edge": int(lo * k), "longest_edge": int(hi * k)}, return_metadata=True,
                     cap_pixels_per_frame=False))
    vid_in = None
    if videos:
        vid_in = {"video_grid_thw": np.concatenate([o["video_grid_thw"] for o in vo]),
                  "video_metadata": [o["video_metadata"][0] for o in vo]}
        out["pixel_values_videos"] = np.concatenate([o["pixel_values_videos"] for o in vo])
        out["video_grid_thw"] = vid_in["video_grid_thw"]
        if family == "qwen2_5_vl":  # Qwen2_5_VLProcessor: temporal_patch_size / sampled fps
            out["second_per_grid_ts"] = np.asarray([vp.temporal_patch_size / o["video_metadata"][0].sampled_fps
                                                    for o in vo])
    img_rep = []
    if images:
        io = proc.image_processor(images=images, return_tensors="np")
        out.update(pixel_values=io["pixel_values"], image_grid_thw=io["image_grid_thw"])
        img_rep = [proc.replace_image_token(io, image_idx=i) for i in range(len(images))]
    texts, _ = proc.get_text_with_replacements([text], img_rep, [proc.replace_video_token(vid_in, video_idx=i)
                                                                 for i in range(len(videos))])
    ids = proc.tokenizer(texts)["input_ids"][0]
    out.update(input_ids=np.asarray([ids]), attention_mask=np.ones((1, len(ids)), np.int64),
               mm_token_type_ids=np.asarray(proc.create_mm_token_type_ids([ids])))
    return out


def _model(line: str):
    if line.startswith("qwen3_5"):
        from mmpipe.offline.qwen3_5 import build_qwen3_5_model

        return build_qwen3_5_model(line)
    return mmpipe.offline.build_model(line)


@pytest.mark.parametrize("family,line", [("qwen2_vl", "qwen2_vl"), ("qwen2_5_vl", "qwen2_5_vl"),
                                         ("qwen3_vl", "qwen3_vl"), ("qwen3_vl", "qwen3_5")])
def test_video_rows_equal_the_stock_processor_and_model(family, line):
    """encode == the stock processor (ids, token types, pixels, grids, second_per_grid_ts); collate's
    positions == the model's get_rope_index; batched logits (both sides) == the model on the
    processor's own outputs per row; the rows round-trip through collate (`assert_roundtrip`)."""
    from mmpipe.offline.checkpoints import build_checkpoint_processor

    proc, opts, model = build_checkpoint_processor(family), _bounds(family), _model(line)
    spec = VisionSpec.from_processor(proc)
    rows, refs = [], []
    for i, (msgs, videos, fps, images) in enumerate(_cases(_clips(family.startswith("qwen2")),
                                                           testing.tiny_image(40, 56, seed=3))):
        row = mmpipe.encode_row(_raw(msgs, videos, fps, images), proc, idx=i, video_options=opts)
        ref = _oracle(family, proc, msgs, videos, fps, images, opts)
        assert row.input_ids.tolist() == ref["input_ids"][0].tolist()
        assert row.mm_token_type_ids.tolist() == ref["mm_token_type_ids"][0].tolist()
        if videos:
            assert row.video_grid_thw.tolist() == ref["video_grid_thw"].tolist()
            pv = u8_video_to_pixel_values(row.pixel_values_videos_u8, spec.for_videos().lut())
            assert np.array_equal(pv, ref["pixel_values_videos"])
            if "second_per_grid_ts" in ref:
                np.testing.assert_allclose(row.second_per_grid_ts, ref["second_per_grid_ts"], rtol=1e-6)
        rows.append(row)
        refs.append({k: torch.as_tensor(v) for k, v in ref.items()})
    for side in ("left", "right"):
        batch = mmpipe.collate(rows, processor=proc, padding_side=side)
        assert_positions_match_rows(batch, rows, model=model)
        assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, padding_side=side,
                                    atol=1e-4, rtol=1e-4)
        assert_roundtrip(rows, batch)


def _glm_stock():
    import transformers

    from mmpipe.families import GLM4V
    from mmpipe.offline.glm4v import GLM4V_CHAT_TEMPLATE, build_image_processor, build_tokenizer

    lo, hi = _GLM_BOUNDS["min_pixels"], _GLM_BOUNDS["max_pixels"]
    video = transformers.Glm4vVideoProcessor(
        size={"shortest_edge": lo, "longest_edge": hi}, patch_size=GLM4V.patch_size,
        temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
        image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std))
    return transformers.Glm4vProcessor(image_processor=build_image_processor(), tokenizer=build_tokenizer(),
                                       video_processor=video, chat_template=GLM4V_CHAT_TEMPLATE)


_GLM_BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}


def test_glm4v_video_rows_equal_the_stock_processor_and_model():
    """GLM-4.1V: three videos over two user turns (no image: the model counts an image row's
    <|image|> as both kinds, FACTS.md), a text row, a one-video row; flat processor call with the
    frames and their metadata; positions and logits of the real Glm4v model."""
    from mmpipe.offline import glm4v

    proc0, stock, model = testing.build_processor("glm4v"), _glm_stock(), glm4v.build_model()
    rows, refs = [], []
    for i, (msgs, videos, fps, _) in enumerate(_cases(_clips(False), None)):
        msgs = [{**m, "content": [c for c in m["content"] if c.get("type") != "image"]}
                if isinstance(m["content"], list) else m for m in msgs]
        row = mmpipe.encode_row(_raw(msgs, videos, fps, []), proc0, idx=i, video_options=_GLM_BOUNDS)
        kw = {}
        if videos:
            kw = dict(videos=list(videos), do_sample_frames=False, video_metadata=[
                {"total_num_frames": len(v), "fps": f, "duration": len(v) / f, "frames_indices": list(range(len(v)))}
                for v, f in zip(videos, fps)])
        out = stock(text=[stock.apply_chat_template(msgs, tokenize=False)], return_tensors="pt", **kw)
        assert row.input_ids.tolist() == out["input_ids"][0].tolist()
        assert row.mm_token_type_ids.tolist() == out["mm_token_type_ids"][0].tolist()
        if videos:
            assert row.video_grid_thw.tolist() == out["video_grid_thw"].tolist()
        rows.append(row)
        refs.append(dict(out))
    for side in ("left", "right"):
        batch = mmpipe.collate(rows, processor=proc0, padding_side=side)
        assert torch.equal(batch.model_inputs()["pixel_values_videos"],
                           torch.cat([r["pixel_values_videos"] for r in refs if "pixel_values_videos" in r]))
        assert_positions_match_rows(batch, rows, model=model)
        assert_batched_logits_match(model, rows, proc0, batch=batch, references=refs, padding_side=side,
                                    atol=1e-4, rtol=1e-4)
        assert_roundtrip(rows, batch)


def _processor_on_prompt(stock, tok, prompt) -> dict:
    """The stock processor on a vLLM prompt dict as vLLM hands it over (its ``do_sample_frames``
    metadata key is vLLM's own, popped before ``VideoMetadata``)."""
    mmd, kw = prompt["multi_modal_data"], dict(prompt.get("mm_processor_kwargs", {}))
    kw.update(kw.pop("videos_kwargs", {}))
    videos = [v[0] if isinstance(v, tuple) else v for v in mmd["video"]]
    if isinstance(mmd["video"][0], tuple):
        kw["video_metadata"] = [{k: x for k, x in v[1].items() if k != "do_sample_frames"} for v in mmd["video"]]
    if "image" in mmd:
        kw["images"] = mmd["image"]
    return stock(text=[tok.decode(prompt["prompt_token_ids"])], videos=videos, return_tensors="np", **kw)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"])
def test_vllm_video_prompts_give_back_the_rows(family):
    """to_vllm_prompts of a prompt row with three videos (and an image, except GLM) -> the stock
    processor on that prompt rebuilds the row's ids, grids, pixels and second_per_grid_ts."""
    from mmpipe.rollout import to_vllm_prompts

    if family == "glm4v":
        proc0, stock, opts = testing.build_processor("glm4v"), _glm_stock(), _GLM_BOUNDS
    else:
        from mmpipe.offline.checkpoints import build_checkpoint_processor

        proc0 = stock = build_checkpoint_processor(family)
        opts = _bounds(family)
    msgs, videos, fps, images = _cases(_clips(False), testing.tiny_image(40, 56, seed=3))[0]
    msgs = msgs[:3]  # ends with the user's turn: a prompt
    if family == "glm4v":
        msgs[0] = {**msgs[0], "content": [c for c in msgs[0]["content"] if c["type"] != "image"]}
        images = []
    row = mmpipe.encode_row(_raw(msgs, videos, fps, images), proc0, idx=0, video_options=opts)
    out = _processor_on_prompt(stock, proc0.tokenizer, to_vllm_prompts([row], proc0)[0])
    assert out["input_ids"][0].tolist() == row.input_ids.tolist()
    assert out["video_grid_thw"].tolist() == row.video_grid_thw.tolist()
    spec = VisionSpec.from_processor(proc0)
    assert np.array_equal(out["pixel_values_videos"],
                          u8_video_to_pixel_values(row.pixel_values_videos_u8, spec.for_videos().lut()))
    if "second_per_grid_ts" in out:
        np.testing.assert_allclose(out["second_per_grid_ts"], row.second_per_grid_ts, rtol=1e-6)


@pytest.fixture
def space_lt_processor(monkeypatch):
    """The stock Qwen3-VL processor over the offline tokenizer plus the merge ``Ġ <`` (real Qwen
    vocabularies hold ``" <"``; the offline corpus never learns it)."""
    import mmpipe.offline.tokenizer as offline_tok
    from mmpipe.offline.checkpoints import build_checkpoint_processor

    monkeypatch.setitem(offline_tok._EXTRA_MERGES, "space-lt", (("Ġ", "<"),))
    base = build_checkpoint_processor("qwen3_vl")
    tok = offline_tok.build_tokenizer("qwen3_vl", merges="space-lt")
    assert [tok.decode([i]) for i in tok("in <0.5", add_special_tokens=False)["input_ids"]][:2] == ["in", " <"]
    return type(base)(image_processor=base.image_processor, tokenizer=tok, video_processor=base.video_processor,
                      chat_template=base.chat_template)


def test_first_timestamp_merged_with_the_text_before_the_video(space_lt_processor):
    """transformers 5.25 tokenizes "What happens in <0.2 seconds><|vision_start|>..." as one string:
    the row holds " <" as the processor does (was " ", "<": 55 ids vs the processor's 54), its
    positions are the model's, the labels stay on the reply, and the vLLM prompt (was a
    PlaceholderError) is the template's text, which the processor expands back into the row."""
    from mmpipe.rollout import to_vllm_prompts

    proc, opts = space_lt_processor, _bounds("qwen3_vl")
    tok = proc.tokenizer
    v1, v2 = _clips(True)[:2]
    msgs = [{"role": U, "content": [{"type": "text", "text": "What happens in "}, {"type": "video"},
                                    {"type": "text", "text": "? and "}, {"type": "video"}]},
            {"role": A, "content": "A thing."}]
    row = mmpipe.encode_row(_raw(msgs, [v1, v2], [2.0, 5.0], []), proc, idx=0, video_options=opts)
    ref = _oracle("qwen3_vl", proc, msgs, [v1, v2], [2.0, 5.0], [], opts)
    assert row.input_ids.tolist() == ref["input_ids"][0].tolist()
    assert row.mm_token_type_ids.tolist() == ref["mm_token_type_ids"][0].tolist()
    assert tok.decode(row.input_ids[row.labels != -100].tolist()) == "A thing.<|im_end|>"
    assert_positions_match_rows(mmpipe.collate([row], processor=proc), [row], model=_model("qwen3_vl"))

    prompt_row = mmpipe.encode_row(_raw(msgs[:1], [v1, v2], [2.0, 5.0], []), proc, idx=0, video_options=opts)
    prompt = to_vllm_prompts([prompt_row], proc)[0]
    text = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt["prompt_token_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    out = _processor_on_prompt(proc, tok, prompt)
    assert out["input_ids"][0].tolist() == prompt_row.input_ids.tolist()
