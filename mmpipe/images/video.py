"""Videos in, sampled and resized uint8 frame patches out, decoded with bounded memory.

A video is a file path, encoded bytes, a ``datasets`` Video-style dict (``{"path", "bytes"}``)
or a list of frames (PIL images or uint8 [H, W, 3] arrays) with their ``fps``. Frames are sampled
and sized by qwen-vl-utils 0.0.14's ``fetch_video`` (the default; ``VideoOptions(sampling=
"processor")``: as the family's transformers video processor, `mmpipe.images.video_processor_plan`):

- how many: ``nframes`` rounded to `FRAME_FACTOR`, or ``total / video_fps * fps`` clamped to
  ``[min_frames, min(max_frames, total)]`` and floored to `FRAME_FACTOR` (`sample_count`);
- which: ``round(linspace(0, total - 1, n))`` (`sample_indices`), over the clip ``video_start`` ..
  ``video_end`` seconds if given (`frame_range`); a frame list whole, its last frame repeated to even;
- how large: `smart_resize` within ``min_pixels`` (default 128 tokens' worth) and ``max(min(768
  tokens' worth, total_pixels / n * FRAME_FACTOR), int(min_pixels * 1.05))``, lowered to ``max_pixels``;
- ``second_per_grid_ts = temporal_patch_size / sample_fps``, ``sample_fps = n / total * video_fps``.

Frames are resized by the torchvision rule (`backends.resize_u8_torch`) whatever the image backend:
transformers has only torchvision video processors, so that is what they and vLLM compute
(`VisionSpec.for_videos`). Stored as uint8 patches [grid_t * gh * gw, 3 * T * p * p] in the
processor's ``pixel_values_videos`` layout (`u8_video_to_pixel_values` with ``spec.for_videos().lut()``
expands them). Decoding (PyAV, imported lazily) walks the stream once and keeps only the sampled
frames, resized: memory is the output plus one decoded frame. Failures are `mmpipe.errors.VideoError`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence

import numpy as np
from PIL import Image

from mmpipe.errors import ArgumentError, ImageError, VideoError
from mmpipe.images.backends import resize_u8_torch
from mmpipe.images.load import decoded_rgb
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.images.video_container import Container, check_codec, decode_sampled
from mmpipe.images.video_frames import SampledFrames, patchify_video_u8  # noqa: F401 (public here too)
from mmpipe.images.video_sampling import (FRAME_FACTOR, frame_range, group_times, sample_count,  # noqa: F401
                                          sample_indices)

__all__ = ["FRAME_FACTOR", "SAMPLINGS", "VideoOptions", "VideoPatches", "sample_count", "sample_indices", "frame_range",
           "file_indices", "refuse_clip", "check_resized", "check_frame_bounds", "sized", "frame_bounds",
           "group_times", "qwen_plan", "encode_video", "video_layout", "patchify_video_u8", "sampled_frames"]

VIDEO_MIN_TOKENS, VIDEO_MAX_TOKENS = 128, 768  # per-frame pixel bounds, in merged tokens
MODEL_SEQ_LEN = 128000  # qwen-vl-utils' default total budget: 90% of this many tokens' pixels
MAX_FRAME_PIXELS = 2 * 89_478_485  # PIL's decompression-bomb limit, as for images
MAX_RESIZED_PIXELS = 2 * 89_478_485  # the same bound on a resized frame (a row's min_pixels can ask for more)
SAMPLINGS = ("qwen-vl-utils", "processor")  # VideoOptions.sampling: qwen-vl-utils' fetch_video, the video processor's
_PROCESSOR_ONLY = ("do_sample_frames", "cap_pixels_per_frame", "max_video_tokens")


@dataclass(frozen=True)
class VideoOptions:
    """Sampling and sizing options (qwen-vl-utils' names and defaults). Give ``fps`` (frames
    sampled per second) or ``nframes`` (a fixed count), not both. Pixel options in pixels per
    frame; None: qwen-vl-utils' default for the spec's factor. ``sampling="processor"``: as the
    family's transformers video processor samples and sizes (`mmpipe.images.video_processor_plan`;
    ``min_pixels`` / ``max_pixels`` are then its ``size``; None values: the processor's)."""

    fps: Optional[float] = None  # None: 2.0 (qwen-vl-utils' FPS) unless nframes is given
    nframes: Optional[int] = None
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: Optional[int] = None
    max_pixels: Optional[int] = None
    total_pixels: Optional[float] = None
    frames_fps: float = 2.0  # the fps of a frame list (qwen-vl-utils' ``sample_fps``)
    video_start: Optional[float] = None  # seconds: the clip of a video file to sample (`frame_range`)
    video_end: Optional[float] = None
    sampling: str = "qwen-vl-utils"  # or "processor"; the rest only with "processor" (None: the processor's)
    do_sample_frames: Optional[bool] = None
    cap_pixels_per_frame: Optional[bool] = None
    max_video_tokens: Optional[int] = None

    def __post_init__(self):
        if self.nframes is not None and self.fps is not None:
            raise ArgumentError(f"give fps or nframes, not both (fps={self.fps!r}, nframes={self.nframes!r})")
        if self.sampling not in SAMPLINGS:
            raise ArgumentError(f"VideoOptions.sampling must be one of {SAMPLINGS}, got {self.sampling!r:.40}")
        other = [k for k in (("total_pixels",) if self.sampling == "processor" else _PROCESSOR_ONLY)
                 if getattr(self, k) is not None]
        if other:
            raise ArgumentError(f"VideoOptions {other} do not apply with sampling={self.sampling!r}")
        # a row's JSON may carry "4" or true: refused here, not a bare TypeError deep in sampling;
        # inf is refused too (a frame list at fps=inf had second_per_grid_ts 0 and every time 0.0)
        for f in fields(self):
            v = getattr(self, f.name)
            flag = f.name in _PROCESSOR_ONLY[:2]  # True, False or None
            if v is not None and f.name != "sampling" and (not isinstance(v, bool) if flag else (
                    isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v))):
                raise ArgumentError(f"VideoOptions.{f.name} must be {'a bool' if flag else 'a finite number'}, "
                                    f"got {v!r:.40}")
        for name in ("fps", "nframes", "frames_fps", "max_video_tokens"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ArgumentError(f"VideoOptions.{name} must be > 0, got {v!r}")
        check_frame_bounds(self.min_pixels, self.max_pixels, self.sampling == "processor", "VideoOptions.")


def check_frame_bounds(lo, hi, processor: bool, prefix: str = "") -> None:
    """`ArgumentError` for per-frame pixel bounds the sizing rule refuses: a ``max_pixels`` below 1
    (qwen-vl-utils divides by it; the video processors refuse a ``size`` of 0), a negative
    ``min_pixels``, and with the video ``processor``'s rule (``sampling="processor"``, GLM's) a
    ``min_pixels`` of 0 too: transformers 5 refuses it ('size dict must contain shortest_edge and
    longest_edge'), where qwen-vl-utils takes it as no lower bound."""
    for name, v, low in (("min_pixels", lo, 1 if processor else 0), ("max_pixels", hi, 1)):
        if v is not None and v < low:
            rule = "the video processor's size" if processor else "qwen-vl-utils' sizing"
            fix = f"{name}=1 for no lower bound" if name == "min_pixels" else f"{name}=768 * 28 * 28, say"
            raise ArgumentError(f"{prefix}{name}={v!r} is not a bound {rule} takes: expected >= {low}, found {v!r}; "
                                f"pass {fix}, or leave it out for the default")


@dataclass(frozen=True)
class VideoPatches:
    """One encoded video. ``patches``: uint8 [grid_t * gh * gw, 3 * T * p * p] (None from
    `video_layout`); ``grid``: (grid_t, gh, gw) in patches; ``frame_indices``: the sampled
    source frames, int64 [n] (padding repeats the last); ``second_per_grid_ts``: seconds per
    temporal patch; ``sample_fps``; ``size``: resized (height, width)."""

    patches: Optional[np.ndarray]
    grid: tuple[int, int, int]
    frame_indices: np.ndarray
    second_per_grid_ts: float
    sample_fps: float
    size: tuple[int, int]
    timestamps: tuple = ()  # seconds per frame group (Qwen3-VL's "<t seconds>" text), `group_times`


# ---- sizing (pure functions of the metadata; sampling: `mmpipe.images.video_sampling`) ---------
def frame_bounds(n_frames: int, spec: VisionSpec, opts: VideoOptions) -> tuple[int, int]:
    """(min_pixels, max_pixels) per frame for a video of ``n_frames`` sampled frames."""
    f2 = spec.factor**2
    min_px = opts.min_pixels if opts.min_pixels is not None else VIDEO_MIN_TOKENS * f2
    total = opts.total_pixels if opts.total_pixels is not None else MODEL_SEQ_LEN * f2 * 0.9
    max_px = max(min(VIDEO_MAX_TOKENS * f2, total / n_frames * FRAME_FACTOR), int(min_px * 1.05))
    if opts.max_pixels is not None:
        max_px = min(opts.max_pixels, max_px)
    return int(min_px), max_px


def _target_size(h: int, w: int, n_frames: int, spec: VisionSpec, opts: VideoOptions, where: str) -> tuple[int, int]:
    return sized(h, w, spec, *frame_bounds(n_frames, spec, opts), where)


def sized(h: int, w: int, spec: VisionSpec, min_px: int, max_px: int, where: str) -> tuple[int, int]:
    """`smart_resize` of one ``h`` x ``w`` frame within ``min_px`` .. ``max_px``, as a `VideoError`."""
    if h * w > MAX_FRAME_PIXELS:
        raise VideoError(f"video frames of {h}x{w} pixels are too large to decode", where=where,
                         expected=f"at most {MAX_FRAME_PIXELS} pixels per frame", found=f"{h * w} pixels",
                         fix="downscale the video before encoding it")
    try:
        size = smart_resize(h, w, spec.factor, min_px, max_px, max_ratio=spec.max_aspect_ratio, family=spec.family)
    except ImageError as e:
        raise VideoError(e.detail.replace("image", "video frame", 1), where=where, expected=e.expected,
                         found=e.found, fix=e.fix) from None
    return check_resized(size, where)


def check_resized(size: tuple[int, int], where: str) -> tuple[int, int]:
    """``size`` (height, width), or a `VideoError` where a row's ``min_pixels`` asks for frames
    larger than `MAX_RESIZED_PIXELS` (before: a torch allocation of terabytes, or the machine's
    memory)."""
    th, tw = size
    if th * tw > MAX_RESIZED_PIXELS:
        raise VideoError(f"the frames would be resized to {th}x{tw} pixels", where=where,
                         expected=f"at most {MAX_RESIZED_PIXELS} pixels per resized frame",
                         found=f"{th * tw} pixels",
                         fix="lower min_pixels (pixels per frame, e.g. 128 * 28 * 28)")
    return th, tw


def _resize(frame: np.ndarray, th: int, tw: int, spec: VisionSpec) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [th, tw, 3] as the video processors resize: torchvision's rule
    for every ``spec.backend`` (the backend is for images only)."""
    return resize_u8_torch(frame, th, tw)


def _finish(frames: SampledFrames, indices: np.ndarray, sample_fps: float, spec: VisionSpec,
            times: tuple) -> VideoPatches:
    stack, indices = frames.padded(indices)
    T = spec.temporal_patch_size
    grid = (stack.shape[0] // T, stack.shape[1] // spec.patch_size, stack.shape[2] // spec.patch_size)
    return VideoPatches(patchify_video_u8(stack, spec), grid, indices, T / sample_fps, sample_fps,
                        stack.shape[1:3], times)


# ---- frame lists -----------------------------------------------------------------------
def _frame_rgb(value: Any, where: str) -> np.ndarray:
    """One listed frame (PIL image, path, encoded bytes, uint8 array) -> uint8 [H, W, 3] RGB as the
    video processors convert it: transparency composited onto white (transformers'
    ``video_utils.convert_to_rgb`` and qwen-vl-utils' ``to_rgb`` both blend with white, whatever
    the image rule), 16-bit data refused rather than clipped (`check_range`), a truncated or corrupt
    file an `ImageError` here rather than PIL's ``OSError``. No EXIF turn: the video processors
    take PIL frames as they are."""
    return np.asarray(decoded_rgb(value, where=where, orient=False, transparency="white"))


def _one_frame(f: Any, where: str, i: int) -> np.ndarray:
    """Listed frame ``i`` as uint8 [H, W, 3] RGB (a uint8 RGB array as it is)."""
    if isinstance(f, np.ndarray) and f.ndim == 3 and f.shape[2] == 3 and f.dtype == np.uint8:
        return f
    return _frame_rgb(f, f"{where}, frame {i}")


def _list_frames(frames: Sequence, where: str) -> list[np.ndarray]:
    out = [_one_frame(f, where, i) for i, f in enumerate(frames)]
    if not out:
        raise VideoError("the video has no frames", where=where, expected="at least one frame",
                         found="an empty frame list", fix="drop the row or give the video's frames")
    if len({a.shape for a in out}) > 1:
        raise VideoError("the video's frames differ in size", where=where, expected="frames of one size",
                         found=sorted({a.shape[:2] for a in out})[:3], fix="resize the frames to one size")
    return out


def _check_listed_sizes(frames: Sequence, hw: tuple, where: str) -> None:
    """`VideoError` where an in-memory frame (uint8 array, PIL image) differs in size from the first
    (height, width) ``hw``, as `_list_frames` refuses it, without decoding (`video_layout`: before,
    a mixed-size list got the first frame's grid under ``pixels="none"``). Paths and bytes are
    left to the decode."""
    for f in frames:
        if isinstance(f, np.ndarray) and f.ndim >= 2:
            found = tuple(f.shape[:2])
        elif isinstance(f, Image.Image):
            found = (f.height, f.width)
        else:
            continue
        if found != tuple(hw):
            raise VideoError("the video's frames differ in size", where=where, expected="frames of one size",
                             found=sorted({tuple(hw), found}), fix="resize the frames to one size")


def _encode_frames(frames: Sequence, spec: VisionSpec, opts: VideoOptions, where: str, plan) -> VideoPatches:
    """A frame list (its fps ``opts.frames_fps``): the frames ``plan`` picks (qwen-vl-utils: every
    frame, the last repeated to a multiple of FRAME_FACTOR). Each frame is decoded, checked and
    resized before the next is decoded: one full-size frame in memory at a time (decoding the
    whole list first held every frame at full size: 32 frames of 1080p, +200 MB)."""
    first = _list_frames(frames[:1], where)[0]
    hw = first.shape
    idx, (th, tw), sample_fps, times = plan(len(frames), float(opts.frames_fps), *hw[:2], spec, opts, where, True)
    idx = np.asarray(idx)
    out = SampledFrames(idx, th, tw, spec.temporal_patch_size)
    for i in range(len(frames)):  # every frame decoded and checked, as the plan may skip some
        arr = first if i == 0 else _one_frame(frames[i], where, i)
        first = None
        if arr.shape != hw:
            raise VideoError("the video's frames differ in size", where=where, expected="frames of one size",
                             found=sorted({hw[:2], arr.shape[:2]}), fix="resize the frames to one size")
        if i in out.slots:
            out.put(i, _resize(arr, th, tw, spec))
    return _finish(out, idx, sample_fps, spec, times)


def qwen_plan(total: int, fps: float, h: int, w: int, spec: VisionSpec, opts: VideoOptions, where: str,
              frame_list: bool) -> tuple:
    """qwen-vl-utils' plan for ``total`` frames at ``fps`` of ``h`` x ``w``: (indices int64 [n], resized
    (height, width), sample fps, group times); `mmpipe.encoding.glm_videos.glm_plan` is another;
    ``sampling="processor"`` options go with ``plan=`` `mmpipe.images.video_processor_plan.processor_plan`."""
    if opts.sampling != "qwen-vl-utils":  # never ignored: the encoder picks that plan itself
        raise ArgumentError(f"{where}: VideoOptions(sampling={opts.sampling!r}) goes with "
                            "plan=mmpipe.images.video_processor_plan.processor_plan")
    if frame_list:
        refuse_clip(opts, where)
        n = math.ceil(total / FRAME_FACTOR) * FRAME_FACTOR
        idx, sample_fps, times = np.minimum(np.arange(n), total - 1), fps, group_times(range(n), fps, spec.temporal_patch_size)
    else:
        idx, count = file_indices(total, fps, opts, where)
        n = len(idx)
        sample_fps, times = n / count * fps, group_times(idx, fps, spec.temporal_patch_size)
    return idx, _target_size(h, w, n, spec, opts, where), sample_fps, times


def file_indices(total: int, fps: float, opts: VideoOptions, where: str) -> tuple[np.ndarray, int]:
    """A video file's sampled source frames (int64 [n]) and the frame count they are drawn from
    (the clip's, `frame_range`; the sample fps is ``n / count * fps``), qwen-vl-utils' readers."""
    first, last = frame_range(total, fps, opts, where=where)
    count = last - first + 1
    return sample_indices(count, sample_count(count, fps, opts, where=where), first), count


def refuse_clip(opts: VideoOptions, where: str, why: str = "a frame list is used whole") -> None:
    """A `VideoError` where ``video_start`` / ``video_end`` cannot apply (rather than ignoring them)."""
    if opts.video_start is not None or opts.video_end is not None:
        raise VideoError(f"video_start / video_end clip a video file; {why}", where=where,
                         expected="no video_start / video_end", found=f"video_start={opts.video_start}, "
                         f"video_end={opts.video_end}", fix="drop them, or cut the clip yourself (slice the frames)")


def _encode_container(value: Any, spec: VisionSpec, opts: VideoOptions, where: str, plan) -> VideoPatches:
    c = Container(value, where)
    try:
        check_codec(c)
        total = c.total_frames()
        h, w = c.upright_size()  # after total_frames: it may read the packets and rewind
        idx, (th, tw), sample_fps, times = plan(total, c.fps, h, w, spec, opts, where, False)
        idx = np.asarray(idx)
        out = SampledFrames(idx, th, tw, spec.temporal_patch_size)
        sources = iter(sorted(out.slots))  # decode_sampled converts each sampled source frame once, in order
        decode_sampled(c, idx, total, lambda frame: out.put(next(sources), _resize(frame, th, tw, spec)))
    finally:
        c.close()
    return _finish(out, idx, sample_fps, spec, times)


def sampled_frames(value: Any, opts: Optional[VideoOptions] = None, *, where: str = "video") -> np.ndarray:
    """One video file -> uint8 [n, H, W, 3] RGB frames at the file's own size, sampled by qwen-vl-utils'
    rule (``opts.fps`` / ``min_frames`` / ``max_frames``): for processors that size frames themselves."""
    opts = opts or VideoOptions()
    c = Container(value, where)
    try:
        check_codec(c)
        refuse_clip(opts, where, "the frames here go with the video's whole sound track")
        if opts.sampling != "qwen-vl-utils":  # the processor samples these itself on this path
            raise ArgumentError("sampling='processor' is for the Qwen-VL video rows; here the frames are sampled by "
                                "qwen-vl-utils' rule and the processor is told the fps: drop sampling")
        total = c.total_frames()
        idx, _ = file_indices(total, c.fps, opts, where)
        return np.stack(decode_sampled(c, idx, total, lambda frame: frame))
    finally:
        c.close()


# ---- public entry points ---------------------------------------------------------------
def encode_video(value: Any, spec: VisionSpec, opts: Optional[VideoOptions] = None, *,
                 where: str = "video", plan=None) -> VideoPatches:
    """One video -> `VideoPatches` (uint8 patches [grid_t*gh*gw, 3*T*p*p], grid, indices,
    ``second_per_grid_ts``). ``value``: a path, bytes, a ``{"path", "bytes"}`` dict, or a list
    of frames (PIL / uint8 [H, W, 3]) whose rate is ``opts.frames_fps``. ``plan``: the sampling
    and sizing rule (default `qwen_plan`)."""
    opts, plan = opts or VideoOptions(), plan or qwen_plan
    if isinstance(value, (list, tuple)):
        return _encode_frames(value, spec, opts, where, plan)
    return _encode_container(value, spec, opts, where, plan)


def video_layout(value: Any, spec: VisionSpec, opts: Optional[VideoOptions] = None, *,
                 where: str = "video", plan=None) -> VideoPatches:
    """The grid, sampled indices and ``second_per_grid_ts`` of `encode_video` from the
    container's metadata (``patches`` is None): its frame count, rate and size; only the first
    frame is decoded, for its display rotation (`Container.rotation`: a portrait phone video's
    grid is upright). For a frame list, from the first frame's size."""
    opts, plan, T = opts or VideoOptions(), plan or qwen_plan, spec.temporal_patch_size
    if isinstance(value, (list, tuple)):
        if not value:
            raise VideoError("the video has no frames", where=where, expected="at least one frame",
                             found="an empty frame list", fix="drop the row or give the video's frames")
        first = _list_frames(value[:1], where)[0]
        _check_listed_sizes(value, first.shape[:2], where)
        idx, (th, tw), sample_fps, times = plan(len(value), float(opts.frames_fps), *first.shape[:2], spec, opts,
                                                where, True)
    else:
        c = Container(value, where)
        try:
            check_codec(c)
            total = c.total_frames()
            h, w = c.upright_size()  # decodes the first frame only: its display rotation
            idx, (th, tw), sample_fps, times = plan(total, c.fps, h, w, spec, opts, where, False)
            c.refuse_if_cut(idx, total)  # a cut MP4 / MOV (its moov whole): decoded as encode_video decodes it
        finally:
            c.close()
    idx, n = np.asarray(idx), len(idx)
    n_pad = n + (-n % T)
    idx = np.concatenate([idx, np.repeat(idx[-1:], n_pad - n)]).astype(np.int64)
    grid = (n_pad // T, th // spec.patch_size, tw // spec.patch_size)
    return VideoPatches(None, grid, idx, T / sample_fps, sample_fps, (th, tw), times)
