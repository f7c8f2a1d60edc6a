"""GLM-4.1V rows' videos as vLLM's ``glm4_1v`` processor takes them (`mmpipe.rollout.videos`).

vLLM replaces each ``<|begin_of_video|><|video|><|end_of_video|>`` of the prompt with, per frame
group, ``<|begin_of_image|>`` + the group's ``<|image|>`` tokens + ``<|end_of_image|>`` + whole
seconds ``int(frames_indices[2g] / fps)`` (frames_indices first de-duplicated), what
``Glm4vProcessor`` writes. A stored row holds that text: `glm_video_ids` reads each group's
seconds back and collapses the video to the three tokens; `glm_video_metadata` gives frame
indices that are distinct (no de-duplication) and re-create those seconds: ``fps = n`` frames
and index ``s * n + j`` for frame ``j`` of a group at ``s`` seconds.

GLM-4.6V rows (video_rule ``"glm46v"``, times ``"1.5 seconds"``) are refused (`glm46v_prompt_videos`):
vLLM's ``glm4_1v`` processor writes GLM-4.1V's whole seconds, so its prompt would not be the row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpipe.encoding.glm_videos import VIDEO_BEGIN, VIDEO_END
from mmpipe.errors import ArgumentError, PlaceholderError, VideoError

__all__ = ["glm_video_ids", "glm_video_metadata", "glm_prompt_videos", "glm46v_prompt_videos"]


def glm_video_ids(ids: np.ndarray, grids: list, fam, tokenizer: Any, index: Any) -> tuple[np.ndarray, list]:
    """Ids with one ``<|image|>`` per frame group (`collapse_placeholders`) -> one ``<|video|>`` per video, and
    each video's per-group seconds (ints) read from the text after each ``<|end_of_image|>``."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if tok is None or not hasattr(tok, "decode"):
        raise ArgumentError(f"row {index}: {fam.name} video prompts need the tokenizer to read the frame "
                            "times from the text: pass the processor (to_vllm_prompts(rows, processor))")
    vt = fam.vision_token_ids(tok)
    bov, eov = tok.convert_tokens_to_ids([VIDEO_BEGIN, VIDEO_END])
    starts, ends = np.flatnonzero(ids == bov).tolist(), np.flatnonzero(ids == eov).tolist()
    if len(starts) != len(grids) or len(ends) != len(grids):
        raise PlaceholderError(f"{len(starts)} {VIDEO_BEGIN} / {len(ends)} {VIDEO_END} for {len(grids)} video(s)",
                               row=index, stage="rollout", column="input_ids", expected=f"{len(grids)} of each",
                               found=f"{len(starts)} / {len(ends)}", fix="re-encode the row")
    out, stamps, cursor = [], [], 0
    for v, ((t, _, _), s, e) in enumerate(zip(grids, starts, ends)):
        span = ids[s + 1:e]
        blocks = np.flatnonzero(span == vt["vision_start"]).tolist() + [len(span)]
        secs = []
        for g in range(len(blocks) - 1):
            b = span[blocks[g]:blocks[g + 1]]
            text = tok.decode(b[3:].tolist())
            if len(b) < 4 or b[1] != vt["image"] or b[2] != vt["vision_end"] or not text.isdigit():
                raise PlaceholderError(f"video {v}: frame group {g} is not <|begin_of_image|><|image|>"
                                       f"<|end_of_image|><seconds> (found {text[:20]!r})", row=index,
                                       stage="rollout", column="input_ids",
                                       expected="<|begin_of_image|><|image|><|end_of_image|><seconds>",
                                       found=f"{len(b)} tokens, text {text[:20]!r}", fix="re-encode the row")
            secs.append(int(text))
        if len(secs) != t:
            raise PlaceholderError(f"video {v}: {len(secs)} frame groups, its grid has {t}", row=index,
                                   stage="rollout", column="input_ids", expected=f"{t} frame groups",
                                   found=f"{len(secs)}", fix="re-encode the row")
        out += [ids[cursor:s + 1], np.asarray([vt["video"]], np.int64)]
        cursor = e
        stamps.append(secs)
    out.append(ids[cursor:])
    return np.concatenate(out).astype(np.int64), stamps


def glm_video_metadata(seconds: list, n_frames: int) -> dict:
    """``VideoMetadata`` fields under which vLLM / ``Glm4vProcessor`` write ``seconds`` (one int
    per frame group of ``n_frames // len(seconds)`` frames) and keep all ``n_frames`` frames."""
    per = n_frames // len(seconds)
    idx = [s * n_frames + j for j, s in enumerate(s for s in seconds for _ in range(per))]
    total = max(idx) + 1
    return {"fps": float(n_frames), "frames_indices": idx, "total_num_frames": total,
            "duration": total / n_frames, "do_sample_frames": False}


def glm_prompt_videos(ids: np.ndarray, frames: list, grids: list, fam, tokenizer: Any, index: Any) -> tuple:
    """(prompt ids, ``[(frames, metadata)]`` per video) for a GLM-4.1V row (collapsed ids in)."""
    ids, stamps = glm_video_ids(ids, grids, fam, tokenizer, index)
    return ids, [(f, glm_video_metadata(s, len(f))) for f, s in zip(frames, stamps)]


def glm46v_prompt_videos(ids: np.ndarray, frames: list, grids: list, fam, tokenizer: Any, index: Any) -> tuple:
    """A `VideoError`: a GLM-4.6V row's video prompt cannot be rebuilt exactly (see the module docstring)."""
    raise VideoError(f"{fam.name} video rows have no vLLM prompt here: a row's frame times are Glm46VProcessor's "
                     "'1.5 seconds', and vLLM's glm4_1v processor writes GLM-4.1V's whole seconds (its prompt would "
                     "not be the row)", row=index, stage="rollout", column="input_ids",
                     expected="images only (GLM-4.6V rows), or GLM-4.1V video rows",
                     found=f"{len(grids)} video(s) in a {fam.name} row",
                     fix="give the rollout engine the row's messages and videos (the processor's own chat path)")
