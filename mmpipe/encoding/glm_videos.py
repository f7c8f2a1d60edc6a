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
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from mmpipe.errors import ImageError, VideoError
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.images.video import MAX_FRAME_PIXELS, VideoOptions, check_resized, refuse_clip

__all__ = ["GLM_FPS", "GLM_MAX_DURATION", "GLM_MIN_PIXELS", "GLM_MAX_PIXELS", "VIDEO_BEGIN", "VIDEO_END", "VIDEO_SPANS",
           "glm_sample_indices", "glm_video_size", "glm_plan", "glm_time_text", "token_types"]

GLM_FPS, GLM_MAX_DURATION = 2.0, 300  # Glm4vVideoProcessor.fps / .max_duration
GLM_MIN_PIXELS, GLM_MAX_PIXELS = 112 * 112, 28 * 28 * 2 * 30000  # Glm4vVideoProcessor.size
VIDEO_BEGIN, VIDEO_END = "<|begin_of_video|>", "<|end_of_video|>"
# `ModelFamily.video_rule` -> the tokens around a video whose pads are image tokens
VIDEO_SPANS = {"glm4v": (VIDEO_BEGIN, VIDEO_END)}


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
             frame_list: bool) -> tuple:
    """GLM-4.1V's plan (`mmpipe.images.video.qwen_plan`'s arguments and result): (indices int64
    [n], resized (height, width), sample fps, each frame group's first time in seconds)."""
    if opts.nframes is not None:
        raise VideoError("GLM-4.1V's video processor samples by fps; it takes no nframes", where=where,
                         expected="the fps option (default 2)", found=f"nframes={opts.nframes}",
                         fix="give fps instead of nframes")
    refuse_clip(opts, where, "GLM-4.1V's video processor samples the whole video")
    idx = np.arange(total, dtype=np.int64) if frame_list else glm_sample_indices(total, fps, opts.fps, total / fps)
    T = spec.temporal_patch_size
    times = tuple(int(i) / fps for i in idx[::T])
    return idx, glm_video_size(len(idx), h, w, spec, opts, where), len(idx) / total * fps, times


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
