"""GLM-4.1V videos (`ModelFamily.video_rule` ``"glm4v"``): the sampling, sizing, text layout and
token types of transformers' ``Glm4vVideoProcessor`` / ``Glm4vProcessor`` (transformers 5.x).

- which frames (`glm_sample_indices`, the video processor's ``sample_frames``): a container of
  ``total`` frames at ``video_fps`` lasting ``duration = total / video_fps`` seconds gives
  ``ceil(i * video_fps / fps)`` for ``i < floor(duration * fps)`` (``fps`` default 2, the
  option ``fps``), or, past ``max_duration`` = 300 s, ``ceil(t * video_fps)`` over
  ``linspace(0, duration, 300 * fps)``; clipped to the last frame, duplicates dropped, the last
  repeated once when the count is odd. A frame list is used whole (its fps: ``frames_fps``).
- how large (`glm_video_size`, its ``smart_resize`` with the frame count): a side below
  ``patch * merge`` first scales up, then Qwen's rounding, with the bounds applied to all ``n``
  frames (``round(n / 2) * 2 * h * w``); bounds ``min_pixels`` / ``max_pixels`` of the video
  options, default the video processor's ``size`` (112*112, 28*28*2*30000). Resize: the
  torchvision rule, as for every family's videos (`mmpipe.images.video`).
- the text (`mmpipe.encoding.placeholders.expand_glm_video_pads`, ``replace_video_token``): the template's ``<|video|>``
  (inside ``<|begin_of_video|>``...``<|end_of_video|>``) becomes, per frame group,
  ``<|begin_of_image|>`` + ``h*w/merge^2`` x ``<|image|>`` + ``<|end_of_image|>`` + the group's
  first frame time in whole seconds (``str(int(index / video_fps))``).
- token types (`token_types`, ``create_mm_token_type_ids``): 2 at ``<|image|>`` inside a video
  span, 1 at other ``<|image|>``; positions are the ``"mrope_frames"`` rule (`mmpipe.rope`).

GLM-4.6V (video_rule ``"glm46v"``, ``Glm46VVideoProcessor`` / ``Glm46VProcessor``): the same sizing,
layout and token types; its frames `glm46v_sample_indices` (a rate set by the duration, ``fps`` is
ignored), its group times ``f"{t:.1f} seconds"`` (`glm46v_time_text`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import numpy as np

from mmpipe.errors import ArgumentError, ImageError, VideoError
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.images.video import MAX_FRAME_PIXELS, VideoOptions, check_frame_bounds, check_resized, refuse_clip

__all__ = ["GLM_FPS", "GLM_MAX_DURATION", "GLM_MIN_PIXELS", "GLM_MAX_PIXELS", "VIDEO_BEGIN", "VIDEO_END", "VIDEO_SPANS",
           "glm_sample_indices", "glm_video_size", "glm_plan", "glm_time_text", "token_types",
           "glm46v_sample_indices", "glm46v_plan", "glm46v_time_text", "check_video_processor"]

GLM_FPS, GLM_MAX_DURATION = 2.0, 300  # Glm4vVideoProcessor.fps / .max_duration
GLM_MIN_PIXELS, GLM_MAX_PIXELS = 112 * 112, 28 * 28 * 2 * 30000  # Glm4vVideoProcessor.size
VIDEO_BEGIN, VIDEO_END = "<|begin_of_video|>", "<|end_of_video|>"
# `ModelFamily.video_rule` -> the tokens around a video whose pads are image tokens
VIDEO_SPANS = {"glm4v": (VIDEO_BEGIN, VIDEO_END), "glm46v": (VIDEO_BEGIN, VIDEO_END)}
# `ModelFamily.video_rule` -> the video processor class whose sampling it follows: a processor holding
# another (GLM-GA checkpoints: Glm46VProcessor with GlmgaVideoProcessor, fps 2) is refused, `check_video_processor`
VIDEO_PROCESSORS = {"glm46v": "Glm46VVideoProcessor"}
# Glm46VVideoProcessor.sample_frames: sampling fps by duration (up to 30 s, 300 s, else), frame cap, duration cap
GLM46V_RATES, GLM46V_MAX_FRAMES, GLM46V_MAX_DURATION = ((30, 3), (300, 1), (None, 0.5)), 640, 2400


def glm_sample_indices(total: int, video_fps: float, fps: Optional[float] = None,
                       duration: Optional[float] = None) -> np.ndarray:
    """``Glm4vVideoProcessor.sample_frames``: int64 [n] source frame indices (n even)."""
    fps = GLM_FPS if fps is None else fps
    last = total - 1
    duration = duration or round(last / video_fps) + 1
    if duration <= GLM_MAX_DURATION:
        n = max(int(math.floor(duration * fps)), 1)
        idx = [min(last, int(math.ceil(i * video_fps / fps))) for i in range(n)]
    else:
        k = int(GLM_MAX_DURATION * fps)
        if k >= total:
            idx = list(range(total))
        else:
            idx = [min(last, int(math.ceil(t * video_fps))) for t in np.linspace(0, duration, k, endpoint=True)]
    uniq = list(dict.fromkeys(idx))
    if len(uniq) & 1:
        uniq.append(uniq[-1])
    return np.asarray(uniq, dtype=np.int64)


def glm_video_size(n: int, h: int, w: int, spec: VisionSpec, opts: VideoOptions, where: str) -> tuple[int, int]:
    """The video processor's ``smart_resize(num_frames=n, ...)`` target (height, width)."""
    if h * w > MAX_FRAME_PIXELS:
        raise VideoError(f"video frames of {h}x{w} pixels are too large to decode", where=where,
                         expected=f"at most {MAX_FRAME_PIXELS} pixels per frame", found=f"{h * w} pixels",
                         fix="downscale the video before encoding it")
    lo = GLM_MIN_PIXELS if opts.min_pixels is None else opts.min_pixels
    hi = GLM_MAX_PIXELS if opts.max_pixels is None else opts.max_pixels
    try:
        check_frame_bounds(lo, hi, processor=True)  # GLM's rule is always its video processor's
    except ArgumentError as e:
        raise VideoError(str(e), where=where, expected="min_pixels, max_pixels >= 1", found=f"{lo}, {hi}",
                         fix="pass min_pixels=1 for no lower bound, or leave the bounds out") from None
    f, T = spec.factor, spec.temporal_patch_size
    if h < f or w < f:
        scale = max(f / h, f / w)
        h, w = int(h * scale), int(w * scale)
    try:
        smart_resize(h, w, f, hi, hi, max_ratio=spec.max_aspect_ratio)  # the aspect check only
    except ImageError as e:
        raise VideoError(e.detail.replace("image", "video frame", 1), where=where, expected=e.expected,
                         found=e.found, fix=e.fix) from None
    h_bar, w_bar, t_bar = round(h / f) * f, round(w / f) * f, round(n / T) * T
    if t_bar * h_bar * w_bar > hi:
        beta = math.sqrt((n * h * w) / hi)
        h_bar, w_bar = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    elif t_bar * h_bar * w_bar < lo:
        beta = math.sqrt(lo / (n * h * w))
        h_bar, w_bar = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    return check_resized((h_bar, w_bar), where)


def glm_plan(total: int, fps: float, h: int, w: int, spec: VisionSpec, opts: VideoOptions, where: str,
             frame_list: bool, indices: Optional[np.ndarray] = None) -> tuple:
    """GLM-4.1V's plan (`mmpipe.images.video.qwen_plan`'s arguments and result): (indices int64
    [n], resized (height, width), sample fps, each frame group's first time in seconds). ``indices``:
    a video file's sampled frames (default `glm_sample_indices` at ``opts.fps``; GLM-4.6V's: `glm46v_plan`)."""
    if opts.nframes is not None:
        raise VideoError("GLM-4.1V's video processor samples by fps; it takes no nframes", where=where,
                         expected="the fps option (default 2)", found=f"nframes={opts.nframes}",
                         fix="give fps instead of nframes")
    refuse_clip(opts, where, "GLM's video processors sample the whole video")
    idx = np.arange(total, dtype=np.int64) if frame_list else \
        indices if indices is not None else glm_sample_indices(total, fps, opts.fps, total / fps)
    T = spec.temporal_patch_size
    times = tuple(int(i) / fps for i in idx[::T])
    return idx, glm_video_size(len(idx), h, w, spec, opts, where), len(idx) / total * fps, times


def glm46v_sample_indices(total: int, video_fps: float, duration: Optional[float] = None, T: int = 2) -> np.ndarray:
    """``Glm46VVideoProcessor.sample_frames``: int64 [n] source frame indices (n even). ``k = int(d *
    rate * T)`` frames (at most 640) for the duration ``d`` (at most 2400 s) at ``rate`` 3 / 1 / 0.5
    fps (up to 30 s / 300 s / beyond): the first frame at or past each ``1 / (T * rate)`` s step up
    to ``int(duration)`` s, then ``linspace(first, last, k)`` truncated where that gives fewer than
    ``k`` (``linspace(0, total - 1, k)`` where more, or where ``total < k``); duplicates dropped,
    the last repeated once when the count is odd."""
    last = total - 1
    duration = duration or round(last / video_fps) + 1
    d = min(duration, GLM46V_MAX_DURATION)
    rate = next(r for bound, r in GLM46V_RATES if bound is None or d <= bound)
    k = min(int(d * rate * T), GLM46V_MAX_FRAMES)
    if total < k:
        idx = np.linspace(0, last, k, dtype=int).tolist()
    else:
        idx, now, step, per_frame = [], 0, 1 / (T * rate), 1 / video_fps
        for i in range(total):
            if i * per_frame >= now:
                now += step
                idx.append(i)
                if now >= int(duration):
                    break
    if len(idx) < k:
        idx = np.linspace(idx[0] if idx else 0, idx[-1] if idx else max(last, 0), k, dtype=int).tolist()
    elif len(idx) > k:
        idx = np.linspace(0, last, k, dtype=int).tolist()
    uniq = list(dict.fromkeys(int(i) for i in idx))
    if len(uniq) & 1:
        uniq.append(uniq[-1])
    return np.asarray(uniq, dtype=np.int64)


def glm46v_plan(total: int, fps: float, h: int, w: int, spec: VisionSpec, opts: VideoOptions, where: str,
                frame_list: bool) -> tuple:
    """GLM-4.6V's plan (as `glm_plan`): the frames `glm46v_sample_indices` picks. Its video processor
    ignores ``fps`` and ``num_frames``: one given is refused, except under ``sampling="processor"`` (what
    the processor is passed, `processor_options`: ignored as the processor ignores it)."""
    given = {k: v for k, v in (("fps", opts.fps), ("nframes", opts.nframes)) if v is not None}
    if given and opts.sampling != "processor":
        k, v = next(iter(given.items()))
        raise VideoError(f"GLM-4.6V's video processor picks its own rate (3 fps up to 30 s, 1 fps up to 300 s, "
                         f"0.5 fps beyond) and ignores {k}", where=where, expected=f"no {k} option",
                         found=f"{k}={v}", fix=f"drop {k} (or sample the frames yourself: a frame list)")
    idx = None if frame_list else glm46v_sample_indices(total, fps, total / fps, spec.temporal_patch_size)
    if idx is not None and len(idx) == 0:  # under 1/6 s: the processor's smart_resize raises on 0 frames
        raise VideoError("GLM-4.6V's video processor samples no frame from a video this short", where=where,
                         expected="a video of at least 1/6 s", found=f"{total} frame(s) at {fps:g} fps",
                         fix="give its frames as a frame list, or drop the row")
    return glm_plan(total, fps, h, w, spec, replace(opts, fps=None, nframes=None), where, frame_list, idx)


def check_video_processor(processor, fam, where: str, column: Optional[str] = None) -> None:
    """A `VideoError` where ``processor.video_processor`` (when it has one) is not the class whose
    sampling ``fam.video_rule`` follows (`VIDEO_PROCESSORS`): its rows would not be that processor's."""
    want, vp = VIDEO_PROCESSORS.get(fam.video_rule), getattr(processor, "video_processor", None)
    if want is None or vp is None or want in {c.__name__ for c in type(vp).__mro__}:
        return
    raise VideoError(f"the processor's video processor is {type(vp).__name__}, which samples and sizes videos by "
                     f"another rule than {want} (the {fam.name} rule mmpipe encodes)", where=where,
                     column=column, expected=want, found=type(vp).__name__,
                     fix="drop the videos, or encode these rows with the processor's own call")


def glm46v_time_text(seconds: float) -> str:
    """The text after a frame group (``Glm46VProcessor.replace_frame_token_id``): ``"1.5 seconds"``."""
    return f"{seconds:.1f} seconds"


def glm_time_text(seconds: float) -> str:
    """The text after a frame group (``Glm4vProcessor.replace_frame_token_id``): whole seconds."""
    return str(int(seconds))


def token_types(enc, ids: np.ndarray) -> np.ndarray:
    """``mm_token_type_ids`` int64 [L] of ids int64 [L]: 1 at image pads, 2 at video pads, else 0.
    Under the ``"glm4v"`` video rule a video's pads are ``<|image|>`` tokens inside
    ``<|begin_of_video|>``...``<|end_of_video|>`` (``Glm4vProcessor.create_mm_token_type_ids``)."""
    mm = np.zeros(ids.shape, dtype=np.int64)
    if enc.image_token_id is not None:
        mm[ids == enc.image_token_id] = 1
    if enc.video_token_id is not None:
        mm[ids == enc.video_token_id] = 2
    span = VIDEO_SPANS.get(enc.family.video_rule)
    if span is not None and enc.image_token_id is not None:
        begin, end = enc.tokenizer.convert_tokens_to_ids(list(span))
        inside = np.cumsum(ids == begin) > np.cumsum(ids == end)
        mm[(ids == enc.image_token_id) & inside] = 2
    return mm
