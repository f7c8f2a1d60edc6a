"""Pixel oracle for videos: mmpipe's sampled, resized and patched frames (`mmpipe.images.video`),
expanded to float32 as collate expands them, against the REAL transformers video processors
(``Qwen2VLVideoProcessor``, ``Qwen2VLVideoProcessor`` for Qwen2.5-VL, ``Qwen3VLVideoProcessor``)
on the same frames with the same bounds.

The stock video processors exist only as torchvision implementations (transformers has no PIL
video processor): they resize with torchvision's antialiased bicubic on uint8 tensors and
rescale+normalise in one fused float32 step. mmpipe's videos therefore follow that rule
whatever ``image_backend`` is (`VisionSpec.for_videos`; the backend governs images only), and
are checked bit-exact (pixels and grids) under the DEFAULT settings (``image_backend`` not
given: the PIL backend for images) and under ``image_backend="torchvision"``. (Measured before
this rule, by helper V2: PIL-rule video frames differed from the stock processors by up to
0.03 / 0.094.)

Runs in the vLLM test environment (scripts/envs/vllm.sh), where torchvision's transforms work.
Same bounds: mmpipe's per-frame ``(min_pixels, max_pixels)`` (`frame_bounds`, qwen-vl-utils);
Qwen3-VL's video processor bounds the whole clip (``t * h * w``), so it gets ``n`` times the
per-frame bounds for ``n`` (even) frames, which gives the same ``smart_resize`` result.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from conftest import FAMILIES
from mmpipe.images.pixels import u8_video_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import FRAME_FACTOR, VideoOptions, encode_video, frame_bounds

pytestmark = pytest.mark.needs_env("vllm")

# (frames, height, width, source): odd counts exercise the last-frame padding, the wide clip
# the aspect handling, the large one a downscale, the small one an upscale
CASES = [(4, 90, 120, "random"), (5, 200, 150, "photo"), (6, 333, 500, "photo"), (3, 64, 640, "random"),
         (2, 700, 1000, "photo")]


def _video_processor(family):
    from mmpipe.offline.checkpoints import build_checkpoint_processor

    return build_checkpoint_processor(family).video_processor


def _frames(n, h, w, source, seed, photos):
    rng = np.random.default_rng(seed)
    if source == "random":
        return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]
    base = np.asarray(photos[seed % len(photos)].convert("RGB").resize((w, h)), dtype=np.int16)
    return [np.clip(base + rng.integers(-24, 25, base.shape), 0, 255).astype(np.uint8) for _ in range(n)]


def _reference(vp, family, frames, spec, opts=VideoOptions()):
    """The real video processor on ``frames`` (already sampled: no re-sampling) with mmpipe's bounds."""
    lo, hi = frame_bounds(len(frames), spec, opts)
    scale = len(frames) if mmpipe.family_of(family).rope == "mrope_frames" else 1
    out = vp(videos=[np.stack(frames)], do_sample_frames=False, cap_pixels_per_frame=False, return_tensors="np",
             size={"shortest_edge": int(lo * scale), "longest_edge": int(hi * scale)})
    return out["pixel_values_videos"], [int(v) for v in out["video_grid_thw"][0]]


@pytest.mark.parametrize("backend", ["pil", "torchvision"])
@pytest.mark.parametrize("family", FAMILIES)
def test_video_frames_equal_the_stock_video_processor_for_both_image_backends(family, backend, photos):
    vp = _video_processor(family)
    spec = VisionSpec.from_family(mmpipe.family_of(family), backend=backend)
    for k, (n, h, w, source) in enumerate(CASES):
        frames = _frames(n, h, w, source, k, photos)
        got = encode_video(frames, spec)
        padded = [frames[min(i, n - 1)] for i in range(-(-n // FRAME_FACTOR) * FRAME_FACTOR)]  # qwen-vl-utils
        ref, grid = _reference(vp, family, padded, spec)
        assert list(got.grid) == grid, (family, n, h, w)
        pv = u8_video_to_pixel_values(got.patches, spec.for_videos().lut())  # what collate feeds the model
        assert pv.dtype == ref.dtype and np.array_equal(pv, ref), (family, backend, n, h, w)


def test_decoded_container_equals_the_processor_on_the_decoded_frames(tmp_path, photos):
    """A real file: PyAV-encoded mp4 (h264 where available), decoded by mmpipe with its
    sampling; the stock processor gets the frames at mmpipe's indices, decoded independently."""
    import av  # installed by scripts/envs/vllm.sh
    path = tmp_path / "clip.mp4"
    frames = _frames(23, 96, 128, "photo", 1, photos)
    with av.open(str(path), "w") as c:
        codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        s = c.add_stream(codec, rate=10)
        s.width, s.height, s.pix_fmt = 128, 96, "yuv420p"
        for f in frames:
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    with av.open(str(path)) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    family = "qwen2_5_vl"
    spec = VisionSpec.from_family(mmpipe.family_of(family))  # the default (PIL) image backend
    opts = VideoOptions(fps=4.0)
    got = encode_video(str(path), spec, opts)
    assert got.second_per_grid_ts == pytest.approx(2 / (len(got.frame_indices) / len(decoded) * 10))
    ref, grid = _reference(_video_processor(family), family, [decoded[i] for i in got.frame_indices], spec, opts)
    assert list(got.grid) == grid
    assert np.array_equal(u8_video_to_pixel_values(got.patches, spec.for_videos().lut()), ref)


@pytest.mark.parametrize("image_backend", [None, "torchvision"])
@pytest.mark.parametrize("family", FAMILIES)
def test_encoded_and_collated_rows_equal_the_stock_video_processor(family, image_backend, photos):
    """End to end: ``mmpipe.encode_row`` (PIL frames; ``image_backend`` not given = the default,
    PIL for images, or ``"torchvision"``) then ``mmpipe.collate`` -> ``pixel_values_videos`` /
    ``video_grid_thw`` == the stock video processor on the same frames with the same bounds."""
    from PIL import Image

    from mmpipe.offline import build_processor

    proc = build_processor(family)
    opts = {"min_pixels": 28 * 28 * 8, "max_pixels": 28 * 28 * 40}
    frames = _frames(5, 120, 160, "photo", 2, photos)
    raw = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}],
           "videos": [{"frames": [Image.fromarray(f) for f in frames], "fps": 2.0}]}
    kw = {} if image_backend is None else {"image_backend": image_backend}
    enc = mmpipe.Encoder(proc, labels=False, video_options=opts, **kw)
    row = enc.encode_row(raw)
    assert row.image_backend == (image_backend or "pil")  # the default really is the PIL backend here
    batch = mmpipe.collate([row], processor=proc)
    spec = VisionSpec.from_family(mmpipe.family_of(family))
    padded = frames + [frames[-1]]
    ref, grid = _reference(_video_processor(family), family, padded, spec, VideoOptions(**opts))
    assert batch.video_grid_thw.tolist() == [grid]
    assert np.array_equal(batch.pixel_values_videos.numpy(), ref)
