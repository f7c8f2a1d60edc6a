"""Rollout inputs: collapsed vLLM prompts that the REAL processor re-expands to the training
ids and pixels, transformers generate kwargs under which the model sees the images, and
data-parallel padding that trims back exactly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.compat import forward_accepts, is_transformers_5
from mmpipe.records.generation import Completion, Generation
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.rollout.data_parallel import pad_to_multiple, trim
from mmpipe.testing.invariants import assert_roundtrip
from mmpipe.rollout.images import row_images, row_video_frames, vllm_processor_kwargs
from mmpipe.encoding.placeholders import check_roundtrip, collapse_placeholders, expand_placeholders
from mmpipe.rollout.inputs import (
    to_generate_kwargs,
    to_vllm_prompts,
)

from conftest import FAMILIES, model_for, processor_for
from strategies import dp_padding_cases, raw_rows

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _chat(n_images, text="Row", images=None):
    content = [{"type": "text", "text": f"{text}: look."}]
    for j in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" image {j}."}]
    return {"messages": [{"role": "user", "content": content}], "images": list(images or [])}


def _tok_ids(proc):
    tok = proc.tokenizer
    return {k: tok.convert_tokens_to_ids(k) for k in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")}


# ---- placeholders ----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_collapsed_ids_are_the_tokenized_chat_prompt(family, photos):
    """One pad per image inside vision_start/vision_end: exactly the ids of tokenizing the
    chat-template text, which is what vLLM gets for a chat prompt."""
    proc = processor_for(family)
    t = _tok_ids(proc)
    for n in (0, 1, 3):
        raw = _chat(n, images=photos[:n])
        row = mmpipe.encode_row(raw, proc, labels=False)
        ids = collapse_placeholders(row.input_ids, row.mm_token_type_ids, row.image_grid_thw, family=family)
        text = proc.apply_chat_template(raw["messages"], tokenize=False, add_generation_prompt=True)
        assert ids.tolist() == proc.tokenizer(text, add_special_tokens=False)["input_ids"]
        pads = np.flatnonzero(ids == t["<|image_pad|>"])
        assert len(pads) == n
        assert (ids[pads - 1] == t["<|vision_start|>"]).all() and (ids[pads + 1] == t["<|vision_end|>"]).all()
        assert np.array_equal(expand_placeholders(ids, row.image_grid_thw, family=proc), row.input_ids)


@settings(SETTINGS, max_examples=60)
@given(raw=raw_rows(max_turns=2, max_images=3), family=st.sampled_from(FAMILIES),
       pixels=st.sampled_from(["uint8", "float32", "none"]))
def test_expand_collapse_roundtrip_on_encoded_rows(raw, family, pixels):
    proc = processor_for(family)
    row = mmpipe.encode_row(raw, proc, pixels=pixels)
    collapsed = check_roundtrip(row.to_dict(), index=0)
    assert int((collapsed == _tok_ids(proc)["<|image_pad|>"]).sum()) == row.num_images
    assert len(collapsed) == row.num_tokens - int(row.mm_token_type_ids.astype(bool).sum()) + row.num_images
    if pixels == "none":
        return
    # what vLLM does with the prompt: the real processor re-expands it to the training row
    [prompt] = to_vllm_prompts([row], proc)
    assert prompt["prompt_token_ids"] == collapsed.tolist()
    if row.num_images:
        spec = VisionSpec.from_processor(proc)
        assert prompt["mm_processor_kwargs"] == {"min_pixels": spec.min_pixels, "max_pixels": spec.max_pixels}
        out = proc(text=[proc.tokenizer.decode(collapsed)], images=prompt["multi_modal_data"]["image"],
                   return_tensors="np")
        assert np.array_equal(out["input_ids"][0], row.input_ids)
        assert np.array_equal(out["pixel_values"], mmpipe.collate([row], processor=proc).pixel_values.numpy())


def test_collapse_rejects_runs_that_do_not_match_their_grid(photos):
    proc = processor_for("qwen2_vl")
    row = mmpipe.encode_row(_chat(2, images=photos[:2]), proc, labels=False)
    ids, mm, grid = row.input_ids, row.mm_token_type_ids, row.image_grid_thw
    cut = np.flatnonzero(mm == 1)[5]  # one image token dropped (e.g. by truncation)
    with pytest.raises(ValueError, match=r"row 7: image block 0 is a run of \d+ image token\(s\).*needs \d+"):
        collapse_placeholders(np.delete(ids, cut), np.delete(mm, cut), grid, family="qwen2_vl", row=7)
    with pytest.raises(ValueError, match="row 3: the text holds 2 image block"):
        collapse_placeholders(ids, mm, np.concatenate([grid, grid[:1]]), family="qwen2_vl", row=3)
    collapsed = collapse_placeholders(ids, mm, grid, family="qwen2_vl")
    with pytest.raises(ValueError, match="already expanded"):
        expand_placeholders(ids, grid, family=proc)
    with pytest.raises(ValueError, match="pad id"):
        expand_placeholders(collapsed, grid, family="qwen2_vl")


def video_row(family, grids, seed=0):
    """A row with videos laid out as the processor does (Qwen3-VL: a timestamp + block per
    frame group), via rows_from_processor_output; returns (row, compact uint8 patches)."""
    proc = processor_for(family)
    tok, fam = proc.tokenizer, mmpipe.family_of(proc)
    spec = VisionSpec.from_processor(proc)
    t_ids = _tok_ids(proc)
    vs, ve, vp = t_ids["<|vision_start|>"], t_ids["<|vision_end|>"], t_ids["<|video_pad|>"]
    ids = tok("<|im_start|>user\nWatch: ", add_special_tokens=False)["input_ids"]
    for t, h, w in grids:
        per_frame = h * w // fam.merge_size**2
        if fam.rope == "mrope_frames":
            for i in range(t):
                ids += tok(f"<{i * 0.5:.1f} seconds>", add_special_tokens=False)["input_ids"] + [vs] + [vp] * per_frame + [ve]
        else:
            ids += [vs] + [vp] * (t * per_frame) + [ve]
        ids += tok(" and", add_special_tokens=False)["input_ids"]
    ids = np.asarray(ids + tok("?<|im_end|>\n", add_special_tokens=False)["input_ids"])
    n = sum(t * h * w for t, h, w in grids)
    u8 = np.random.default_rng(seed).integers(0, 256, size=(n, fam.patch_dim), dtype=np.uint8)
    out = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64),
           "mm_token_type_ids": 2 * (ids == vp).astype(np.int64)[None], "video_grid_thw": np.asarray(grids),
           "pixel_values_videos": mmpipe.images.u8_video_to_pixel_values(u8, spec.for_videos().lut()),
           "second_per_grid_ts": np.ones(len(grids), np.float32)}
    return mmpipe.rows_from_processor_output(out, proc)[0], u8


def _patchify_video_reference(frames, spec):
    """The transformers video processor's patch layout (video_processing_qwen2_vl.patchify),
    in numpy: frames uint8 [F, H, W, 3] -> [t*gh*gw, 3*T*p*p]."""
    p, m, T = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    F, H, W, C = frames.shape
    x = frames.transpose(0, 3, 1, 2).reshape(F // T, T, C, H // p // m, m, p, W // p // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(-1, C * T * p * p)


@pytest.mark.parametrize("family", FAMILIES)
def test_videos_collapse_per_block_and_frames_invert_the_patch_layout(family):
    proc = processor_for(family)
    row, u8 = video_row(family, [(2, 4, 6), (3, 2, 4)])
    collapsed = check_roundtrip(row)
    per_video = [2, 3] if family == "qwen3_vl" else [1, 1]  # Qwen3-VL: one block per frame group
    assert int((collapsed == _tok_ids(proc)["<|video_pad|>"]).sum()) == sum(per_video)
    spec = VisionSpec.from_processor(proc)
    frames = row_video_frames(row, spec)
    p = spec.patch_size
    assert [f.shape for f in frames] == [(4, 4 * p, 6 * p, 3), (6, 2 * p, 4 * p, 3)]
    assert np.array_equal(np.concatenate([_patchify_video_reference(f, spec) for f in frames]), u8)
    prompt = to_vllm_prompts([row], proc)[0]  # one pad per video, the stored frames (tests/rollout/test_video_inputs.py)
    assert prompt["prompt_token_ids"].count(_tok_ids(proc)["<|video_pad|>"]) == 2
    got = [v[0] if isinstance(v, tuple) else v for v in prompt["multi_modal_data"]["video"]]
    assert all(np.array_equal(a, b) for a, b in zip(got, frames))


# ---- images re-processed by the real processor -------------------------------------------
def _cases(family):
    """(name, image, processor bounds) covering each smart_resize branch."""
    f = mmpipe.families.get_family(family).factor
    photo = testing.sample_photos()[1][1]  # grace_hopper 512x600: downscaled to max_pixels
    return [
        ("down_to_max", photo, {}),
        ("up_to_min", testing.tiny_image(10, 12, seed=1), {}),  # 10x12 -> upscaled to min_pixels
        ("rounded", testing.tiny_image(3 * f + 3, 5 * f - 4, seed=2), {}),  # within bounds, rounded
        # a side clamped up to one factor leaves the area above max_pixels: a second pass with
        # the training bounds would shrink it again
        ("elongated_over_max", testing.tiny_image(20, 3000, seed=3), {}),
        # rounding turns a 1:199.7 image into 1:207, which the processor refuses to resize
        ("ratio_over_200", testing.tiny_image(f + 1, (f + 1) * 200 - 10, seed=4), {"max_pixels": f * f * 1280}),
    ]


def _reprocess(family, bounds, text, images, kw):
    """What vLLM does: a processor built with the prompt's mm_processor_kwargs, called on the
    collapsed prompt text and the images."""
    proc = testing.build_processor(family, min_pixels=kw["min_pixels"], max_pixels=kw["max_pixels"])
    extra = {"do_resize": False} if "do_resize" in kw else {}
    return proc(text=[text], images=images, return_tensors="np", **extra)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_images_reprocess_to_the_stored_grid_and_pixels(family):
    for name, image, bounds in _cases(family):
        proc = testing.build_processor(family, **bounds)
        spec = VisionSpec.from_processor(proc)
        raw = _chat(1, images=[image])
        row = mmpipe.encode_row(raw, proc, labels=False)
        [prompt] = to_vllm_prompts([row], proc)
        imgs = prompt["multi_modal_data"]["image"]
        (t, gh, gw), p = row.image_grid_thw[0].tolist(), spec.patch_size
        assert imgs[0].mode == "RGB" and imgs[0].size == (gw * p, gh * p), name
        kw = prompt["mm_processor_kwargs"]
        text = proc.tokenizer.decode(prompt["prompt_token_ids"])
        out = _reprocess(family, bounds, text, imgs, kw)
        stored_pv = mmpipe.collate([row], processor=proc).pixel_values.numpy()
        assert np.array_equal(out["image_grid_thw"], row.image_grid_thw), name
        assert np.array_equal(out["input_ids"][0], row.input_ids), name  # vLLM's expansion == training ids
        assert np.array_equal(out["pixel_values"], stored_pv), name  # bit for bit
        H, W = gh * p, gw * p
        if name == "elongated_over_max":
            # pinned finding: the training bounds are NOT idempotent here; ours are
            assert H * W > spec.max_pixels and kw["max_pixels"] == H * W
            assert smart_resize(H, W, spec.factor, spec.min_pixels, spec.max_pixels) != (H, W)
            wrong = proc.image_processor(images=imgs, return_tensors="np")["image_grid_thw"]
            assert not np.array_equal(wrong, row.image_grid_thw)
        elif name == "ratio_over_200":
            assert kw.get("do_resize") is False and max(H, W) / min(H, W) > 200
            with pytest.raises(ValueError, match="aspect ratio"):
                proc.image_processor(images=imgs)
        else:
            assert kw == {"min_pixels": spec.min_pixels, "max_pixels": spec.max_pixels}, name
            assert smart_resize(H, W, spec.factor, spec.min_pixels, spec.max_pixels) == (H, W)
        if "do_resize" not in kw:  # call-time bounds (vLLM's other route) give the same
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ip = proc.image_processor(images=imgs, min_pixels=kw["min_pixels"], max_pixels=kw["max_pixels"],
                                          return_tensors="np")
            assert np.array_equal(ip["pixel_values"], stored_pv), name


def test_same_size_bicubic_resize_is_the_identity(photos):
    """The processor resizes a stored image to its own size: Pillow returns a copy, and even
    the resampling kernel itself (forced past that shortcut) is exact at scale 1."""
    for img in photos + [testing.tiny_image(56, 84)]:
        img = img.convert("RGB")
        a = np.asarray(img)
        assert np.array_equal(np.asarray(img.resize(img.size, Image.BICUBIC)), a)
        forced = img._new(img.im.resize(img.size, Image.BICUBIC, (0, 0, *img.size)))
        assert int(np.abs(np.asarray(forced).astype(int) - a).max()) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_rows_and_batches_give_the_same_prompts(family, photos):
    proc = processor_for(family)
    raws = [_chat(2, images=photos[:2]), _chat(0), _chat(1, images=photos[2:3])]
    u8_rows = [mmpipe.encode_row(r, proc, labels=False) for r in raws]
    f32_rows = [mmpipe.encode_row(r, proc, labels=False, pixels="float32") for r in raws]
    ref = to_vllm_prompts(u8_rows, proc)
    assert set(ref[1]) == {"prompt_token_ids"}
    for other in (to_vllm_prompts(f32_rows, VisionSpec.from_processor(proc)),
                  to_vllm_prompts(mmpipe.collate(u8_rows, processor=proc), proc),
                  to_vllm_prompts([r.to_dict() for r in u8_rows], proc)):
        assert [p["prompt_token_ids"] for p in other] == [p["prompt_token_ids"] for p in ref]
        assert [p.get("mm_processor_kwargs") for p in other] == [p.get("mm_processor_kwargs") for p in ref]
        for p, q in zip(other, ref):
            got = [np.asarray(im) for im in p.get("multi_modal_data", {}).get("image", [])]
            want = [np.asarray(im) for im in q.get("multi_modal_data", {}).get("image", [])]
            assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert all(isinstance(t, int) for t in ref[0]["prompt_token_ids"])


def test_layout_only_rows_say_to_encode_with_pixels(photos):
    proc = processor_for("qwen2_vl")
    row = mmpipe.encode_row(_chat(1, images=photos[:1]), proc, pixels="none")
    with pytest.raises(ValueError, match=r"row 0: holds 1 image\(s\) but no pixel data.*pixels='uint8'"):
        to_vllm_prompts([row], proc)
    with pytest.raises(ValueError, match="no pixel data"):
        row_images(row, VisionSpec.from_processor(proc))
    assert vllm_processor_kwargs(np.zeros((0, 3)), VisionSpec.from_processor(proc))["min_pixels"] > 0


# ---- transformers generate ---------------------------------------------------------------
def _gen(model, kw, **extra):
    with torch.no_grad():
        out = model.generate(**kw, max_new_tokens=4, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, **extra)
    return out.sequences[:, kw["input_ids"].shape[1]:], torch.stack(out.scores, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_kwargs_make_the_model_see_each_rows_images(family, photos):
    proc, model = processor_for(family), model_for(family)
    raws = [_chat(1, "First", photos[:1]), _chat(0, "Second, text only"), _chat(2, "Third", photos[1:3])]
    rows = [mmpipe.encode_row(r, proc, labels=False) for r in raws]
    batch = mmpipe.collate(rows, processor=proc, padding_side="left")
    kw = to_generate_kwargs(batch)
    assert "position_ids" not in kw and {"pixel_values", "image_grid_thw"} <= set(kw)
    # generate refuses mm_token_type_ids on transformers 4.x ("model_kwargs not used"): left out there
    assert ("mm_token_type_ids" in kw) == is_transformers_5()
    assert ("mm_token_type_ids" in to_generate_kwargs(batch, model=model)) == forward_accepts(model, "mm_token_type_ids")
    tokens, scores = _gen(model, kw)
    for b, row in enumerate(rows):  # batched == each row alone: the row sees its own images
        t1, s1 = _gen(model, to_generate_kwargs(mmpipe.collate([row], processor=proc)))
        assert torch.equal(tokens[b], t1[0])
        torch.testing.assert_close(scores[b], s1[0], rtol=1e-5, atol=1e-5)
    blind = {k: v for k, v in kw.items() if k not in ("pixel_values", "image_grid_thw")}
    blind_tokens, blind_scores = _gen(model, blind)
    torch.testing.assert_close(blind_scores[1], scores[1], rtol=1e-5, atol=1e-5)  # no image: unchanged
    for b in (0, 2):
        assert not torch.allclose(blind_scores[b], scores[b], atol=1e-4), f"row {b} did not use its images"
    # transformers 5.23: passing the batch's own [4, B, L] positions decodes identically
    if not is_transformers_5():
        return  # 4.x recomputes decode positions from rope deltas that passing positions leaves unset
    with_pos = to_generate_kwargs(mmpipe.collate(rows, processor=proc), position_ids=True)
    assert tuple(with_pos["position_ids"].shape[:2]) == (4, 3)
    tokens_p, scores_p = _gen(model, with_pos)
    assert torch.equal(tokens_p, tokens)
    torch.testing.assert_close(scores_p, scores, rtol=1e-5, atol=1e-5)


def test_generate_kwargs_refuse_right_padding_and_missing_pixels(photos):
    proc = processor_for("qwen2_5_vl")
    rows = [mmpipe.encode_row(_chat(1, images=photos[:1]), proc, labels=False), mmpipe.encode_row(_chat(0), proc)]
    with pytest.raises(ValueError, match=r"rows \[1\] are right-padded.*padding_side='left'"):
        to_generate_kwargs(mmpipe.collate(rows, processor=proc, padding_side="right"))
    same_len = mmpipe.collate(rows[:1], processor=proc, padding_side="right")
    assert "pixel_values" in to_generate_kwargs(same_len)  # right "padding" without pads is fine
    layout = [mmpipe.encode_row(_chat(1, images=photos[:1]), proc, pixels="none")]
    with pytest.raises(ValueError, match="without seeing them"):
        to_generate_kwargs(mmpipe.collate(layout, processor=proc))
    with pytest.raises(TypeError, match="collate the rows first"):
        to_generate_kwargs(rows)


# ---- data-parallel padding -------------------------------------------------------------
_POOL_COUNTS = (0, 1, 2, 0, 3, 1)


def _pool():
    if not hasattr(_pool, "rows"):
        proc = processor_for("qwen2_vl")
        imgs = [im for _, im in testing.generated_images()]
        rows = []
        for i, n in enumerate(_POOL_COUNTS):
            raw = _chat(n, f"Pool {i}" * (i + 1), imgs[i:i + n])
            if i % 2:  # some rows carry an answer (labels), some are bare prompts
                raw["messages"].append({"role": "assistant", "content": "fine"})
            rows.append(mmpipe.encode_row(raw, proc, labels=bool(i % 2), pixels="float32" if i == 5 else "uint8"))
        _pool.rows = rows
    return _pool.rows


def _batch_fields(b):
    out = {}
    for k, v in vars(b).items():
        if k == "spec":
            continue
        out[k] = v.tolist() if hasattr(v, "tolist") else v
    return out


@SETTINGS
@given(dp_padding_cases(pool_size=len(_POOL_COUNTS)))
def test_pad_to_multiple_then_trim_gives_the_real_rows_back(case):
    idx, multiple, side = case
    rows = [_pool()[i] for i in idx]
    padded, n_real = pad_to_multiple(rows, multiple)
    assert n_real == len(rows) and len(padded) % multiple == 0 and len(padded) - len(rows) < multiple
    for d in padded[n_real:]:  # dummies share the first row's arrays: no pixel copy
        assert d is not rows[0] and d.input_ids is rows[0].input_ids
        assert d.pixel_values_u8 is rows[0].pixel_values_u8 and d.pixel_values is rows[0].pixel_values
    proc = processor_for("qwen2_vl")
    batch = mmpipe.collate(padded, processor=proc, padding_side=side)
    trimmed = trim(batch, n_real)
    assert_roundtrip(rows, batch=trimmed)
    assert _batch_fields(trimmed) == _batch_fields(mmpipe.collate(rows, processor=proc, padding_side=side))
    # engine outputs for the padded batch trim to the real prompts
    P = len(padded)
    gens = [Generation(i, [Completion([i])]) for i in range(P)]
    assert [g.prompt_index for g in trim(gens, n_real)] == list(range(n_real))
    out = trim({"ids": torch.arange(P), "arr": np.arange(P * 2).reshape(P, 2), "text": [str(i) for i in range(P)],
                "step": 3, "name": "x"}, n_real)
    assert out["ids"].tolist() == list(range(n_real)) and out["arr"].shape == (n_real, 2)
    assert out["text"] == [str(i) for i in range(n_real)] and out["step"] == 3 and out["name"] == "x"


def _offline_processor(family: str):
    """The offline processor of ``family`` (on both transformers lines: `mmpipe.offline.tf_lines`)."""
    return processor_for(family)


def _image_row(k: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": "Q"}]}],
            "images": [testing.tiny_image(40, 56, seed=j) for j in range(k)]}


@pytest.mark.parametrize("family, pixels", [("internvl", "uint8"), ("gemma3", "uint8"), ("internvl", "none"),
                                            ("gemma3", "none"), ("qwen2_vl", "source")])
def test_trim_cuts_every_kind_by_its_declared_layout(family, pixels):
    """A tiled family's batch trims like a patch-grid one (1-D positions on their row axis, the
    images' sizes, tile counts and tiles cut at the row), and its model sees the real rows' batch:
    logits equal collating the real rows alone; pass-through columns are trimmed too."""
    proc = _offline_processor(family)
    rows = [mmpipe.encode_row(_image_row(k), proc, labels=False, pixels=pixels) for k in (2, 0, 1)]
    padded, n = pad_to_multiple(rows, 4)
    trimmed = trim(mmpipe.collate(padded, processor=proc, allow_layout_only=pixels == "none"), n)
    assert_roundtrip(rows, batch=trimmed)
    if pixels == "uint8":
        model, real = model_for(family), mmpipe.collate(rows, processor=proc)
        with torch.no_grad():
            torch.testing.assert_close(model(**trimmed.model_inputs()).logits, model(**real.model_inputs()).logits,
                                       rtol=0, atol=0)
    dicts = [dict(r.to_dict(), id=f"r{i}") for i, r in enumerate(rows)]
    padded, n = pad_to_multiple(dicts, 4)
    assert trim(mmpipe.collate(padded, processor=proc, keep_columns=["id"], allow_layout_only=pixels == "none"),
                n).columns == {"id": ["r0", "r1", "r2"]}


def test_trim_refuses_what_it_cannot_cut_by_row():
    """LLaVA-OneVision's pixels [images, most tiles, ...] and extras, the generic path's processor
    outputs: laid out for the whole batch; trim says to cut the rows before collate."""
    proc = _offline_processor("llava_onevision")
    padded, n = pad_to_multiple([mmpipe.encode_row(_image_row(k), proc) for k in (2, 1)], 4)
    with pytest.raises(mmpipe.errors.ArgumentError, match=r"'extras', 'pixel_values'.*trim the rows before collating"):
        trim(mmpipe.collate(padded, processor=proc), n)


def test_pad_and_trim_errors():
    with pytest.raises(ValueError, match="no rows"):
        pad_to_multiple([], 2)
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        pad_to_multiple([1], 0)
    with pytest.raises(ValueError, match="different leading sizes"):
        trim({"a": [1, 2, 3, 4], "pos": np.zeros((3, 4))}, 2)
    with pytest.raises(ValueError, match="exceeds"):
        trim([1, 2], 3)
    padded, n = pad_to_multiple([{"a": 1}, {"a": 2}, {"a": 3}], 4)
    assert padded[3] == {"a": 1} and padded[3] is not padded[0] and n == 3


@pytest.mark.parametrize("family", ["qwen2_vl", "glm4v"])
def test_source_rows_roll_out_as_their_uint8_rows(family):
    """``pixels="source"`` prompt rows (the files stored, decoded at collate) are rollout prompts
    like any row with pixels: TransformersEngine generates from them and vLLM prompts carry the
    same images as the uint8 rows' (they were refused as layout-only)."""
    from mmpipe.records import SamplingParams
    from mmpipe.rollout import TransformersEngine

    proc, model = _offline_processor(family), model_for(family)
    raws = [_image_row(k) for k in (1, 2)]
    src = [mmpipe.encode_row(r, proc, labels=False, pixels="source") for r in raws]
    u8 = [mmpipe.encode_row(r, proc, labels=False) for r in raws]
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    engine = TransformersEngine(model, proc)
    assert [g.completions[0].token_ids for g in engine.generate(src, params)] == \
        [g.completions[0].token_ids for g in engine.generate(u8, params)]
    for a, b in zip(to_vllm_prompts(src, proc), to_vllm_prompts(u8, proc)):
        assert [np.asarray(x).tolist() for x in a["multi_modal_data"]["image"]] == \
            [np.asarray(x).tolist() for x in b["multi_modal_data"]["image"]]
