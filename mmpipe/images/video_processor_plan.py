"""Videos sampled and sized as the family's transformers video processor does: ``VideoOptions(
sampling="processor")``, what ``processor.apply_chat_template(..., tokenize=True)`` gives for a video
file (transformers 5.25), beside the default rule, qwen-vl-utils' ``fetch_video`` (`mmpipe.images.video`).

Two rules, by the family's video processor class (`RULES`):

- ``"per_frame"`` (``Qwen2VLVideoProcessor``: Qwen2-VL, Qwen2.5-VL). Without ``do_sample_frames``
  (the class default; the chat path turns it on when given ``fps`` / ``num_frames``) EVERY frame;
  else ``num_frames`` rounded to the temporal patch, or ``total / video_fps * fps`` clamped to
  ``[min_frames, floor(min(max_frames, total))]`` and floored to it, the frames
  ``torch.arange(0, total, total / n).int()`` (truncated, not qwen-vl-utils' rounded linspace).
  Each frame sized alone within ``size`` (``min_pixels`` .. ``max_pixels``; class default 128 .. 768
  tokens' worth; with ``cap_pixels_per_frame`` also ``max_video_tokens * 0.9 * T / n`` tokens' worth).
- ``"whole_clip"`` (``Qwen3VLVideoProcessor``: Qwen3-VL, Qwen3.5). Sampling on by default at fps 2:
  ``n = int(total / video_fps * fps)`` clamped to ``[min_frames, min(max_frames, total)]`` (not
  rounded to even: an odd count's last frame is repeated), frames ``round(linspace(0, total - 1,
  n))`` (numpy). ``size`` bounds the WHOLE clip (``n * h * w``; class default 128 .. 768 tokens'
  worth for all frames together): transformers' video ``smart_resize`` with the frame count.

Values left None are the video processor's: `processor_options` reads them from a processor
(``processor.video_processor``), else the class defaults of transformers 5.25 (`CLASS_DEFAULTS`).
GLM-4.1V and GLM-4.6V always sample by their processors' rules (`mmpipe.encoding.glm_videos`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import numpy as np

from mmpipe.encoding.glm_videos import glm_video_size  # the same video smart_resize (frame count, T)
from mmpipe.errors import ArgumentError, VideoError
from mmpipe.families import FAMILIES
from mmpipe.images.video import VideoOptions, group_times, refuse_clip, sized

__all__ = ["RULES", "CLASS_DEFAULTS", "processor_options", "with_processor", "processor_indices", "processor_size",
           "processor_plan", "takes_every_frame"]

# `ModelFamily.video_frames_are_blocks` -> the rule: Qwen3VLVideoProcessor (frame groups as blocks with
# their times) or Qwen2VLVideoProcessor (Qwen2-VL, Qwen2.5-VL)
RULES = {False: "per_frame", True: "whole_clip"}
# the video processor classes' own defaults (transformers 5.25); sizes in merged tokens' worth of pixels
CLASS_DEFAULTS = {"per_frame": dict(do_sample_frames=False, fps=None, max_video_tokens=128000, tokens=(128, 768)),
                  "whole_clip": dict(do_sample_frames=True, fps=2.0, max_video_tokens=768, tokens=(128, 768))}
_READ = ("fps", "num_frames", "min_frames", "max_frames", "do_sample_frames", "cap_pixels_per_frame",
         "max_video_tokens")


def processor_options(processor: Any, **overrides) -> Any:
    """`VideoOptions` (``sampling="processor"``) holding ``processor``'s video processor settings
    (``processor.video_processor`` or a video processor itself): ``fps``, ``num_frames`` (as
    ``nframes``), ``min_frames``, ``max_frames``, ``do_sample_frames``, ``cap_pixels_per_frame``,
    ``max_video_tokens`` and ``size`` (as ``min_pixels`` / ``max_pixels``). ``overrides``: what you
    would pass to ``apply_chat_template`` (``fps=`` / ``num_frames=`` / ``nframes=`` turn sampling on,
    as the chat path does, unless ``do_sample_frames`` is given), or any other `VideoOptions` field.
    ``cap_pixels_per_frame`` with a video processor that has no such setting (transformers 4.57's, GLM's)
    raises `ArgumentError`: its chat path ignores it."""
    vp = getattr(processor, "video_processor", None)
    if vp is None and hasattr(processor, "sample_frames"):
        vp = processor
    got = {k: getattr(vp, k, None) for k in _READ}  # all None without a video processor: the class defaults
    if "num_frames" not in _parameters(getattr(vp, "sample_frames", None)):  # GLM-4.1V's samples by fps only
        got["num_frames"] = None
    size = getattr(vp, "size", None) or {}
    size = size if isinstance(size, dict) else vars(size)
    over = dict(overrides)
    if "num_frames" in over:
        over["nframes"] = over.pop("num_frames")
    if over.get("fps") is not None or over.get("nframes") is not None:  # the chat path: sample by them
        got.update(fps=None, num_frames=None, do_sample_frames=True)
    opts = dict(sampling="processor", fps=got["fps"], nframes=got["num_frames"],
                do_sample_frames=got["do_sample_frames"], cap_pixels_per_frame=got["cap_pixels_per_frame"],
                max_video_tokens=got["max_video_tokens"], min_pixels=size.get("shortest_edge"),
                max_pixels=size.get("longest_edge"))
    if opts["nframes"] is not None:  # num_frames wins over the class's fps (Qwen3-VL's fps=2 beside it raises)
        opts["fps"] = None
    opts.update({k: got[k] for k in ("min_frames", "max_frames") if got[k] is not None}, **over)
    if opts["do_sample_frames"] is False:  # every frame: a video item's own fps / nframes turns sampling on
        opts.update(fps=None, nframes=None)
    if opts["cap_pixels_per_frame"] and vp is not None and not hasattr(vp, "cap_pixels_per_frame"):
        import transformers

        raise ArgumentError(
            f"processor_options: cap_pixels_per_frame=True, but this processor's {type(vp).__name__} (transformers "
            f"{transformers.__version__}) has no per-frame pixel cap: its chat path ignores cap_pixels_per_frame and "
            "max_video_tokens, so capped rows would not equal its outputs. Fix: leave cap_pixels_per_frame unset, "
            "or use a transformers whose video processor has it (Qwen2-VL / Qwen3-VL's, 5.x)")
    try:
        return VideoOptions(**{k: (float(v) if k == "fps" and v is not None else v) for k, v in opts.items()})
    except TypeError as e:
        raise ArgumentError(f"processor_options: {e}") from None


def _parameters(fn) -> tuple:
    try:
        return tuple(inspect.signature(fn).parameters) if fn is not None else ("num_frames",)
    except (TypeError, ValueError):
        return ("num_frames",)


def with_processor(opts, processor) -> Any:
    """``opts`` (``sampling="processor"``) with the values it leaves at their defaults read from
    ``processor``'s video processor (`processor_options`); the encoder's ``video_options``."""
    default = VideoOptions(sampling="processor")
    given = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)
             if f.name != "sampling" and getattr(opts, f.name) != getattr(default, f.name)}
    return processor_options(processor, **given)


def _settings(opts, spec) -> tuple[str, dict]:
    fam = FAMILIES.get(spec.family)
    rule = None if fam is None or fam.video_rule != "qwen" or not fam.is_vision else \
        RULES[fam.video_frames_are_blocks]
    if rule is None:
        raise ArgumentError(f"sampling='processor' follows the Qwen2-VL / Qwen2.5-VL / Qwen3-VL video processors; "
                            f"{spec.family or 'this family'} has its own rule (GLM-4.1V, GLM-4.6V: always its processor's)")
    d, f2 = CLASS_DEFAULTS[rule], spec.factor**2
    do_sample = d["do_sample_frames"] if opts.do_sample_frames is None else opts.do_sample_frames
    do_sample = do_sample or opts.fps is not None or opts.nframes is not None  # given: sampled by them
    fps = opts.fps if opts.fps is not None or opts.nframes is not None else d["fps"]
    return rule, dict(sample=do_sample, fps=fps, n=opts.nframes, lo=opts.min_pixels or d["tokens"][0] * f2,
                      hi=opts.max_pixels or d["tokens"][1] * f2, cap=bool(opts.cap_pixels_per_frame),
                      tokens=opts.max_video_tokens or d["max_video_tokens"])


def takes_every_frame(opts, spec) -> bool:
    """Whether the family's video processor keeps every frame of a video under ``opts``
    (``sampling="processor"``): no ``do_sample_frames``, or Qwen2-VL's per-frame rule with neither
    ``fps`` nor ``nframes``. Then no option bounds a row's frames: the video's length does."""
    rule, s = _settings(opts, spec)
    return not s["sample"] or (rule == "per_frame" and s["n"] is None and s["fps"] is None)


def processor_indices(total: int, video_fps: float, opts, spec, *, where: str = "video") -> np.ndarray:
    """int64 [n]: the source frames the family's video processor's ``sample_frames`` picks (every
    frame without ``do_sample_frames``)."""
    rule, s = _settings(opts, spec)
    T = spec.temporal_patch_size
    if total < 1 or takes_every_frame(opts, spec):
        return np.arange(total, dtype=np.int64)
    if rule == "whole_clip":
        n = s["n"]
        if n is None:
            n = int(total / video_fps * s["fps"]) if s["fps"] is not None else total
            n = min(max(n, opts.min_frames), opts.max_frames, total) if s["fps"] is not None else \
                min(max(n, opts.min_frames), opts.max_frames)
        return np.linspace(0, total - 1, n).round().astype(np.int64)
    if s["n"] is not None:
        n = round(s["n"] / T) * T
    else:
        hi = math.floor(min(opts.max_frames, total) / T) * T
        n = math.floor(min(max(total / video_fps * s["fps"], opts.min_frames), hi, total) / T) * T
    if not 0 < n <= total:
        raise VideoError(f"the video processor cannot sample {n} frames from a video of {total} frames", where=where,
                         expected=f"between 1 and the video's {total} frames", found=f"{n} frames",
                         fix="use a longer video, lower nframes / min_frames, or do_sample_frames=False (every frame)")
    import torch

    return torch.arange(0, total, total / n).int().numpy().astype(np.int64)


def processor_size(n: int, h: int, w: int, spec, opts, *, where: str = "video") -> tuple[int, int]:
    """(height, width) the family's video processor resizes ``n`` sampled frames of ``h`` x ``w`` to."""
    rule, s = _settings(opts, spec)
    T, f2, lo, hi = spec.temporal_patch_size, spec.factor**2, s["lo"], s["hi"]
    if rule == "per_frame":
        if s["cap"]:
            hi = max(min(hi, int(s["tokens"] * f2 * 0.9) * T // n), int(lo * 1.05))
        return sized(h, w, spec, lo, hi, where)
    if n < T:
        raise VideoError(f"Qwen3-VL's video processor needs at least {T} frames (transformers raises "
                         f"'t:{n} must be larger than temporal_factor:{T}')", where=where,
                         expected=f"at least {T} sampled frames", found=f"{n} frame(s)",
                         fix="give a longer video, or sampling='qwen-vl-utils' (a still image: an image item)")
    if s["cap"]:
        hi = max(min(s["tokens"] * f2, hi // n), int(lo * 1.05)) * n
    return glm_video_size(n, h, w, spec, dataclasses.replace(opts, min_pixels=lo, max_pixels=hi), where)


def processor_plan(total: int, fps: float, h: int, w: int, spec, opts, where: str, frame_list: bool) -> tuple:
    """`mmpipe.images.video.qwen_plan`'s result under ``sampling="processor"``: (indices int64 [n],
    resized (height, width), sample fps ``n / total * fps`` (``VideoMetadata.sampled_fps``), group
    times). A frame list is used whole (the chat path refuses to sample a list), its count as it is."""
    refuse_clip(opts, where, "the video processor samples the whole video")
    idx = np.arange(total, dtype=np.int64) if frame_list else processor_indices(total, fps, opts, spec, where=where)
    if len(idx) == 0:
        raise VideoError("the video has no frames", where=where, expected="at least one frame", found="0 frames",
                         fix="drop the row")
    size = processor_size(len(idx), h, w, spec, opts, where=where)
    return idx, size, len(idx) / total * fps, group_times(idx, fps, spec.temporal_patch_size)
