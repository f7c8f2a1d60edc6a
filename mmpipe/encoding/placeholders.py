"""Encode, step 3 (and every later stage that edits ids): THE one expand/collapse of vision
placeholders.

A chat template renders ONE pad token per vision block (``<|image_pad|>`` per image,
``<|video_pad|>`` per video - per frame group for Qwen3-VL, see
`ModelFamily.video_frames_are_blocks`); training ids hold each block EXPANDED to its LLM token
count, ``t*h*w / merge^2`` (`ModelFamily.tokens_per_grid`). Expanding at the token-id level
equals tokenizing the expanded text, because the pad token is a special token that never
merges with its neighbours, and avoids tokenizing thousands of special tokens per image.

- `block_tokens`: grids int [N, 3] -> token count of each block in the text, in order.
- `repeat_pads`: the shared core - ids int64 [L] with one pad per block -> each pad repeated
  its block's count (one ``np.repeat`` with a repeats vector); aligned per-token arrays
  (labels, step ids: int64 [L]) are repeated the same way. Used by encode, multi-turn
  appends (`mmpipe.rollout.multiturn`) and ReMA (`mmpipe.rema.encode`).
- `expand_image_pads`: `repeat_pads` with the counts of image grids.
- `expand_video_pads` / `expand_glm_video_pads`: a video's pad -> its blocks (Qwen / GLM-4.1V layout).
- `collapse_placeholders` / `expand_placeholders`: training ids <-> ids with one pad per block
  (what vLLM takes, `mmpipe.rollout.inputs`); `check_roundtrip` asserts they invert exactly.
- `check_image_placeholders`: one placeholder per image in the rendered prompt (every kind that
  lays images out itself); `check_rendered_images`: the turns of the images a template dropped;
  `splice_text`: each image's placeholder <-> its text, in the text (the tiled families: encode
  expands, their vLLM prompt collapses).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.encoding.parse import row_where
from mmpipe.errors import ArgumentError, InputError, PlaceholderError
from mmpipe.families import family_of
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, to_numpy

__all__ = [
    "block_tokens",
    "repeat_pads",
    "expand_image_pads",
    "expand_video_pads",
    "expand_glm_video_pads",
    "collapse_placeholders",
    "expand_placeholders",
    "check_roundtrip",
    "check_image_placeholders",
    "check_rendered_images",
    "splice_text",
]

KINDS = (("image", 1), ("video", 2))  # (block kind, its mm_token_type_ids code)



# ---- the shared core ----------------------------------------------------------------------
def block_tokens(grid, family, kind: str) -> list[int]:
    """Token count of each vision block in the text, in order.

    ``grid``: int [N, 3] (t, h, w) of images or videos (None or empty: no blocks); ``kind``:
    ``"image"`` or ``"video"``. One block per image; one per video, except in families whose
    video frame groups are blocks of their own (`ModelFamily.video_frames_are_blocks`,
    Qwen3-VL): ``t`` blocks of ``h*w/merge^2`` tokens per video, a timestamp text before each.
    """
    fam = family_of(family)
    g = np.asarray(np.zeros((0, 3)) if grid is None else to_numpy(grid), dtype=np.int64).reshape(-1, 3)
    if kind == "video" and fam.video_frames_are_blocks:
        frames = g.copy()
        frames[:, 0] = 1
        return np.repeat(fam.tokens_per_grid(frames), np.maximum(g[:, 0], 0)).tolist()
    return fam.tokens_per_grid(g).tolist()


def repeat_pads(ids: np.ndarray, positions, counts, *aligned: Optional[np.ndarray]) -> tuple:
    """Expand one pad per block into its block's tokens.

    Args:
        ids: int64 [L], one pad token per block at ``positions`` (int [K]).
        counts: int [K], the token count of each block (`block_tokens`).
        aligned: per-token arrays [L] (labels, step ids) repeated like ``ids``; None stays None.

    Returns ``(ids, *aligned)``, each [L - K + sum(counts)]; every other token is kept once.
    """
    reps = np.ones(ids.shape, dtype=np.int64)
    reps[positions] = counts
    return (np.repeat(ids, reps),) + tuple(None if a is None else np.repeat(a, reps) for a in aligned)


def expand_image_pads(ids: np.ndarray, pad_positions, grids, family, *aligned: Optional[np.ndarray]) -> tuple:
    """`repeat_pads` for images: the pad of image ``i`` (``pad_positions[i]``) becomes
    ``tokens_per_grid(grids[i])`` pads. ``grids``: int [I, 3]; returns ``(ids, *aligned)``."""
    return repeat_pads(ids, pad_positions, family_of(family).tokens_per_grid(grids), *aligned)


def expand_video_pads(ids: np.ndarray, pad_positions, grids, family, labels: Optional[np.ndarray] = None, *,
                      times_ids: Optional[list] = None, vision_start_id: Optional[int] = None,
                      vision_end_id: Optional[int] = None, outer_wrapper: bool = True) -> tuple:
    """Expand each video's single ``<|video_pad|>`` (at ``pad_positions``, int [V]) into its
    blocks, as the family's processor writes them (``replace_video_token``).

    ``grids``: int [V, 3]. One block of ``t*h*w/merge^2`` pads per video; in families whose
    frame groups are blocks (`ModelFamily.video_frames_are_blocks`, Qwen3-VL) ``t`` times
    ``<timestamp ids> <|vision_start|> h*w/merge^2 pads <|vision_end|>``, the timestamp ids of
    video ``v``'s group ``g`` being ``times_ids[v][g]`` (the tokenized ``"<1.5 seconds>"``).
    ``labels`` int64 [L] (or None): a video is input, never a target: its pads are repeated
    with their label (the encoder masks pads), the tokens Qwen3-VL inserts get -100.
    ``outer_wrapper`` False: a pad the template wrapped as ``<|vision_start|><|video_pad|>
    <|vision_end|>`` loses that outer pair, as the frame blocks carry their own (the Qwen3-VL
    processor of transformers 4.57 and >= 5.25, `mmpipe.encoding.videos.keeps_video_wrapper`);
    True: it stays (transformers 5.x before 5.25, vLLM 0.32).
    Returns ``(ids, labels)``, each [L - V + expanded length - 2 * unwrapped pads].
    """
    fam = family_of(family)
    g = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    pad_positions = np.asarray(pad_positions, dtype=np.int64).reshape(-1)
    if not fam.video_frames_are_blocks:
        out_ids, out_lab = repeat_pads(ids, pad_positions, fam.tokens_per_grid(g), labels)
        return out_ids, out_lab
    pieces, lab_pieces, prev = [], [], 0
    for v, pos in enumerate(pad_positions.tolist()):
        pad = int(ids[pos])
        n = int(fam.tokens_per_grid(np.asarray([[1, g[v, 1], g[v, 2]]]))[0])
        block = np.concatenate([np.concatenate([np.asarray(times_ids[v][k], np.int64),
                                                np.asarray([vision_start_id] + [pad] * n + [vision_end_id], np.int64)])
                                for k in range(int(g[v, 0]))])
        unwrap = (not outer_wrapper and prev < pos < len(ids) - 1
                  and ids[pos - 1] == vision_start_id and ids[pos + 1] == vision_end_id)
        cut = pos - 1 if unwrap else pos
        pieces += [ids[prev:cut], block]
        if labels is not None:
            lab_pieces += [labels[prev:cut], np.full(len(block), IGNORE_INDEX, np.int64)]
        prev = pos + (2 if unwrap else 1)
    pieces.append(ids[prev:])
    out = np.concatenate(pieces).astype(np.int64)
    if labels is None:
        return out, None
    return out, np.concatenate(lab_pieces + [labels[prev:]]).astype(np.int64)


def expand_glm_video_pads(enc, ids: np.ndarray, pads, grids, labels: Optional[np.ndarray], times_ids) -> tuple:
    """Each video's ``<|video|>`` (at ``pads``, int [V]) -> per frame group ``<|begin_of_image|>``,
    ``h*w/merge^2`` ``<|image|>``, ``<|end_of_image|>``, the group's time ids (``times_ids[v][g]``).
    ``labels`` (or None): the inserted tokens get -100. Returns ``(ids, labels)``."""
    fam, g = enc.family, np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    pieces, lab, prev = [], [], 0
    for v, pos in enumerate(np.asarray(pads, dtype=np.int64).reshape(-1).tolist()):
        n = int(fam.tokens_per_grid(np.asarray([[1, g[v, 1], g[v, 2]]]))[0])
        one = [enc.vision_start_id] + [enc.image_token_id] * n + [enc.vision_end_id]
        block = np.asarray([t for k in range(int(g[v, 0])) for t in one + list(times_ids[v][k])], np.int64)
        pieces += [ids[prev:pos], block]
        if labels is not None:
            lab += [labels[prev:pos], np.full(len(block), IGNORE_INDEX, np.int64)]
        prev = pos + 1
    out = np.concatenate(pieces + [ids[prev:]]).astype(np.int64)
    return out, (None if labels is None else np.concatenate(lab + [labels[prev:]]).astype(np.int64))


# ---- one placeholder per image, in the rendered text (tiled families: texts) ---------------------
def check_image_placeholders(found: int, n_images: int, token: str, where: str, *, unit: str = "token",
                             missing: str = "") -> None:
    """`PlaceholderError` unless the rendered prompt holds ``found`` == ``n_images`` placeholders
    ``token`` (one per image; ``unit``: what the message calls one; ``missing``: said of a
    template that dropped images)."""
    if found != n_images:
        raise PlaceholderError(
            f"the rendered prompt holds {found} {token} {unit}(s) but the row has {n_images} image(s)",
            where=where, column="messages", expected=f"one {token} per image", found=str(found),
            fix=(f"remove literal {token} text from the messages" if found > n_images
                 else "the chat template did not render every image item" + missing),
        )


def check_rendered_images(text: str, messages: list, token: Optional[str], where: str) -> None:
    """`check_image_placeholders` where the rendered prompt ``text`` holds fewer ``token`` than
    ``messages`` hold image items (the template dropped some), its fix naming the turns that hold
    images: the ones outside user turns when they are exactly as many as are missing."""
    per = [(i, m.get("role"), sum(1 for p in m["content"] if isinstance(p, dict) and p.get("type") == "image"))
           for i, m in enumerate(messages) if isinstance(m.get("content"), list)]
    per = [x for x in per if x[2]]
    total = sum(n for *_, n in per)
    found = text.count(token) if token and total else total
    if found >= total:
        return
    outside = [x for x in per if x[1] != "user"]
    missing = total - found

    def named(xs) -> str:
        return ", ".join(f"message {i} ({role}, {n} image{'s' if n > 1 else ''})" for i, role, n in xs)
    if outside and sum(n for *_, n in outside) == missing:
        roles = sorted({str(r) for _, r, _ in outside})
        cause = (f" ({missing} missing, as many as the row's images outside user turns: {named(outside)}; this "
                 f"template apparently drops images in {' or '.join(roles)} messages): move those images to a "
                 f"user turn, or use a chat template that renders them there")
    else:
        cause = (f" ({missing} missing; the images sit in {named(per)}): check which turns and content items "
                 "the chat template renders images for")
    check_image_placeholders(found, total, token, where, missing=cause)


def splice_text(text: str, olds: list, news: list) -> tuple[list, list, list]:
    """``text`` with ``olds[k]`` (str; found in order, each after the one before) replaced by
    ``news[k]`` -> (pieces, str [2K + 1] joining to the new text; [(start, end) of each
    ``news[k]`` in it]; [start of each ``olds[k]`` in ``text``]). It stops at the first
    ``olds[k]`` not found: fewer starts than ``olds``."""
    pieces, spans, starts, last, pos = [], [], [], 0, 0
    for old, new in zip(olds, news):
        k = text.find(old, last)
        if k < 0:
            break
        pieces += [text[last:k], new]
        pos += k - last
        spans.append((pos, pos + len(new)))
        starts.append(k)
        pos, last = pos + len(new), k + len(old)
    pieces.append(text[last:])
    return pieces, spans, starts


# ---- training ids <-> one pad per block (rollout inputs) ------------------------------------
def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of True in a bool [L] mask."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _block_starts(ids, types, code, blocks, kind, row) -> list[int]:
    """Start index of each block; each run of ``types == code`` must be whole blocks (errors name ``row``)."""
    starts, ends = _runs(types == code)
    out, k = [], 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        pos = s
        while pos < e:  # adjacent blocks with no separator share one run
            if k >= len(blocks):
                raise PlaceholderError(
                    f"{int((types == code).sum())} {kind} tokens but the {kind} grids need "
                    f"{sum(blocks)} in {len(blocks)} block(s) of {blocks}; the text holds {kind} tokens "
                    f"without a grid", row=row, stage="rollout", column="input_ids",
                    expected=f"{sum(blocks)} {kind} tokens", found=f"{int((types == code).sum())} {kind} tokens",
                    fix="re-encode the row",
                )
            n = blocks[k]
            if pos + n > e:
                raise PlaceholderError(
                    f"{kind} block {k} is a run of {e - pos} {kind} token(s) at position {pos} "
                    f"but its grid needs {n}; the tokens were cut (truncation?) or the grids belong "
                    f"to other tokens", row=row, stage="rollout", column="input_ids", expected=f"{n} {kind} tokens",
                    found=f"{e - pos} {kind} tokens", fix="re-encode the row",
                )
            if not (ids[pos:pos + n] == ids[pos]).all():
                raise PlaceholderError(
                    f"{kind} block {k} at position {pos} mixes token ids", row=row, stage="rollout",
                    column="input_ids", expected="one pad id", fix="re-encode the row",
                )
            out.append(pos)
            pos += n
            k += 1
    if k != len(blocks):
        raise PlaceholderError(
            f"the text holds {k} {kind} block(s) but the {kind} grids need {len(blocks)} "
            f"({blocks} tokens); the {kind} data and the text disagree", row=row, stage="rollout",
            column=f"{kind}_grid_thw", expected=f"{len(blocks)} {kind} block(s)", found=f"{k} {kind} block(s)",
            fix="re-encode the row",
        )
    return out


def collapse_placeholders(
    input_ids,
    mm_token_type_ids,
    image_grid_thw,
    video_grid_thw=None,
    *,
    family,
    row: Any = None,
) -> np.ndarray:
    """Training ids -> ids with ONE pad token per vision block (what vLLM expects).

    Args:
        input_ids: int [L], placeholders expanded (``t*h*w/merge^2`` pads per image).
        mm_token_type_ids: int [L], 0 text, 1 image, 2 video.
        image_grid_thw: int [I, 3]; video_grid_thw: int [V, 3] or None.
        family: family name, `ModelFamily` or processor.
        row: named in errors.

    Returns int64 [L - sum(block tokens) + num blocks]. Each image block (its pads, between
    ``<|vision_start|>`` and ``<|vision_end|>``) becomes one ``<|image_pad|>``; each video
    block one ``<|video_pad|>``. Qwen3-VL videos have one block per frame group (timestamp
    text before each), so a video keeps ``t`` single-pad blocks and its timestamps: that
    form is lossless (`expand_placeholders` restores the ids) but it is NOT a vLLM video
    prompt (vLLM wants one ``<|vision_start|><|video_pad|><|vision_end|>`` per video and
    writes the timestamps itself from the video metadata), see `mmpipe.rollout.inputs.to_vllm_prompts`.
    Raises `mmpipe.errors.PlaceholderError` (a ValueError) naming the row when a block's token
    run does not match its grid.
    """
    fam = family_of(family)
    ids = to_numpy(input_ids).astype(np.int64).reshape(-1)
    types = to_numpy(mm_token_type_ids).astype(np.int64).reshape(-1)
    if types.shape != ids.shape:
        raise InputError(f"mm_token_type_ids has shape {types.shape}, input_ids {ids.shape}", row=row,
                         stage="rollout", column="mm_token_type_ids", expected=f"shape {ids.shape}",
                         found=f"shape {types.shape}", fix="pass the row's own mm_token_type_ids")
    keep = np.ones(ids.shape, dtype=bool)
    for (kind, code), grid in zip(KINDS, (image_grid_thw, video_grid_thw)):
        blocks = block_tokens(grid, fam, kind)
        for s, n in zip(_block_starts(ids, types, code, blocks, kind, row), blocks):
            keep[s + 1:s + n] = False
    return ids[keep]


def _pad_ids(family, image_token_id, video_token_id) -> tuple[Optional[int], Optional[int]]:
    """The image / video pad ids: as given, else read from ``family``'s tokenizer (a processor)."""
    if image_token_id is None or video_token_id is None:
        tok = getattr(family, "tokenizer", family)
        if hasattr(tok, "convert_tokens_to_ids"):
            known = family_of(family).vision_token_ids(tok)
            image_token_id = known["image"] if image_token_id is None else image_token_id
            video_token_id = known["video"] if video_token_id is None else video_token_id
    return image_token_id, video_token_id


def expand_placeholders(
    collapsed_ids,
    image_grid_thw,
    video_grid_thw=None,
    *,
    family,
    image_token_id: Optional[int] = None,
    video_token_id: Optional[int] = None,
    row: Any = None,
) -> np.ndarray:
    """Inverse of `collapse_placeholders`: each single pad -> its block's token count.

    ``family``: a processor (the pad ids are read from its tokenizer) or a family name /
    `ModelFamily` together with ``image_token_id`` / ``video_token_id``.
    Returns int64 [L] (training ids).
    """
    fam = family_of(family)
    pad_ids = _pad_ids(family, image_token_id, video_token_id)
    ids = to_numpy(collapsed_ids).astype(np.int64).reshape(-1)
    positions, counts = [], []
    for (kind, _), tok_id, grid in zip(KINDS, pad_ids, (image_grid_thw, video_grid_thw)):
        blocks = block_tokens(grid, fam, kind)
        if not blocks:
            continue
        if tok_id is None:
            raise ArgumentError(
                f"{row_where(row)}: cannot tell the {kind} pad id; pass the processor as family= or "
                f"{kind}_token_id="
            )
        pos = np.flatnonzero(ids == tok_id)
        if len(pos) != len(blocks):
            raise PlaceholderError(
                f"{len(pos)} {kind} pad token(s) in the collapsed ids but the {kind} grids "
                f"need {len(blocks)} (one per block); were the ids already expanded?", row=row,
                stage="rollout", column="input_ids", expected=f"{len(blocks)} {kind} pad token(s)",
                found=f"{len(pos)} {kind} pad token(s)",
                fix="expand only ids from collapse_placeholders",
            )
        positions.append(pos)
        counts += blocks
    at = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
    return repeat_pads(ids, at, np.asarray(counts, dtype=np.int64))[0]


def check_roundtrip(row, *, index: Any = None) -> np.ndarray:
    """Raise AssertionError unless ``expand(collapse(ids)) == ids`` for this row exactly.

    The pad ids are read from the row itself. Returns the collapsed ids int64 [L'].
    """
    r = MultiModalInputs.from_dict(row, row=index)
    ids, types = r.input_ids, r.mm_token_type_ids
    img = int(ids[types == 1][0]) if (types == 1).any() else None
    vid = int(ids[types == 2][0]) if (types == 2).any() else None
    collapsed = collapse_placeholders(ids, types, r.image_grid_thw, r.video_grid_thw, family=r.family, row=index)
    back = expand_placeholders(collapsed, r.image_grid_thw, r.video_grid_thw, family=r.family,
                               image_token_id=img, video_token_id=vid, row=index)
    if back.shape != ids.shape or not np.array_equal(back, ids):
        n = min(len(back), len(ids))
        diff = np.flatnonzero(back[:n] != ids[:n])
        at = int(diff[0]) if len(diff) else n
        raise AssertionError(
            f"{row_where(index)}: expand(collapse(input_ids)) differs from input_ids "
            f"({len(back)} vs {len(ids)} tokens, first difference at {at})"
        )
    return collapsed
