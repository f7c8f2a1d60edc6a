"""Raw rows with videos through `mmpipe.encode` / `encode_row` / `encode_dataset`, against the
Qwen processors.

Oracles (the stock Qwen video processors need torchvision, which cannot be installed here):
- pixels: the stock video processors' torchvision rule (transformers has no PIL video
  processor; videos follow it whatever the image backend), run here as mmpipe's
  torchvision-backend image path on the same sampled frames with the video's bounds, frames
  paired into temporal patches as the video processor lays them out
  (`helpers.image_processor_video`; why that is exact: tests/images/test_video.py, which also
  checks frame counts, indices and bounds against qwen-vl-utils' own code, and the vLLM-env
  tests/rollout/test_video_pixel_oracle.py against the real video processors);
- ids, grids, token types: the real ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` /
  ``Qwen3VLProcessor`` classes (the offline image-only subclasses), running their own text path
  of ``ProcessorMixin.__call__``: ``replace_image_token`` / ``replace_video_token`` ->
  ``get_text_with_replacements`` -> the tokenizer -> ``create_mm_token_type_ids``. The video
  processor's outputs that path reads are given as the video processor returns them for these
  frames: ``video_grid_thw`` (from the pixel oracle) and, for Qwen3-VL, the ``video_metadata``
  qwen-vl-utils passes (source fps and sampled frame indices). ``video_processor`` is a namespace
  holding ``merge_size`` / ``temporal_patch_size``, the only attributes ``replace_video_token``
  reads;
- positions: transformers' own ``get_rope_index`` of the tiny models (temporal extents kept within
  max(h, w)/merge, where transformers 5 and the original Qwen rule agree, see FACTS.md).
Test videos are made with PyAV (`helpers.make_video`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.encoding.videos import keeps_video_wrapper, video_row_bytes
from mmpipe.errors import PlaceholderError, TruncationError, VideoError
from mmpipe.images import video as V
from mmpipe.images.video_container import Container
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, frame_bounds, sample_count
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.testing.invariants import (assert_batched_logits_match, assert_positions_match_rows, assert_roundtrip,
                                       assert_row_positions)

from conftest import model_for, processor_for
from helpers import all_frames, image_processor_video, make_video, readme_block
from strategies import video_raw_rows

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
BOUNDS = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}


@functools.lru_cache(maxsize=None)
def oracle_processor(family: str):
    """The family's real processor class; its video processor stand-in carries what
    ``replace_video_token`` reads."""
    proc = testing.build_processor(family)
    ip = proc.image_processor
    proc.video_processor = SimpleNamespace(merge_size=ip.merge_size, temporal_patch_size=ip.temporal_patch_size)
    return proc


# ---- the cases: (frames, fps, h, w), the convention, options --------------------------------
CASES = {
    # {"type": "video"} placeholders + a videos column (a file's bytes), and an image
    "column": dict(video=(20, 10.0, 64, 80), options={**BOUNDS}, image=True),
    # an inline item carrying a path and its own nframes (qwen-vl-utils' per-video option)
    "inline": dict(video=(31, 29.97, 112, 84), options={**BOUNDS, "fps": 1.0}, item={"nframes": 6}),
    # verl-style <video> marker, a frame list with its fps ({"frames", "fps"}), and an <image>
    "prompt": dict(video=(5, 3.0, 56, 84), options={**BOUNDS}, frames=True, image=True),
    # a longer clip at 25 fps sampled at 4 fps
    "fps": dict(video=(60, 25.0, 112, 112), options={**BOUNDS, "fps": 4.0, "max_frames": 8}),
}


def build_case(name: str, tmp_path):
    """(raw row, oracle messages, video value facts): the same conversation in the case's convention."""
    c = CASES[name]
    n, fps, h, w = c["video"]
    data = make_video(n, fps, h, w, seed=len(name))
    img = testing.tiny_image(40, 56, seed=3)
    frames = all_frames(data)
    items = [{"type": "video"}, {"type": "text", "text": "Describe it"}] + ([{"type": "image"}] if c.get("image") else [])
    oracle_msgs = [{"role": "user", "content": items}, {"role": "assistant", "content": "A moving bar."}]
    if name == "prompt":
        video = {"frames": [Image.fromarray(f) for f in frames], "fps": fps}
        row = {"prompt": [{"role": "user", "content": "<video>Describe it<image>"}], "completion": "A moving bar.",
               "videos": [video], "images": [img]}
    elif name == "inline":
        path = tmp_path / "clip.mp4"
        path.write_bytes(data)
        row = {"messages": [{"role": "user", "content": [{"type": "video", "video": str(path), **c["item"]},
                                                         {"type": "text", "text": "Describe it"}]},
                            {"role": "assistant", "content": "A moving bar."}]}
    else:
        row = {"messages": oracle_msgs, "videos": [data], **({"images": [img]} if c.get("image") else {})}
    return row, oracle_msgs, frames, fps, [img] if c.get("image") else []


def sampled(name: str, frames: list, fps: float, spec) -> tuple[list[int], float, VideoOptions]:
    """The sampled frame indices (qwen-vl-utils' rule), the metadata fps, and the options."""
    c = CASES[name]
    opts = VideoOptions(**c["options"])
    if c.get("item"):
        opts = VideoOptions(**{**c["options"], "fps": None, **c["item"]})
    if c.get("frames"):
        k = len(frames) + (-len(frames) % 2)
        return list(range(k)), fps, opts  # a frame list: every frame, padded (qwen-vl-utils' metadata)
    k = sample_count(len(frames), fps, opts)
    return torch.linspace(0, len(frames) - 1, k).round().long().tolist(), fps, opts


def processor_oracle(family, messages, images, video_frames, grid, frames_indices, fps):
    """ids, mm_token_type_ids and image grids the real processor class writes for these inputs."""
    from transformers.video_utils import VideoMetadata

    proc = oracle_processor(family)
    text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    img_out = proc.image_processor(images=images, return_tensors="np") if images else None
    img_rep = [proc.replace_image_token(img_out, image_idx=i) for i in range(len(images))]
    meta = VideoMetadata(total_num_frames=len(video_frames), fps=fps, frames_indices=list(frames_indices))
    vid_in = {"video_grid_thw": np.asarray([grid]), "video_metadata": [meta]}
    texts, _ = proc.get_text_with_replacements([text], img_rep, [proc.replace_video_token(vid_in, video_idx=0)])
    ids = proc.tokenizer(texts)["input_ids"][0]
    mm = proc.create_mm_token_type_ids([ids])[0]
    return np.asarray(ids), np.asarray(mm), (img_out["image_grid_thw"] if img_out else np.zeros((0, 3)))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", list(CASES))
def test_video_rows_equal_the_processor(family, name, tmp_path):
    row, messages, frames, fps, images = build_case(name, tmp_path)
    proc = processor_for(family)
    spec = VisionSpec.from_processor(proc)
    got = mmpipe.encode_row(row, proc, idx=0, video_options=CASES[name]["options"])
    got.validate()
    idx, meta_fps, opts = sampled(name, frames, fps, spec)
    use = [frames[min(i, len(frames) - 1)] for i in idx]
    use += [use[-1]] * (-len(use) % spec.temporal_patch_size)
    min_px, max_px = frame_bounds(len(idx), spec, opts)
    ref_pv, grid = image_processor_video(family, use, min_px, max_px)
    ids, mm, img_grids = processor_oracle(family, messages, images, frames, grid, idx, meta_fps)
    assert got.input_ids.tolist() == ids.tolist()
    assert np.array_equal(got.mm_token_type_ids, mm)
    assert got.video_grid_thw.tolist() == [grid] and np.array_equal(got.image_grid_thw, img_grids)
    assert got.pixel_values_videos_u8.dtype == np.uint8
    assert np.array_equal(u8_video_to_pixel_values(got.pixel_values_videos_u8, spec.for_videos().lut()), ref_pv)
    sample_fps = fps if CASES[name].get("frames") else len(idx) / len(frames) * fps
    assert got.second_per_grid_ts.tolist() == [np.float32(spec.temporal_patch_size / sample_fps)]
    assert (got.labels[got.mm_token_type_ids > 0] == -100).all() and (got.labels != -100).any()
    assert ((got.labels == -100) | (got.labels == got.input_ids)).all()
    assert_row_positions(got, model=model_for(family))
    # float32 pixels: the processor's pixel_values_videos directly
    f32 = mmpipe.encode_row(row, proc, idx=0, video_options=CASES[name]["options"], pixels="float32")
    assert np.array_equal(f32.pixel_values_videos, ref_pv) and f32.input_ids.tolist() == ids.tolist()


@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_video_pixels_do_not_depend_on_the_image_backend(pixels, tmp_path):
    """image_backend governs images only: videos follow the video processor's torchvision rule
    for both backends (same video pixels), while a photo's image pixels differ."""
    proc = processor_for("qwen2_5_vl")
    row, *_ = build_case("column", tmp_path)
    row["images"] = [testing.sample_photos()[0][1]]
    pil, tv = (mmpipe.encode_row(row, proc, idx=0, image_backend=b, pixels=pixels, video_options=BOUNDS)
               for b in ("pil", "torchvision"))
    assert pil.image_backend == "pil" and tv.image_backend == "torchvision"
    v, i = ("pixel_values_videos", "pixel_values") if pixels == "float32" else ("pixel_values_videos_u8", "pixel_values_u8")
    assert np.array_equal(getattr(pil, v), getattr(tv, v)) and pil.video_grid_thw.tolist() == tv.video_grid_thw.tolist()
    assert not np.array_equal(getattr(pil, i), getattr(tv, i))
    a, b = (mmpipe.collate([r], processor=proc) for r in (pil, tv))  # expanded at collate with each row's spec
    assert torch.equal(a.pixel_values_videos, b.pixel_values_videos)
    assert not torch.equal(a.pixel_values, b.pixel_values)
    # rows with videos and no images batch together whatever backend they were encoded with
    vo = build_case("fps", tmp_path)[0]
    rows = [mmpipe.encode_row(vo, proc, idx=0, image_backend=b, pixels=pixels, video_options=BOUNDS)
            for b in ("pil", "torchvision")]
    both = mmpipe.collate(rows, processor=proc)
    half = both.pixel_values_videos.shape[0] // 2
    assert torch.equal(both.pixel_values_videos[:half], both.pixel_values_videos[half:])


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_and_zero_video_rows_batch_like_rows_alone(family, tmp_path):
    proc = processor_for(family)
    video_row, *_ = build_case("column", tmp_path)
    frames_row, *_ = build_case("prompt", tmp_path)
    rows = [mmpipe.encode_row(r, proc, idx=i, video_options=BOUNDS) for i, r in enumerate([
        video_row, {"messages": [{"role": "user", "content": "no media at all"}]},
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
         "images": [testing.tiny_image(48, 40)]},
        frames_row])]
    for r in rows:
        assert_row_positions(r)
    batch = assert_roundtrip(rows, processor=proc)
    assert_positions_match_rows(batch, rows, model=model_for(family))
    assert batch.sample_to_video_indices == [[0], [], [], [1]]
    # the model sees the videos: batched logits == each row alone, and a changed frame changes only its row
    model = model_for(family)
    assert_batched_logits_match(model, rows, proc, batch=batch, rtol=1e-5, atol=1e-5)
    frames = frames_row["videos"][0]["frames"]
    edited = dict(frames_row, videos=[{"frames": frames[:2] + [Image.fromarray(255 - np.asarray(frames[2]))]
                                       + frames[3:], "fps": frames_row["videos"][0]["fps"]}])
    rows2 = rows[:3] + [mmpipe.encode_row(edited, proc, idx=3, video_options=BOUNDS)]
    with torch.no_grad():
        a, b = (model(**mmpipe.collate(r, processor=proc).model_inputs()).logits for r in (rows, rows2))
    assert torch.equal(a[:3], b[:3]) and not torch.allclose(a[3], b[3])


def test_layout_only_equals_full_path_and_decodes_no_frame(monkeypatch, tmp_path):
    """``pixels="none"``: ids, grids, times and positions from the container's metadata; the
    decode calls are counted by wrapping mmpipe's own frame iterator."""
    calls = {"n": 0}
    frames = Container.frames

    def counted(self):
        calls["n"] += 1
        return frames(self)

    monkeypatch.setattr(Container, "frames", counted)
    for family in FAMILIES:
        proc = processor_for(family)
        for name in ("column", "inline", "fps"):
            row, *_ = build_case(name, tmp_path)
            calls["n"] = 0
            full = mmpipe.encode_row(row, proc, video_options=CASES[name]["options"])
            assert calls["n"] == 1
            lay = mmpipe.encode_row(row, proc, video_options=CASES[name]["options"], pixels="none")
            assert calls["n"] == 1, "the layout-only path decoded frames"
            assert lay.pixel_format == "none"
            for col in ("input_ids", "mm_token_type_ids", "position_ids", "video_grid_thw", "second_per_grid_ts",
                        "image_grid_thw", "labels"):
                assert np.array_equal(getattr(lay, col), getattr(full, col)), (family, name, col)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_truncation_never_cuts_a_video_block(family):
    proc = processor_for(family)
    data = make_video(12, 6.0, 56, 56)
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "video"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "word " * 30}]}], "videos": [data]}
    full = mmpipe.encode_row(row, proc, video_options=BOUNDS)
    vis = np.flatnonzero(full.mm_token_type_ids == 2)
    vs, ve = (proc.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    # the video block ends after its vision_end token(s): Qwen3-VL closes the last frame group, then (where
    # its processor keeps the template's pair: transformers < 5.25) the video
    outer = family == "qwen3_vl" and keeps_video_wrapper(proc, mmpipe.family_of(proc))
    end = int(vis[-1]) + (3 if outer else 2)
    assert full.input_ids[end - 1] == ve and full.input_ids[end] != ve
    for cap in range(int(vis[0]) - 2, end + 3):
        if cap < end:
            with pytest.raises(TruncationError, match="would cut into a video"):
                mmpipe.encode_row(row, proc, video_options=BOUNDS, max_length=cap, truncation="truncate_text",
                                  labels=False)
            continue
        cut = mmpipe.encode_row(row, proc, video_options=BOUNDS, max_length=cap, truncation="truncate_text",
                                labels=False)
        cut.validate()
        assert_row_positions(cut)
        assert cut.num_tokens == cap and np.array_equal(cut.input_ids, full.input_ids[:cap])
        assert np.array_equal(cut.pixel_values_videos_u8, full.pixel_values_videos_u8)
    assert (full.input_ids == vs).sum() == (outer + full.video_grid_thw[0, 0] if family == "qwen3_vl" else 1)
    with pytest.raises(TruncationError, match="video tokens"):
        mmpipe.encode_row(row, proc, video_options=BOUNDS, max_length=end)
    short = [{"role": "user", "content": [{"type": "text", "text": "short"}]}]
    ds = datasets.Dataset.from_list([{"messages": row["messages"], "videos": [data]}, {"messages": short, "videos": []}])
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "video_options": BOUNDS, "max_length": end,
                                           "truncation": "drop"}, batched=True, remove_columns=ds.column_names)
    assert len(out) == 1 and out[0]["video_grid_thw"] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_video_in_an_assistant_turn_is_input_not_target(family):
    """A video inside an assistant reply: its whole expansion (Qwen3-VL: timestamps and frame
    group borders too) is -100, the reply's text around it is labelled."""
    proc = processor_for(family)
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "show me"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "here:"}, {"type": "video"},
                                                          {"type": "text", "text": "done"}]}],
           "videos": [{"frames": [testing.tiny_image(56, 56, seed=i) for i in range(4)], "fps": 1.0}]}
    r = mmpipe.encode_row(row, proc, video_options=BOUNDS)
    r.validate()
    vis = np.flatnonzero(r.mm_token_type_ids == 2)
    inner = slice(int(vis[0]), int(vis[-1]) + 1)
    assert (r.labels[inner] == -100).all()
    assert ((r.labels == -100) | (r.labels == r.input_ids)).all()
    text = proc.tokenizer.decode(r.input_ids[r.labels != -100])
    assert "here:" in text and "done" in text and "seconds" not in text
    assert_row_positions(r)


def _bad_videos(tmp_path) -> dict:
    good = make_video(10, 10.0, 32, 32)
    tag = b"avc1" if b"avc1" in good else b"mp4v"
    empty = make_video(0, 10.0, 32, 32)
    return {"corrupt container": b"\x00\x00\x00\x18ftypmp42" + os.urandom(2000),
            "zero frames": empty, "no frames in a list": {"frames": [], "fps": 2.0},
            "unreadable codec": good.replace(tag, b"zzzz"), "huge dimensions": good}


def test_bad_videos_raise_typed_errors_naming_row_and_column(monkeypatch, tmp_path):
    monkeypatch.setattr(V, "MAX_FRAME_PIXELS", 1000)  # "huge": more pixels per frame than the limit
    proc = processor_for("qwen2_5_vl")
    bad = _bad_videos(tmp_path)
    rows = [{"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": k}]}],
             "videos": [v]} for k, v in bad.items()]
    for i, (name, row) in enumerate(zip(bad, rows)):
        with pytest.raises(VideoError) as e:
            mmpipe.encode(row, 7, processor=proc, video_options=BOUNDS)
        msg = str(e.value)
        assert e.value.row == 7 and e.value.column == "videos" and "row 7, video 0" in msg, (name, msg)
        assert isinstance(e.value, mmpipe.errors.DOCUMENTED_ERRORS)
    ds = datasets.Dataset.from_list([r for r in rows if not isinstance(r["videos"][0], dict)])  # Arrow: one type
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "video_options": BOUNDS, "on_error": "skip"},
                 with_indices=True, batched=True, remove_columns=ds.column_names)
    records = [json.loads(x) for x in out[ERROR_COLUMN]]
    assert [r["row"] for r in records] == list(range(len(ds)))
    assert {r["column"] for r in records} == {"videos"} and {r["stage"] for r in records} == {"image"}
    with pytest.raises(PlaceholderError, match="video"):  # a video with no placeholder
        mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}], "videos": [bad["zero frames"]]}, proc)
    good = tmp_path / "in" / "ok.mp4"
    good.parent.mkdir()
    (tmp_path / "elsewhere").mkdir()
    good.write_bytes(make_video(8, 4.0, 24, 28))  # under the lowered MAX_FRAME_PIXELS
    row = {"messages": [{"role": "user", "content": [{"type": "video"}]}], "videos": [str(good)]}
    with pytest.raises(VideoError, match="outside the image root") as e:  # image_root confines video paths too
        mmpipe.encode_row(row, proc, idx=2, image_root=str(tmp_path / "elsewhere"), video_options=BOUNDS)
    assert e.value.column == "videos" and str(e.value).startswith("row 2, video 0")
    assert mmpipe.encode_row(row, proc, image_root=str(good.parent), video_options=BOUNDS).num_videos == 1
    with pytest.raises(VideoError, match="pixels='source'"):
        mmpipe.encode_row(row, proc, pixels="source", video_options=BOUNDS)
    # a literal <video> in text stays text when the row has no videos column
    plain = mmpipe.encode_row({"prompt": "what is <video>?", "images": []}, proc)
    assert plain.num_videos == 0 and "<video>" in proc.tokenizer.decode(plain.input_ids)


@pytest.mark.parametrize("decode", [False, True])
def test_datasets_video_columns(tmp_path, decode):
    """datasets 5 hands a ``Video()`` column to map as torchcodec decoders (absent here: reading
    the column raises) and a ``Video(decode=False)`` column as ``{"path", "bytes"}`` dicts.
    `encode_dataset` reads Video columns undecoded; a plain map of a decoding column gets a
    VideoError saying how to read it undecoded."""
    proc = processor_for("qwen2_vl")
    data = make_video(12, 6.0, 40, 48)
    path = tmp_path / "v.mp4"
    path.write_bytes(data)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}]
    features = datasets.Features({"messages": [{"role": datasets.Value("string"), "content": [
        {"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "videos": datasets.List(datasets.Video(decode=decode))})
    ds = datasets.Dataset.from_dict({"messages": [msgs, msgs], "videos": [[str(path)], [{"path": None, "bytes": data}]]},
                                    features=features)
    want = mmpipe.encode_row({"messages": msgs, "videos": [data]}, proc, video_options=BOUNDS)
    enc, report = mmpipe.encode_dataset(ds, proc, video_options=BOUNDS)
    assert report.rows_out == 2
    # encode_dataset's writer buffer counts the videos: the bound covers the stored bytes
    bound = video_row_bytes(mmpipe.Encoder(proc, video_options=BOUNDS), ds)
    assert want.pixel_values_videos_u8.nbytes <= bound == 3 * BOUNDS["max_pixels"] * 768
    assert video_row_bytes(mmpipe.Encoder(proc, video_options=BOUNDS), ds.remove_columns("videos")) == 0
    for r in enc:
        assert mmpipe.MultiModalInputs.from_dict(r) == want
    fn_kwargs = {"processor": proc, "video_options": BOUNDS}
    if decode and not datasets.config.TORCHCODEC_AVAILABLE:
        with pytest.raises(VideoError, match="decode=False"):
            ds.map(mmpipe.encode, fn_kwargs=fn_kwargs, remove_columns=ds.column_names)
    else:
        out = ds.map(mmpipe.encode, fn_kwargs=fn_kwargs, remove_columns=ds.column_names)
        assert mmpipe.MultiModalInputs.from_dict(out[1]) == want


def test_text_only_tokenizer_refuses_videos():
    tok = processor_for("qwen2_vl").tokenizer
    with pytest.raises(PlaceholderError, match="video"):
        mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "video"}]}],
                           "videos": [[np.zeros((28, 28, 3), np.uint8)] * 2]}, tok)


def test_memory_bounded_encoding_a_long_video(tmp_path):
    """A 10-minute 5 fps 128x96 clip (3000 frames; 110 MB as decoded RGB) through `encode_row` in
    a subprocess: its peak RSS grows by far less than the decoded clip over encoding a short one."""
    long, short = tmp_path / "long.mp4", tmp_path / "short.mp4"
    long.write_bytes(make_video(3000, 5.0, 96, 128))
    short.write_bytes(make_video(20, 5.0, 96, 128))
    code = textwrap.dedent(f"""
        import resource, mmpipe
        from mmpipe import testing
        proc = testing.build_processor("qwen2_vl")
        def run(path):
            row = {{"messages": [{{"role": "user", "content": [{{"type": "video"}}]}}], "videos": [path]}}
            return mmpipe.encode_row(row, proc, video_options={{"max_frames": 16, **{BOUNDS!r}}})
        run({str(short)!r})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = run({str(long)!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(before, after, r.video_grid_thw.tolist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, grid = out.stdout.split(maxsplit=2)
    grown_mb = (int(after) - int(before)) / 1024
    assert grid.strip().startswith("[[8,"), grid
    assert grown_mb < 30, f"peak RSS grew by {grown_mb:.1f} MB encoding a 110 MB (decoded) clip"  # 1.1 MB measured


def test_readme_videos_block_runs():
    exec(compile(readme_block("## Videos"), "README.md", "exec"), {})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=video_raw_rows(), family=st.sampled_from(FAMILIES))
def test_any_video_row_encodes_consistently(case, family):
    """Any frame-list video row, any convention: the row validates, its grid counts the frames
    (padded to an even count), positions follow the rule, layout-only equals the full path."""
    row, n = case
    proc = processor_for(family)
    r = mmpipe.encode_row(row, proc, video_options=BOUNDS)
    r.validate()
    assert r.num_videos == 1 and int(r.video_grid_thw[0, 0]) == (n + n % 2) // 2
    assert (r.labels[r.mm_token_type_ids > 0] == -100).all() if r.labels is not None else True
    assert_row_positions(r)
    lay = mmpipe.encode_row(row, proc, video_options=BOUNDS, pixels="none")
    for col in ("input_ids", "mm_token_type_ids", "position_ids", "video_grid_thw", "second_per_grid_ts"):
        assert np.array_equal(getattr(lay, col), getattr(r, col)), col


def test_the_video_wrapper_rule_is_the_processors_own():
    """`keeps_video_wrapper` asks the processor's text step: a collapsing step (transformers >= 5.25's
    Qwen3-VL) -> False, a keeping one or none (earlier lines, a tokenizer) -> True, a failing one -> a
    typed error; families without frame blocks -> True. The installed processor is checked against
    the processor's own ids in test_video_rows_equal_the_processor."""
    from mmpipe.errors import ArgumentError

    fam, other = mmpipe.family_of(processor_for("qwen3_vl")), mmpipe.family_of(processor_for("qwen2_vl"))

    def step(collapse):
        def run(text, videos_replacements=()):
            wrapper = "<|vision_start|><|video_pad|><|vision_end|>"
            inner = "<|video_pad|>" if not collapse else wrapper
            return [t.replace(inner, videos_replacements[0]) for t in text], [[]]
        return SimpleNamespace(get_text_with_replacements=run)

    assert keeps_video_wrapper(step(collapse=True), fam) is False
    assert keeps_video_wrapper(step(collapse=False), fam) is True
    assert keeps_video_wrapper(SimpleNamespace(), fam) is True
    assert keeps_video_wrapper(step(collapse=True), other) is True

    def broken(text, videos_replacements=()):
        raise TypeError("unexpected keyword")

    with pytest.raises(ArgumentError, match="lays out video placeholders"):
        keeps_video_wrapper(SimpleNamespace(get_text_with_replacements=broken), fam)
