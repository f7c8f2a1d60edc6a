"""Video: one clip encoded by mmpipe (PyAV decode of the sampled frames, Qwen sizing, uint8
patches; collate's float32 expansion timed too) against what a peer user runs on the same
frames: PyAV decode keeping the same sampled frames, then transformers' stock Qwen2-VL video
processor (``Qwen2VLVideoProcessor``, ``do_sample_frames=False``, mmpipe's per-frame bounds).

The stock video processors need torchvision, which only the vLLM test environment has: the
baseline runs in ``bash scripts/bench.sh --torchvision``; the main run reports mmpipe's side and
the bytes per frame only. Outputs are checked identical (pixel values and grid) before timing.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

from .report import Result, fig, speed
from .timing import side_by_side

CLIP = (12.0, 30, 480, 640)  # seconds, fps, height, width: a phone clip at 480p
QUICK_CLIP = (3.0, 10, 96, 128)


def make_clip(seconds: float, fps: int, h: int, w: int, seed: int = 0) -> bytes:
    """A moving photo-like scene (noise texture panning, a bar sweeping), h264 in mp4 (mpeg4
    where libx264 is missing), made with PyAV."""
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w * 2, 3), dtype=np.uint8)
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream(codec, rate=Fraction(fps))
        s.height, s.width, s.pix_fmt = h, w, "yuv420p"
        for i in range(int(seconds * fps)):
            a = np.ascontiguousarray(base[:, i % w: i % w + w])
            a[(i * 3) % h: (i * 3) % h + 6] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def _decode_sampled(data: bytes, indices: np.ndarray) -> list[np.ndarray]:
    """The baseline's decode: PyAV over the stream, keeping the sampled frames (in order,
    repeats kept), stopping after the last one."""
    import av

    want = np.bincount(indices, minlength=int(indices.max()) + 1)
    out = []
    with av.open(io.BytesIO(data)) as c:
        for i, frame in enumerate(c.decode(video=0)):
            if i < len(want) and want[i]:
                out.extend([frame.to_ndarray(format="rgb24")] * int(want[i]))
            if i >= len(want) - 1:
                break
    return out


def _stock_video_processor(proc):
    """The stock Qwen2-VL video processor (needs torchvision), or None where it cannot load."""
    from mmpipe.images.backends import processor_backend

    if processor_backend(proc) != "torchvision":
        return None
    import transformers

    return transformers.Qwen2VLVideoProcessor(
        patch_size=proc.image_processor.patch_size, temporal_patch_size=proc.image_processor.temporal_patch_size,
        merge_size=proc.image_processor.merge_size)


def case_video(ctx) -> list[Result]:
    from mmpipe.images.pixels import u8_video_to_pixel_values
    from mmpipe.images.spec import VisionSpec
    from mmpipe.images.video import VideoOptions, encode_video, frame_bounds

    seconds, fps, h, w = QUICK_CLIP if ctx.quick else CLIP
    data = make_clip(seconds, fps, h, w)
    proc = ctx.processor
    spec = VisionSpec.from_processor(proc)
    opts = VideoOptions()
    got = encode_video(data, spec, opts)
    n = len(got.frame_indices) + (-len(got.frame_indices) % spec.temporal_patch_size)
    vlut = spec.for_videos().lut()
    ours = u8_video_to_pixel_values(got.patches, vlut)
    u8_per_frame, f32_per_frame = got.patches.nbytes / n, ours.nbytes / n
    contenders = {"mmpipe": lambda: encode_video(data, spec, opts),
                  "mmpipe_collate": lambda: u8_video_to_pixel_values(encode_video(data, spec, opts).patches, vlut)}
    vp = _stock_video_processor(proc)
    same = None
    if vp is not None:
        lo, hi = frame_bounds(len(got.frame_indices), spec, opts)
        size = {"shortest_edge": int(lo), "longest_edge": int(hi)}

        def stock():
            frames = _decode_sampled(data, got.frame_indices)
            return vp(videos=[np.stack(frames)], do_sample_frames=False, cap_pixels_per_frame=False, size=size,
                      return_tensors="np")

        contenders["stock"] = stock
        ref = stock()
        same = bool(np.array_equal(ref["pixel_values_videos"], ours)
                    and [int(v) for v in ref["video_grid_thw"][0]] == list(got.grid))
    t = side_by_side(contenders, repeat=ctx.repeat, warmup=1)
    clip = f"{seconds:g} s {w}x{h} {fps} fps clip, {len(got.frame_indices)} frames sampled -> {got.size[1]}x{got.size[0]}"
    detail = {"clip": clip, "grid": list(got.grid), "bytes_per_frame": {"uint8": u8_per_frame, "float32": f32_per_frame},
              "timing": {k: v.to_json() for k, v in t.items()}}
    lines = []
    if vp is not None:
        base = "PyAV decode of the same sampled frames + transformers' Qwen2VLVideoProcessor (torchvision)"
        lines += [speed(f"video encode ({clip}), uint8 stored", t["mmpipe"], t["stock"], base, target=None,
                        identical=same, per=1, unit="clips", detail=detail),
                  speed("  same, plus collate's float32 expansion", t["mmpipe_collate"], t["stock"], base,
                        target=None, identical=same, per=1, unit="clips")]
    else:
        lines.append(Result(f"video encode ({clip}), uint8 stored", fig(t["mmpipe"], 1, "clips"), "-", None, "-",
                            "(info)", None, True, detail,
                            "the stock video processor needs torchvision: bash scripts/bench.sh --torchvision",
                            "baseline measured only in the torchvision run"))
    lines.append(Result("  bytes per video frame on disk vs float32", f"{u8_per_frame / 1024:,.0f} KiB",
                        f"{f32_per_frame / 1024:,.0f} KiB", u8_per_frame / f32_per_frame,
                        f"1/{f32_per_frame / u8_per_frame:.2f}", "(info)", None, True if same is None else same, {},
                        "pixel_values_videos as float32 (what a processor-output cache stores)"))
    return lines
