"""Encode, the video side: a row's videos -> grids, ``second_per_grid_ts``, uint8 frame patches,
and their pads expanded in the ids, as the Qwen processors lay them out.

A video value (a ``videos`` column entry, or the value of an inline video item) is one of:

- a file path (or ``file://``), encoded bytes, or a ``datasets.Video(decode=False)`` dict
  ``{"path", "bytes"}`` (a decoded ``datasets`` video decoder is read from the file it came from);
- a list of frames (PIL images or uint8 [H, W, 3] arrays; a uint8 [n, H, W, 3] numpy array or
  torch tensor) whose rate is the ``frames_fps`` option (default 2.0), or ``{"frames": [...], "fps": float}``;
- ``{"video": <one of the above>, **options}``: per-video options with qwen-vl-utils' names
  (what an inline item's extra keys give, `mmpipe.encoding.media`).

Frames are sampled and sized by the published Qwen rules (`mmpipe.images.video`: qwen-vl-utils
``fetch_video``, the pipeline the Qwen model cards use), decoded with PyAV with bounded memory.
The ids equal the processor's for the same frames: Qwen2-VL / Qwen2.5-VL expand the template's
one ``<|video_pad|>`` into ``t*h*w/merge^2`` pads; Qwen3-VL writes ``<{t:.1f} seconds>``
``<|vision_start|>`` ``h*w/merge^2`` pads ``<|vision_end|>`` per frame group (its processor's
``replace_video_token``; the times are `mmpipe.images.video.group_times`), inside the template's
own ``<|vision_start|>``/``<|vision_end|>`` pair or, where the processor collapses that pair
(transformers 4.57 and >= 5.25), without it (`keeps_video_wrapper`); then a video's first timestamp is
tokenized together with the text before it, as that processor tokenizes them (`_glue_first_times`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from mmpipe.encoding.media import VIDEO_ITEM_OPTIONS
from mmpipe.encoding.placeholders import expand_glm_video_pads, expand_video_pads
from mmpipe.encoding.tokenize import text_run_start
from mmpipe.errors import ArgumentError, ImageError, PlaceholderError, VideoError
from mmpipe.images.load import confine_image
from mmpipe.encoding.glm_videos import check_video_processor, glm46v_plan, glm46v_time_text, glm_plan, glm_time_text
from mmpipe.images.video import VideoOptions, encode_video, frame_bounds, qwen_plan, video_layout
from mmpipe.images.video_processor_plan import processor_plan, takes_every_frame
from mmpipe.records.arrow import most_per_row

__all__ = ["video_options", "resolve_video", "timestamp_text", "add_videos", "video_row_bytes", "keeps_video_wrapper",
           "check_processor_seconds"]


# qwen-vl-utils' per-video options a ``{"video": ..., **options}`` value (or an inline item,
# `mmpipe.encoding.media.VIDEO_ITEM_OPTIONS`) may carry that mmpipe refuses: its fixed frame size
UNSUPPORTED_ITEM_OPTIONS = ("resized_height", "resized_width")
# `video_row_bytes` where no option bounds a row's frames: one row per writer batch (1 TiB)
UNBOUNDED_ROW_BYTES = 2**40


def video_options(value: Any) -> VideoOptions:
    """The encoder's ``video_options`` (None, a dict of `VideoOptions` fields, or a
    `VideoOptions`) -> `VideoOptions`; unknown keys raise `ArgumentError`."""
    if value is None:
        return VideoOptions()
    if isinstance(value, VideoOptions):
        return value
    if not isinstance(value, dict):
        raise ArgumentError(f"video_options must be a dict or mmpipe.images.video.VideoOptions, got {value!r:.80}")
    known = {f.name for f in dataclasses.fields(VideoOptions)}
    bad = sorted(set(value) - known)
    if bad:
        raise ArgumentError(f"unknown video_options {bad}; accepted: {sorted(known)}")
    return VideoOptions(**value)


def resolve_video(value: Any, opts: VideoOptions, where: str) -> tuple[Any, VideoOptions]:
    """A video value (any form above) -> (what `encode_video` takes, the options for it)."""
    if isinstance(value, dict) and "video" in value:
        unsupported = sorted(k for k in UNSUPPORTED_ITEM_OPTIONS if value.get(k) is not None)
        if unsupported:  # qwen-vl-utils' fixed frame size: refused rather than silently ignored
            raise VideoError(f"per-video options {unsupported} are not supported", where=where,
                             expected="qwen-vl-utils' options mmpipe applies: "
                                      f"{sorted(set(VIDEO_ITEM_OPTIONS) - set(UNSUPPORTED_ITEM_OPTIONS))}",
                             found=str({k: value[k] for k in unsupported}),
                             fix="bound the frame size with min_pixels / max_pixels instead")
        extra = {k: value[k] for k in VIDEO_ITEM_OPTIONS if value.get(k) is not None}
        if "sample_fps" in extra:
            extra["frames_fps"] = extra.pop("sample_fps")
        if extra.get("nframes") is not None:  # an item's nframes replaces the encoder's fps
            extra.setdefault("fps", None)
        elif extra.get("fps") is not None:
            extra.setdefault("nframes", None)
        try:
            opts = dataclasses.replace(opts, **extra)
        except (ArgumentError, TypeError, ValueError) as e:
            raise VideoError(f"bad per-video options {extra}: {e}", where=where, expected="qwen-vl-utils' video "
                             "options (fps or nframes, min/max_frames, min/max/total_pixels, video_start/end)",
                             found=str(extra), fix="fix the video item's options") from None
        value = value["video"]
    if isinstance(value, dict) and "frames" in value:
        fps = value.get("fps")
        if fps is not None:
            try:
                opts = dataclasses.replace(opts, frames_fps=float(fps))
            except (ArgumentError, TypeError, ValueError) as e:  # a row's value: its error, not a call's
                raise VideoError(f"bad frame rate {fps!r} for the frame list: {e}", where=where,
                                 expected="{'frames': [...], 'fps': <frames per second > 0>}", found=repr(fps)[:40],
                                 fix="give the frames' rate as a positive number") from None
        value = value["frames"]
    if hasattr(value, "_hf_encoded"):  # a datasets.Video() value decoded by torchcodec: its file
        value = value._hf_encoded
    if hasattr(value, "detach") and getattr(value, "ndim", 0) == 4:  # a torch uint8 [n, H, W, 3] frame stack
        # bfloat16 has no numpy dtype: its frames go one by one, each refused as a float image is
        value = list(value) if str(value.dtype) == "torch.bfloat16" else value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 4:
        value = list(value)
    return value, opts


def timestamp_text(seconds: float) -> str:
    """Qwen3-VL's text before a frame group: ``f"<{seconds:.1f} seconds>"``."""
    return f"<{seconds:.1f} seconds>"


def keeps_video_wrapper(processor, family) -> bool:
    """Whether ``processor`` keeps the chat template's ``<|vision_start|><|video_pad|><|vision_end|>``
    pair around the frame blocks of a family whose frame groups are blocks (Qwen3-VL, Qwen3.5).

    Asked of the processor's own text step (``get_text_with_replacements``): the Qwen3-VL
    processor of transformers >= 5.25 collapses the pair (each frame block carries its own),
    5.x lines before it (and vLLM 0.32) keep it. A processor without that step (transformers 4.x)
    is asked through its ``__call__`` on the wrapper with a one-frame-group stand-in video
    processor (`_call_keeps_wrapper`): 4.57's Qwen3VLProcessor collapses the pair too. Something
    that is not a processor (a bare tokenizer) keeps it. True for every other family."""
    fam = family
    if not fam.video_frames_are_blocks:
        return True
    wrapper = "".join(getattr(processor, f"{k}_token", None) or getattr(fam, f"{k}_token")
                      for k in ("vision_start", "video", "vision_end"))
    step = getattr(processor, "get_text_with_replacements", None)
    mark = "\x00mmpipe-video\x00"
    try:
        if step is None:
            return _call_keeps_wrapper(processor, fam, wrapper) if _is_processor(processor) else True
        text, _ = step([wrapper], videos_replacements=[mark])
    except Exception as e:  # a processor whose text step takes other arguments: say so, never guess
        raise ArgumentError(f"could not ask the {fam.name} processor how it lays out video placeholders "
                            f"({type(e).__name__}: {e}); report it with your transformers version") from None
    return text[0] != mark


def _is_processor(obj) -> bool:
    return callable(obj) and getattr(obj, "tokenizer", None) is not None and hasattr(obj, "image_processor")


class _OneGroupVideos:
    """A stand-in video processor: any video is one frame group of one merged token (grid
    ``(1, merge, merge)``), frames ``indices`` of a ``fps`` video, so the processor's ``__call__``
    runs its own text and time steps alone."""

    def __init__(self, fam, fps: float, indices: list):
        self.merge_size, self.temporal_patch_size = fam.merge_size, fam.temporal_patch_size
        self.fps, self.indices = fps, indices

    def __call__(self, videos=None, **_):
        import torch
        from transformers.video_utils import VideoMetadata

        m = self.merge_size
        meta = VideoMetadata(total_num_frames=max(self.indices) + 1, fps=self.fps, frames_indices=list(self.indices))
        return {"video_grid_thw": torch.tensor([[1, m, m]]), "video_metadata": [meta]}


def _probe_call(processor, fam, text: str, fps: float = 2.0, indices: Optional[list] = None):
    """``processor(text=[text], videos=[one clip])`` with `_OneGroupVideos` as its video processor."""
    import copy

    probe = copy.copy(processor)  # shallow: only the video processor is swapped
    probe.video_processor = _OneGroupVideos(fam, fps, indices or list(range(fam.temporal_patch_size)))
    return probe(text=[text], videos=[np.zeros((fam.temporal_patch_size, 1, 1, 3), np.uint8)])


def _call_keeps_wrapper(processor, fam, wrapper: str) -> bool:
    """Whether ``processor(text=[wrapper], videos=[one clip])`` keeps the wrapper's pair: its ids
    hold two ``<|vision_start|>`` (the pair and the frame group's) or one (collapsed)."""
    out = _probe_call(processor, fam, wrapper)
    start = processor.tokenizer.convert_tokens_to_ids(getattr(processor, "vision_start_token", None)
                                                      or fam.vision_start_token)
    return list(out["input_ids"][0]).count(start) == 2


def check_processor_seconds(processor, family) -> None:
    """Refuse ``sampling="processor"`` where the processor's ``second_per_grid_ts`` does not follow the
    sampled frames: transformers 4.x's Qwen2.5-VL processor writes ``temporal_patch_size / the fps
    argument`` (2.0 when none is given), whatever rate the frames were sampled at (5.x: the sampled
    rate, ``VideoMetadata.sampled_fps``). Asked of a processor without 5.x's text step through its
    ``__call__``: frames sampled at 5 fps give ``T / 5``, or not. `ArgumentError` naming the fix."""
    fam = family
    if not fam.takes_second_per_grid_ts or not _is_processor(processor) \
            or getattr(processor, "get_text_with_replacements", None) is not None:
        return
    T = fam.temporal_patch_size
    try:  # frames 0, 2 (T = 2) of a 10 fps video: sampled at 5 fps
        out = _probe_call(processor, fam, fam.video_token, fps=10.0, indices=list(range(0, 2 * T, 2)))
        got = float(np.asarray(out["second_per_grid_ts"]).reshape(-1)[0])
    except Exception as e:
        raise ArgumentError(f"could not ask the {fam.name} processor how it times video frames "
                            f"({type(e).__name__}: {e}); report it with your transformers version") from None
    if abs(got - T / 5.0) > 1e-6:
        import transformers

        raise ArgumentError(
            f"video_options sampling='processor' cannot equal this {type(processor).__name__}'s chat path "
            f"(transformers {transformers.__version__}): it writes second_per_grid_ts = temporal_patch_size / "
            f"the fps argument (2.0 when none is given; {got:g} here for frames sampled at 5 fps), not the rate "
            "the frames are sampled at, so its M-RoPE time axis does not follow the video. Fix: "
            "sampling='qwen-vl-utils' (the default: the model card's pipeline, which hands its sample fps "
            "to the processor), or encode with transformers >= 5 (its processor takes the sampled rate)")


def _expand_qwen(enc, ids, pads, grids, labels, times_ids) -> tuple:
    return expand_video_pads(ids, pads, grids, enc.family, labels, times_ids=times_ids,
                             vision_start_id=enc.vision_start_id, vision_end_id=enc.vision_end_id,
                             outer_wrapper=enc.video_wrapper)


def _glue_first_times(enc, ids, labels, pads, times_ids, first_texts) -> tuple:
    """Where the processor drops the template's ``<|vision_start|>``/``<|vision_end|>`` pair around a
    video (`keeps_video_wrapper` False), its first ``<t seconds>`` follows the text before the video
    directly and the processor tokenizes the two as ONE string: a vocabulary that merges across the
    seam (``" <"``, a token of the real Qwen vocabularies) writes other ids than the text and the
    timestamp tokenized apart. Re-tokenizes each such run + first timestamp together: the run keeps
    its ids (and labels) up to where the two tokenizations part, the rest becomes the first time ids
    (``times_ids[v][0]``, replaced in place; -100 in the expansion). Returns ``(ids, labels, pads)``."""
    tok, vs, ve = enc.tokenizer, enc.vision_start_id, enc.vision_end_id
    pieces, lab, prev, new_pads, shift = [], [], 0, [], 0
    for v, pos in enumerate(np.asarray(pads).tolist()):
        if not (prev < pos - 1 and pos + 1 < len(ids) and ids[pos - 1] == vs and ids[pos + 1] == ve):
            new_pads.append(pos + shift)
            continue
        j = text_run_start(ids, pos - 1, prev, tok)
        run = ids[j:pos - 1].tolist()
        text = tok.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        joint = tok(text + first_texts[v], add_special_tokens=False)["input_ids"]
        if not run or joint[len(run):] == list(times_ids[v][0]) or \
                tok(text, add_special_tokens=False)["input_ids"] != run:  # nothing merged, or no exact round trip
            new_pads.append(pos + shift)
            continue
        c = next((k for k, (a, b) in enumerate(zip(run, joint)) if a != b), min(len(run), len(joint)))
        times_ids[v] = [joint[c:]] + list(times_ids[v][1:])
        pieces += [ids[prev:j], np.asarray(joint[:c], np.int64)]
        if labels is not None:
            lab += [labels[prev:j + c]]
        shift += c - len(run)
        new_pads.append(pos + shift)
        prev = pos - 1
    if not pieces:
        return ids, labels, pads
    ids = np.concatenate(pieces + [ids[prev:]]).astype(np.int64)
    labels = None if labels is None else np.concatenate(lab + [labels[prev:]]).astype(np.int64)
    return ids, labels, np.asarray(new_pads, np.int64)


def _qwen_plan(total: int, fps: float, h: int, w: int, spec, opts: VideoOptions, where: str, frame_list: bool):
    """qwen-vl-utils' plan, or under ``sampling="processor"`` the family's video processor's."""
    plan = processor_plan if opts.sampling == "processor" else qwen_plan
    return plan(total, fps, h, w, spec, opts, where, frame_list)


# `ModelFamily.video_rule` -> (sampling/sizing plan, a frame group's time text, pad expansion)
VIDEO_RULES = {"qwen": (_qwen_plan, timestamp_text, _expand_qwen),
               "glm4v": (glm_plan, glm_time_text, expand_glm_video_pads),
               "glm46v": (glm46v_plan, glm46v_time_text, expand_glm_video_pads)}


def _one(enc, i: int, value: Any, where: str):
    """Video ``i`` of the row -> `VideoPatches` (patches None under ``pixels="none"``)."""
    at = f"{where}, video {i}"
    try:
        value, opts = resolve_video(value, enc.video_opts, at)
        if enc.image_root is not None and not isinstance(value, (list, tuple)):
            confine_image(value, enc.image_root, where=at)
        if enc.pixels == "source":
            raise VideoError("pixels='source' keeps image files only; videos are not stored that way", where=at,
                             expected="pixels='uint8', 'float32' or 'none' for rows with videos",
                             found="pixels='source'", fix="encode rows with videos with pixels='uint8'")
        fn = video_layout if enc.pixels == "none" else encode_video
        return fn(value, enc.spec, opts, where=at, plan=VIDEO_RULES[enc.family.video_rule][0])
    except ImageError as e:  # a VideoError, or confine_image's ImageError about the video's path
        if not isinstance(e, VideoError):  # keep a listed frame's own place ("row 3, video 0, frame 7")
            e = VideoError(e.detail.replace("image path", "video path"), where=e.where or at, expected=e.expected,
                           found=e.found, fix=e.fix)
        raise e.locate(column=enc.videos_column) from None


def add_videos(enc, ids: np.ndarray, labels: Optional[np.ndarray], videos: list, where: str) -> tuple:
    """Encode a row's videos and expand their pads (one ``<|video_pad|>`` per video in ``ids``).

    Returns ``(ids, labels, grids int64 [V, 3], second_per_grid_ts float32 [V], uint8 patch
    blocks [grid_t*gh*gw, 3*T*p*p] per video (none under ``pixels="none"``))``."""
    fam = enc.family
    if videos and not fam.encodes_videos:
        raise VideoError(
            f"holds {len(videos)} video(s), but mmpipe does not encode {fam.name} videos (its processor lays out "
            "each frame as an image block followed by its timestamp, inside <|begin_of_video|>...)", where=where,
            column=enc.videos_column, expected="images only", found=f"{len(videos)} video(s)",
            fix=f"drop the videos, or pass sampled frames as image items; {fam.name} video rows need the "
                "processor's own call for now")
    if videos:
        check_video_processor(getattr(enc, "processor", None), fam, where, enc.videos_column)
    pads = np.flatnonzero(ids == enc.video_token_id) if enc.video_token_id is not None else np.zeros(0, np.int64)
    if len(pads) != len(videos):
        raise PlaceholderError(
            f"the rendered prompt holds {len(pads)} {fam.video_token} token(s) but the row has {len(videos)} video(s)",
            where=where, column="messages", expected=f"one {fam.video_token} per video", found=f"{len(pads)}",
            fix=(f"remove literal {fam.video_token} text from the messages" if len(pads) > len(videos)
                 else "the chat template did not render every video item: move videos to a user turn"))
    if not videos:
        return ids, labels, np.zeros((0, 3), np.int64), np.zeros(0, np.float32), []
    encoded = [_one(enc, i, v, where) for i, v in enumerate(videos)]
    grids = np.asarray([v.grid for v in encoded], dtype=np.int64)
    seconds = np.asarray([v.second_per_grid_ts for v in encoded], dtype=np.float32)
    times_ids = None
    _, time_text, expand = VIDEO_RULES[fam.video_rule]
    if fam.video_frames_are_blocks:
        cache: dict[str, list] = {}
        tok = enc.tokenizer
        times_ids = [[cache.setdefault(s, tok(s, add_special_tokens=False)["input_ids"])
                      for s in map(time_text, v.timestamps)] for v in encoded]
        if not enc.video_wrapper:
            ids, labels, pads = _glue_first_times(enc, ids, labels, pads, times_ids,
                                                  [time_text(v.timestamps[0]) for v in encoded])
    ids, labels = expand(enc, ids, pads, grids, labels, times_ids)
    blocks = [v.patches for v in encoded if v.patches is not None]
    return ids, labels, grids, seconds, blocks


def video_row_bytes(enc, ds=None) -> int:
    """Most stored pixel bytes of one row's videos under ``enc``'s options: the most videos any
    row of ``ds`` holds in ``enc.videos_column`` (0 without that column) x the largest video
    (frames x per-frame ``max_pixels`` x 3 channels, in the stored format), for the writer
    buffer bound of `mmpipe.encode_dataset`. 0 for encoders without videos or pixels;
    `UNBOUNDED_ROW_BYTES` (one row per writer batch) where ``sampling="processor"`` keeps every
    frame (`takes_every_frame`: Qwen2/2.5-VL's processor without ``fps``), whatever ``max_frames``
    says. Not covered: inline videos (in the messages) and frame lists longer than ``max_frames``."""
    opts, spec = getattr(enc, "video_opts", None), getattr(enc, "spec", None)
    column = getattr(enc, "videos_column", None)
    n_videos = most_per_row(ds, column) if column else 0  # Arrow list lengths only: nothing decoded
    if opts is None or spec is None or enc.pixels not in ("uint8", "float32") or not n_videos:
        return 0
    if opts.sampling == "processor" and takes_every_frame(opts, spec):
        return UNBOUNDED_ROW_BYTES  # every frame (a 40 s clip at 30 fps: 1,200 frames, 1.3x the bound below)
    hi = opts.nframes + 1 if opts.nframes is not None else opts.max_frames
    frames_pixels = max(n * frame_bounds(n, spec, opts)[1] for n in range(2, max(2, hi) + 1, 2))
    return int(3 * frames_pixels * (4 if enc.pixels == "float32" else 1)) * n_videos
