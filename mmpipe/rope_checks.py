"""Positions stage, input side: normalising the arrays `mmpipe.rope.get_rope_index` takes,
and the slow exact diagnosis of token runs vs grids it runs when its cheap checks fail.

Bad arguments (wrong shapes, a missing ``mm_token_type_ids``) raise
`mmpipe.errors.ArgumentError`; a batch whose vision tokens disagree with its grids raises
`mmpipe.errors.PlaceholderError` (stage ``"template"``) naming the batch row, and token
types other than 0/1/2 an `mmpipe.errors.InputError` naming the row.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from mmpipe.errors import ArgumentError, InputError, PlaceholderError
from mmpipe.families import ModelFamily

__all__ = ["as_tensor", "as_batch_2d", "as_grid_rows", "same_shape", "diagnose_blocks", "VIDEO_TIME_RULES",
           "video_time_scale"]

_ARTICLE = {"image": "an image", "video": "a video"}


def as_tensor(x, device=None) -> torch.Tensor | None:
    """torch / numpy / nested lists -> a torch tensor (numpy shares memory), moved to
    ``device`` when given; None stays None."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):  # read-only arrays (Arrow-backed rows): copied, never written through
        t = torch.from_numpy(np.ascontiguousarray(x) if x.flags.writeable else np.array(x))
    else:
        t = torch.as_tensor(x)
    if device is not None and t.device != device:
        t = t.to(device)
    return t


def as_batch_2d(x, name: str, device=None) -> torch.Tensor | None:
    """A per-token array [B, L] or [L] -> tensor [B, L] (None stays None); ArgumentError for
    any other rank."""
    t = as_tensor(x, device)
    if t is None:
        return None
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2:
        raise ArgumentError(f"{name} must be [B, L] or [L], got shape {tuple(t.shape)}")
    return t


def as_grid_rows(x, name: str, device) -> torch.Tensor | None:
    """Grids int [num, 3] (or one [3] row) -> int64 tensor [num, 3]; ArgumentError otherwise."""
    t = as_tensor(x, device)
    if t is None:
        return None
    t = t.to(torch.long)
    if t.dim() == 1 and t.numel() == 3:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[1] != 3:
        raise ArgumentError(f"{name} must be int [num, 3] (t, h, w rows), got shape {tuple(t.shape)}")
    return t


def same_shape(t: torch.Tensor | None, name: str, ids: torch.Tensor) -> torch.Tensor | None:
    """``t`` when it is None or shaped like ``input_ids``; ArgumentError otherwise."""
    if t is not None and t.shape != ids.shape:
        raise ArgumentError(f"{name} shape {tuple(t.shape)} != input_ids shape {tuple(ids.shape)}")
    return t


# The Qwen2.5-VL video temporal index T(i) = floor(i * tokens_per_second * second_per_grid_ts)
# in each engine's float arithmetic (they disagree near integers: at 25 fps, second_per_grid_ts
# = float32(2/25), frame group 25 gets 3 in float64 and 4 in float32).
VIDEO_TIME_RULES = ("vllm", "transformers")


def video_time_scale(second_per_grid_ts, n_videos: int, tps: float, rule: str, device) -> torch.Tensor:
    """``tokens_per_second * second_per_grid_ts`` per video, float [n_videos], in the
    arithmetic of ``rule``: ``"vllm"`` (vLLM 0.32 ``get_mrope_input_positions``: the stored
    float32 seconds read as a Python float, times ``tokens_per_second``, and ``i * scale``
    all in float64) or ``"transformers"`` (transformers 5.x ``get_rope_index``, and verl which
    calls it: ``tokens_per_second * seconds`` and ``i * scale`` in the seconds' dtype,
    float32 as processors return them; on transformers 4.x too: 4.57's rule casts the seconds to int64
    first, 0.667 -> 0, a bug not copied, `mmpipe.rollout.tf4_positions`). Default seconds: 1.0 each. bfloat16 seconds (a bf16 cast
    of the processor's, e.g. DeepSpeed's of every float input) under ``"transformers"``: an
    `ArgumentError` (numpy, which computes the positions, has no bfloat16 arithmetic)."""
    if rule not in VIDEO_TIME_RULES:
        raise ArgumentError(f"video_time must be one of {VIDEO_TIME_RULES}, got {rule!r}")
    if second_per_grid_ts is None:
        sec = torch.ones(n_videos, dtype=torch.float32, device=device)
    else:
        sec = as_tensor(second_per_grid_ts, device).reshape(-1)
        if not sec.is_floating_point():
            sec = sec.to(torch.float32)
    if rule == "transformers" and sec.dtype == torch.bfloat16:
        raise ArgumentError("second_per_grid_ts is bfloat16: video_time='transformers' computes the video temporal "
                            "index in the seconds' dtype, which numpy cannot do in bfloat16; pass the processor's "
                            "float32 second_per_grid_ts (a bf16 cast of them also moves transformers' own positions "
                            "of long videos), or video_time='vllm'")
    if sec.numel() != n_videos:
        raise ArgumentError(
            f"second_per_grid_ts has {sec.numel()} values but video_grid_thw has "
            f"{n_videos} rows; pass one value per video"
        )
    if rule == "vllm":  # vLLM holds the processor's float32 tensor, then works in Python floats
        return sec.to(torch.float32).to(torch.float64) * float(tps)
    return tps * sec


def _modalities(fam: ModelFamily) -> dict[int, tuple[str, str, str]]:
    """token type -> (name, grid argument, placeholder token)."""
    return {1: ("image", "image_grid_thw", fam.image_token), 2: ("video", "video_grid_thw", fam.video_token)}


def _check_token_types(tt: torch.Tensor, mask: torch.Tensor | None) -> None:
    """InputError naming the first row with a valid token whose type is not 0, 1 or 2."""
    valid = tt[mask] if mask is not None else tt.reshape(-1)
    bad_types = sorted({v for v in valid.tolist() if v not in (0, 1, 2)})
    if not bad_types:
        return
    bad = ~((tt == 0) | (tt == 1) | (tt == 2))
    if mask is not None:
        bad &= mask.bool()
    row = int(bad.any(1).nonzero()[0, 0])
    raise InputError(
        "mm_token_type_ids must be 0 (text), 1 (image) or 2 (video)", row=row, column="mm_token_type_ids",
        stage="template", found=bad_types, fix="rebuild the row's mm_token_type_ids with the processor",
    )


def _check_grids_have_tokens(grid: list, g_n: list, n_img_grids: int, merge: int) -> None:
    for gi, n in enumerate(g_n):
        if n <= 0:
            arg = "image_grid_thw" if gi < n_img_grids else "video_grid_thw"
            raise PlaceholderError(
                f"{arg} row {gi if gi < n_img_grids else gi - n_img_grids} = {grid[gi]} has no tokens "
                f"at spatial_merge_size {merge}", column=arg, expected=f"a grid of at least {merge * merge} patches",
                found=str(grid[gi]), fix="drop that grid and its pixels",
            )


def diagnose_blocks(tt, mask, grid, g_n, n_img_grids: int, fam: ModelFamily, merge: int) -> None:
    """Slow exact check of token runs against grids, run only when a cheap vectorised check
    flagged the batch: walk the rows in Python (as transformers does) and raise naming the
    first inconsistency, or return when there is none (e.g. pads inside a block).

    tt: int [B, L] token types; mask: bool [B, L] or None; grid: int64 [n_grids, 3] (images
    then videos, Qwen3-VL videos already split into frame groups); g_n: int64 [n_grids] LLM
    tokens per grid.
    """
    tt = tt.cpu()
    mask = mask.cpu() if mask is not None else None
    g_n = g_n.tolist()
    grid = grid.tolist()
    _check_token_types(tt, mask)
    _check_grids_have_tokens(grid, g_n, n_img_grids, merge)
    modality = _modalities(fam)
    frames_note = " (Qwen3-VL counts each video frame group as one grid)" if fam.video_frames_are_blocks else ""
    nxt = {1: 0, 2: 0}  # per modality: index of the next unused grid
    first = {1: 0, 2: n_img_grids}
    count = {1: n_img_grids, 2: len(g_n) - n_img_grids}
    last_row = {1: None, 2: None}
    for b in range(tt.shape[0]):
        types = tt[b][mask[b]].tolist() if mask is not None else tt[b].tolist()
        i = 0
        for key, grp in itertools.groupby(types):
            n_run = len(list(grp))
            start = i
            i += n_run
            if key == 0:
                continue
            last_row[key] = b
            used = _take_grids(b, key, start, n_run, nxt, first, count, g_n, modality[key], frames_note)
            left = n_run - sum(g_n[first[key] + k] for k in used)
            if left != 0:
                _raise_run_mismatch(b, start, n_run, left, used, first[key], grid, merge, modality[key], frames_note)
    for key in (1, 2):
        if nxt[key] != count[key]:
            _raise_left_over(key, nxt[key], count[key], last_row[key], tt.shape[0], modality[key], frames_note)
    return None  # consistent (e.g. pads inside a block): the fast path's result stands


def _take_grids(b, key, start, n_run, nxt, first, count, g_n, modality, frames_note) -> list[int]:
    """Consume grids of modality ``key`` until they cover a run of ``n_run`` tokens (or run
    out); returns the grid indices used. Raises when the run gets no grid at all."""
    name, arg, pad = modality
    left, used = n_run, []
    while left > 0:
        k = nxt[key]
        if k >= count[key] and used:
            break  # reported by the caller as a mismatch with the grids it did get
        if k >= count[key]:
            raise PlaceholderError(
                f"{name} block at valid token {start} ({n_run} tokens) has no "
                f"{arg} row left: {arg} has {count[key]} rows{frames_note} but the batch holds more "
                f"{name} blocks", row=b, column=arg, expected=f"a {arg} row for this {name} block",
                found=f"{count[key]} rows, all used", fix=f"pass one grid per {name}, in batch order, and drop the "
                f"{pad} tokens of {name}s whose pixels were dropped",
            )
        nxt[key] += 1
        used.append(k)
        left -= g_n[first[key] + k]
    return used


def _raise_run_mismatch(b, start, n_run, left, used, first, grid, merge, modality, frames_note) -> None:
    name, arg, pad = modality
    expected = n_run - left
    shown = ", ".join(f"{arg}[{k}]={grid[first + k]}" for k in used)
    more = f" and {arg} has no more rows" if left > 0 else ""
    raise PlaceholderError(
        f"{name} block at valid token {start} has {n_run} {pad} tokens but its "
        f"grid(s) {shown} expect {expected} tokens (t*h*w/{merge}**2){more}{frames_note}. The token "
        f"run does not match the grid: was the sequence truncated inside {_ARTICLE[name]}, or "
        f"were placeholders expanded for other {name}s?", row=b, column=arg,
        expected=f"{expected} {pad} tokens", found=f"{n_run} {pad} tokens", fix="re-expand the placeholders from these grids or drop the sample",
    )


def _raise_left_over(key, used, count, last_row, n_rows, modality, frames_note) -> None:
    name, arg, pad = modality
    where = f"after row {last_row}" if last_row is not None else "in any row"
    raise PlaceholderError(
        f"{arg} has {count} rows{frames_note} but the batch's {pad} tokens cover only "
        f"{used}: grids {used}..{count - 1} are left over, no {name} block uses "
        f"them (none {where} of {n_rows}; their tokens were truncated or never inserted)", column=arg,
        expected=f"{count} {name} block(s), one per row", found=f"{used} {name} block(s)", fix="drop those grids and their pixels, or keep their tokens",
    )
