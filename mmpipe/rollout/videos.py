"""A stored row's videos as a vLLM prompt takes them (rollout inputs stage).

vLLM (0.32) wants, per video, ONE ``<|video_pad|>`` in the prompt ids (inside the row's own
``<|vision_start|>``/``<|vision_end|>``) and, in ``multi_modal_data["video"]``, the frames
(uint8 [n, H, W, 3]) plus, for the families whose text or positions depend on time, metadata
it hands to the transformers processor (``VideoMetadata`` fields):

- Qwen2-VL: the frames alone.
- Qwen2.5-VL: ``(frames, metadata)``; the processor computes ``second_per_grid_ts =
  temporal_patch_size / sampled_fps`` with ``sampled_fps = len(frames_indices) /
  total_num_frames * fps``. mmpipe gives ``frames_indices = range(n)``, ``total_num_frames = n``
  and the ``fps`` (searched among neighbouring doubles) for which that division gives back the
  row's stored ``second_per_grid_ts`` (float32, as a double) exactly where such a double exists
  (every common frame rate), else to one float64 ulp.
- GLM-4.1V: ``(frames, metadata)`` whose indices re-create each group's whole seconds
  (`mmpipe.rollout.glm_video_prompts`).
- Qwen3-VL: ``(frames, metadata)``; vLLM writes ``<{t:.1f} seconds>`` before each frame
  group itself, ``t`` the mean of the group's ``frames_indices / fps``. The row holds those
  timestamps as text: they are read back (the tokenizer decodes them), the whole expanded span
  (timestamps and per-group blocks) becomes the one pad, and ``fps = 10`` with each group's
  two indices ``= round(10 * t)`` re-creates the same text. The timestamp text starts a token
  where ``<|vision_start|>`` / ``<|vision_end|>`` precede it; a video's first one that the
  processor tokenized together with the text before it (5.25's layout, a vocabulary merging
  ``" <"``) is split off that text, which is tokenized again as the template wrote it.
  The prompt holds the video as the chat template writes it, ``<|vision_start|><|video_pad|>
  <|vision_end|>``, whichever processor made the row: on transformers 5.x up to 5.24 the row keeps
  that outer pair around its frame groups (vLLM 0.32 expands the pad inside it); 4.57's and 5.25's
  processors drop it (`mmpipe.encoding.videos.keeps_video_wrapper`), so such a row's prompt gets the pair
  back: the template's own text, which a vLLM that expands as that processor does turns into
  the row's frame groups (a bare pad would match only vLLM 0.32's rule, which 5.25 no longer
  follows).

The stored frames are already the processor's resize (sides multiples of ``patch * merge``,
``t * T`` frames), so the prompt carries ``videos_kwargs = {"do_resize": False,
"do_sample_frames": False}``: the processor keeps them as they are, and vLLM's expanded prompt
ids and grids equal the row's (checked in tests/rollout/test_video_vllm.py with the engine).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from mmpipe.encoding.placeholders import collapse_placeholders
from mmpipe.encoding.tokenize import text_run_start
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.families import ModelFamily
from mmpipe.images.spec import VisionSpec
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.glm_video_prompts import glm46v_prompt_videos, glm_prompt_videos
from mmpipe.rollout.images import row_video_frames

__all__ = ["vllm_video_prompt", "video_fps_for", "TIMESTAMP_FPS"]

TIMESTAMP_FPS = 10.0  # Qwen3-VL timestamps are printed with one decimal: tenths are exact indices
VIDEO_KWARGS = {"do_resize": False, "do_sample_frames": False}
# `ModelFamily.video_rule` -> its prompt builder (else Qwen's); GLM-4.6V's refuses
PROMPT_RULES = {"glm4v": glm_prompt_videos, "glm46v": glm46v_prompt_videos}
_TIMESTAMP = re.compile(r"^<(\d+(?:\.\d+)?) seconds>$")
_GLUED_TIMESTAMP = re.compile(r"^(.*)<(\d+(?:\.\d+)?) seconds>$", re.S)  # text, then a timestamp
_MAX_TIMESTAMP_TOKENS = 32  # "<123456.7 seconds>" is 18 characters; a byte-level tokenizer: 18 tokens


def video_fps_for(second_per_grid_ts: float, temporal_patch_size: int) -> float:
    """The fps whose ``temporal_patch_size / fps`` is ``second_per_grid_ts`` (as float64)
    exactly, when a double near ``T / s`` has that property (else the nearest): what the
    Qwen2.5-VL processor divides to recover the row's ``second_per_grid_ts``."""
    s, T = float(second_per_grid_ts), float(temporal_patch_size)
    fps = T / s
    for cand in (fps, *_neighbours(fps, 4)):
        if T / cand == s:
            return float(cand)
    return float(fps)


def _neighbours(x: float, k: int) -> list[float]:
    out, lo, hi = [], x, x
    for _ in range(k):
        lo, hi = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)
        out += [float(lo), float(hi)]
    return out


def vllm_video_prompt(row: MultiModalInputs, spec: VisionSpec, tokenizer: Any = None, *,
                      index: Any = None) -> tuple[list[int], list, dict]:
    """``(prompt_token_ids, videos, videos_kwargs)`` for one row holding videos (and maybe images).

    ``prompt_token_ids``: the row's ids with one pad per image and per video; ``videos``: per
    video, uint8 frames [t*T, gh*p, gw*p, 3] or ``(frames, metadata dict)`` (see the module
    docstring); ``videos_kwargs``: the per-prompt video processor kwargs. ``tokenizer`` is
    needed for Qwen3-VL rows (their timestamps are read from the text), else an ArgumentError.
    """
    fam = row.fam
    ids = collapse_placeholders(row.input_ids, row.mm_token_type_ids, row.image_grid_thw, row.video_grid_thw,
                                family=fam, row=index)
    frames = row_video_frames(row, spec, index=index)
    grids = row.video_grid_thw.tolist()
    if fam.video_rule in PROMPT_RULES:  # GLM-4.1V: frame times after each block, in whole seconds
        ids, videos = PROMPT_RULES[fam.video_rule](ids, frames, grids, fam, tokenizer, index)
    elif fam.video_frames_are_blocks:
        ids, stamps = _collapse_timestamps(ids, grids, fam, tokenizer, index)
        videos = [(f, _timestamp_metadata(ts, spec.temporal_patch_size)) for f, ts in zip(frames, stamps)]
    elif fam.takes_second_per_grid_ts:
        videos = [(f, _fps_metadata(len(f), float(s), spec.temporal_patch_size))
                  for f, s in zip(frames, row.second_per_grid_ts.tolist())]
    else:
        videos = list(frames)
    return [int(t) for t in ids], videos, dict(VIDEO_KWARGS)


def _fps_metadata(n: int, second_per_grid_ts: float, T: int) -> dict:
    fps = video_fps_for(second_per_grid_ts, T)
    return {"fps": fps, "frames_indices": list(range(n)), "total_num_frames": n, "duration": n / fps,
            "do_sample_frames": False}


def _timestamp_metadata(stamps: list[float], T: int) -> dict:
    idx = [int(round(t * TIMESTAMP_FPS)) for t in stamps for _ in range(T)]
    total = max(idx) + 1
    return {"fps": TIMESTAMP_FPS, "frames_indices": idx, "total_num_frames": total,
            "duration": total / TIMESTAMP_FPS, "do_sample_frames": False}


def _collapse_timestamps(ids: np.ndarray, grids: list, fam: ModelFamily, tokenizer: Any,
                         index: Any) -> tuple[np.ndarray, list[list[float]]]:
    """Qwen3-VL collapsed ids (per video ``t`` blocks ``<ts><vs><vp><ve>``) -> one ``<vp>`` per
    video inside the template's ``<vs>``/``<ve>`` (the row's own pair, or added where the
    processor dropped it: module doc), and each video's timestamps read from the text."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if tok is None or not hasattr(tok, "decode"):
        raise ArgumentError(
            f"row {index}: {fam.name} video prompts need the tokenizer to read the frame timestamps from "
            "the text: pass the processor (to_vllm_prompts(rows, processor))")
    vt = fam.vision_token_ids(tok)
    pads = np.flatnonzero(ids == vt["video"]).tolist()
    out, stamps, cursor, k = [], [], 0, 0
    for v, (t, _, _) in enumerate(grids):
        blocks = pads[k:k + t]
        k += t
        if len(blocks) != t or any(ids[b - 1] != vt["vision_start"] or ids[b + 1] != vt["vision_end"] for b in blocks):
            raise PlaceholderError(f"video {v}: expected {t} frame-group blocks <|vision_start|><|video_pad|>"
                                   "<|vision_end|>", row=index, stage="rollout", column="input_ids",
                                   expected=f"{t} blocks", found=f"{len(blocks)} <|video_pad|> token(s)"
                                   if len(blocks) != t else "a <|video_pad|> outside <|vision_start|> <|vision_end|>",
                                   fix="re-encode the row")
        start, first, head = _timestamp_before(ids, blocks[0] - 1, cursor, tok, index, v)
        ts = [first]
        for g in range(1, t):
            ts.append(_parse_timestamp(ids[blocks[g - 1] + 2:blocks[g] - 1], tok, index, v))
        after = blocks[-1] + 2
        wrapped = start > cursor and ids[start - 1] == vt["vision_start"] and after < len(ids) \
            and ids[after] == vt["vision_end"]
        pad = [vt["video"]] if wrapped else [vt["vision_start"], vt["video"], vt["vision_end"]]
        out += [ids[cursor:start], np.asarray(head, np.int64), np.asarray(pad, np.int64)]
        cursor = after
        stamps.append(ts)
    out.append(ids[cursor:])
    return np.concatenate(out), stamps


def _timestamp_before(ids: np.ndarray, end: int, floor: int, tok, index, v) -> tuple[int, float, list]:
    """The shortest token run ``ids[j:end]`` (``j >= floor``) decoding to ``<x seconds>``: ``(j, x, [])``.
    Where the processor tokenized the text before the video together with it (transformers >= 5.25
    drops the template's wrapper, so ``"in <0.5 seconds>"`` is one string and a vocabulary merging
    ``" <"`` leaves no token boundary before ``<``): the whole text run before ``end`` (back to an
    added token or ``floor``) as ``(its start, x, the ids of its text without the timestamp)``, the
    text the template wrote before the video."""
    for j in range(end - 1, max(floor, end - _MAX_TIMESTAMP_TOKENS) - 1, -1):
        m = _TIMESTAMP.match(tok.decode(ids[j:end].tolist()))
        if m:
            return j, float(m.group(1)), []
    j = text_run_start(ids, end, floor, tok)
    m = _GLUED_TIMESTAMP.match(tok.decode(ids[j:end].tolist(), clean_up_tokenization_spaces=False))
    if m and j < end:
        return j, float(m.group(2)), tok(m.group(1), add_special_tokens=False)["input_ids"]
    raise PlaceholderError(f"video {v}: no '<x seconds>' timestamp text before its first frame group",
                           row=index, stage="rollout", column="input_ids", expected="'<x seconds>' text",
                           found=f"{tok.decode(ids[j:end].tolist())[-40:]!r} before it",
                           fix="encode the row with the Qwen3-VL processor's layout (mmpipe.encode)")


def _parse_timestamp(span: np.ndarray, tok, index, v) -> float:
    text = tok.decode(span.tolist())
    m = _TIMESTAMP.match(text)
    if not m:
        raise PlaceholderError(f"video {v}: expected '<x seconds>' between frame groups, found {text[:40]!r}",
                               row=index, stage="rollout", column="input_ids", expected="'<x seconds>'",
                               found=f"{text[:40]!r}", fix="re-encode the row")
    return float(m.group(1))

