"""GLM-4.6V videos against the STOCK ``Glm46VProcessor`` with its ``Glm46VVideoProcessor`` (torchvision's
Python transforms: the "vision" environment, scripts/envs/vision.sh).

- the chat path: ``apply_chat_template([{"type": "video", "path": file}, ...], tokenize=True,
  return_dict=True)`` decoding the file with transformers' PyAV reader (torchcodec does not load
  here) and sampling by ``sample_frames`` (a rate by the duration);
- the flat call: ``proc(text=, videos=[every decoded frame], video_metadata=, do_sample_frames=True)``;
- ``sample_frames`` itself on metadata of short, long (> 30 s, > 300 s, > 2400 s) and odd-rate videos;
- padded batches: the tiny ``Glm46VForConditionalGeneration`` on the processor's own batch call
  (padding=True) == on ``mmpipe.collate`` of the rows, positions == ``get_rope_index``.

Held equal: ``input_ids`` (``"1.5 seconds"`` frame times), ``mm_token_type_ids``, ``video_grid_thw``,
``pixel_values_videos`` (``pixels="float32"``, and the uint8 rows expanded at collate).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.families import GLM46V
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import video_layout
from mmpipe.images.video_processor_plan import processor_options
from mmpipe.encoding.glm_videos import glm46v_plan, glm46v_sample_indices

from helpers import all_frames, make_video, pyav_chat_path

pytestmark = pytest.mark.needs_env("vision")
av = pytest.importorskip("av", reason="PyAV is a test extra")
BOUNDS = {"min_pixels": 28 * 28 * 2 * 4, "max_pixels": 28 * 28 * 2 * 16 * 4}
# name, frames, fps, extra make_video arguments: under 30 s (3 fps rate), 35 s (1 fps), 2 frames, odd, vfr
CLIPS = [("3.7s@24", 89, 24, {}), ("35s@2", 70, 2, {}), ("2 frames", 2, 2, {}), ("9@2", 9, 2, {}),
         ("vfr", 20, 10, {"pts": [i * 100 + (i % 3) * 40 for i in range(20)]})]
ASK = [{"type": "text", "text": "What?"}]


@pytest.fixture
def sampled(monkeypatch):
    """The chat path's decoder: transformers' PyAV reader; returns the source frames it sampled."""
    return pyav_chat_path(monkeypatch)


def _stock():
    import transformers

    from mmpipe.offline.glm46v import GLM46V_CHAT_TEMPLATE

    proc0 = testing.build_processor("glm46v")
    video = transformers.Glm46VVideoProcessor(
        size={"shortest_edge": BOUNDS["min_pixels"], "longest_edge": BOUNDS["max_pixels"]},
        patch_size=GLM46V.patch_size, temporal_patch_size=GLM46V.temporal_patch_size, merge_size=GLM46V.merge_size,
        image_mean=list(GLM46V.image_mean), image_std=list(GLM46V.image_std))
    return transformers.Glm46VProcessor(image_processor=proc0.image_processor, tokenizer=proc0.tokenizer,
                                        video_processor=video, chat_template=GLM46V_CHAT_TEMPLATE)


def _check(row, out, spec):
    assert row.input_ids.tolist() == out["input_ids"][0].tolist()
    assert row.mm_token_type_ids.tolist() == out["mm_token_type_ids"][0].tolist()
    assert row.video_grid_thw.tolist() == out["video_grid_thw"].tolist()
    pv = row.pixel_values_videos if row.pixel_values_videos is not None else \
        u8_video_to_pixel_values(row.pixel_values_videos_u8, spec.for_videos().lut())
    assert np.array_equal(np.asarray(pv), np.asarray(out["pixel_values_videos"]))


def test_rows_equal_the_processor_chat_path_on_files(sampled, tmp_path):
    """Each clip, default options (the bounds) and processor_options(stock): the chat path's sampled
    frames, ids with their "X.Y seconds", token types, grid and pixels."""
    stock, proc0 = _stock(), testing.build_processor("glm46v")
    spec = VisionSpec.from_processor(proc0)
    for name, n, fps, extra in CLIPS:
        path = tmp_path / f"{name}.mp4"
        path.write_bytes(make_video(n, fps, 48, 64, seed=n, **extra))
        sampled.clear()
        out = stock.apply_chat_template([{"role": "user", "content": [{"type": "video", "path": str(path)}, *ASK]}],
                                        tokenize=True, return_dict=True, add_generation_prompt=True,
                                        return_tensors="np")
        msgs = [{"role": "user", "content": [{"type": "video"}, *ASK]}]
        for proc, opts, pixels in ((proc0, BOUNDS, "uint8"), (stock, processor_options(stock), "float32")):
            row = mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc, video_options=opts,
                                    pixels=pixels, labels=False)
            _check(row, out, spec)
        lay = video_layout(str(path), spec.for_videos(), mmpipe.images.video.VideoOptions(**BOUNDS), plan=glm46v_plan)
        assert lay.frame_indices.tolist() == sampled[0], name
        assert "seconds" in proc0.tokenizer.decode(row.input_ids)


def test_rows_equal_the_flat_call_and_its_padded_batch_logits():
    """Three rows (a clip sampled by the processor, a frame list used whole, a text row) == the flat
    processor call per row; the processor's padded batch call and mmpipe's collate give the same
    inputs and logits on the tiny Glm46V model (both padding sides), positions == get_rope_index."""
    from mmpipe.offline.glm46v import build_model
    from mmpipe.testing.invariants import assert_positions_match_rows

    stock, proc0, model = _stock(), testing.build_processor("glm46v"), build_model()
    spec = VisionSpec.from_processor(proc0)
    clip, small = make_video(89, 24.0, 48, 64, seed=3), all_frames(make_video(7, 3.0, 56, 84, seed=1))
    frames = all_frames(clip)
    msgs = [{"role": "user", "content": [{"type": "video"}, *ASK]}, {"role": "assistant", "content": "A bar."}]
    cases = [(clip, np.stack(frames), dict(total_num_frames=89, fps=24.0, duration=89 / 24.0), True),
             ({"frames": list(small), "fps": 3.0}, np.stack(small),
              dict(total_num_frames=7, fps=3.0, duration=7 / 3.0, frames_indices=list(range(7))), False),
             (None, None, None, None)]
    rows, texts, videos, metas = [], [], [], []
    for i, (value, arr, meta, sample) in enumerate(cases):
        m = msgs if value is not None else [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ok."}]
        row = mmpipe.encode_row({"messages": m, "videos": [value] if value is not None else []}, proc0, idx=i,
                                video_options=BOUNDS)
        texts.append(stock.apply_chat_template(m, tokenize=False))
        if value is not None:
            out = stock(text=texts[-1:], videos=[arr], video_metadata=[meta], do_sample_frames=sample,
                        return_tensors="np")
            _check(row, out, spec)
            videos.append(arr)
            metas.append(meta)
        rows.append(row)
    for side in ("left", "right"):
        stock.tokenizer.padding_side = side
        ref = stock(text=texts, videos=videos, video_metadata=metas, do_sample_frames=True, padding=True,
                    return_tensors="pt")  # the frame list's 7 frames: the rule keeps all of a 2.3 s clip
        batch = mmpipe.collate(rows, processor=proc0, padding_side=side)
        got = batch.model_inputs()
        for k in ("input_ids", "attention_mask", "mm_token_type_ids", "video_grid_thw", "pixel_values_videos"):
            assert torch.equal(got[k].to(ref[k].dtype), ref[k]), (side, k)
        assert_positions_match_rows(batch, rows, model=model)
        with torch.no_grad():
            a, b = model(**got).logits, model(**ref).logits
        mask = ref["attention_mask"].bool()
        torch.testing.assert_close(a[mask], b[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("total,video_fps", [(20, 10.0), (31, 29.97), (7, 3.0), (1, 24.0), (2, 2.0), (89, 24.0),
                                             (70, 2.0), (901, 30.0), (9001, 30.0), (700, 2.0), (40000, 25.0),
                                             (3000, 1.0), (200000, 60.0), (59, 1.0)])
def test_frame_sampling_equals_the_video_processor(total, video_fps):
    """`glm46v_sample_indices` == ``Glm46VVideoProcessor.sample_frames``: each rate (3 / 1 / 0.5 fps),
    the 640-frame cap, the 2400 s cap, fewer frames than asked (linspace), odd counts."""
    from transformers import Glm46VVideoProcessor
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=total, fps=video_fps, duration=total / video_fps)
    ref = Glm46VVideoProcessor().sample_frames(meta)
    assert glm46v_sample_indices(total, video_fps, total / video_fps).tolist() == ref.tolist()


def test_glmga_video_processor_is_refused():
    """A GLM-GA checkpoint's Glm46VProcessor holds GlmgaVideoProcessor (fps 2, up to 640 frames): its
    chat path samples other frames than Glm46VVideoProcessor (20 frames at 10 fps: 4 vs 12), so its
    video rows are refused (VideoError naming both classes), never Glm46V's frames."""
    import transformers

    stock = _stock()
    stock.video_processor = transformers.GlmgaVideoProcessor(
        size={"shortest_edge": BOUNDS["min_pixels"], "longest_edge": BOUNDS["max_pixels"]})
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=20, fps=10.0, duration=2.0)
    assert stock.video_processor.sample_frames(meta).tolist() != glm46v_sample_indices(20, 10.0, 2.0).tolist()
    msgs = [{"role": "user", "content": [{"type": "video"}, *ASK]}]
    with pytest.raises(mmpipe.errors.VideoError, match="GlmgaVideoProcessor"):
        mmpipe.encode_row({"messages": msgs, "videos": [make_video(20, 10.0, 48, 64, seed=1)]}, stock,
                          video_options=BOUNDS)
