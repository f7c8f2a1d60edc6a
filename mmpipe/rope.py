"""Vectorised M-RoPE position ids for Qwen vision-language models.

:func:`get_rope_index` computes the 3-row rotary positions (temporal, height, width) that
Qwen2-VL, Qwen2.5-VL and Qwen3-VL expect, for a whole padded batch at once, with array ops
only: there is no Python loop over rows, tokens or vision blocks. It replaces
transformers' ``model.model.get_rope_index`` (Qwen2.5-VL's argument order; same outputs for
images) and is ~40-47x faster on CPU, one thread, for 64 x 2048 and 8 x 16384 batches (bench/),
because transformers walks every row with ``itertools.groupby`` in Python. The work is numpy
on the host (plus torch's cumsum and casts, its fastest kernels here): ~10 passes over the
[B, L] batch, ~2 over the vision tokens, ~20 small ops over the (t, h) rows of the grids,
~0.06 ms fixed overhead per call (so one row costs well under 0.1 ms). About 0.2 ms of a
131k-token batch is the three advance rows written and scanned plus finding the vision tokens,
which no prefix-sum M-RoPE skips (bench/README.md). Non-CPU inputs round-trip through the host.

The rule (original Qwen / vLLM)::

    pos = 0
    for each maximal run of valid tokens of one type, in order:
        text run of n tokens:   positions pos, pos+1, ..., pos+n-1 on all 3 axes; pos += n
        vision block, merged grid (t, h/m, w/m):
            token (i, j, k) -> (pos + T(i), pos + j, pos + k)   (row-major over t, h, w)
            pos = (max position of the block) + 1

where ``T(i) = i`` (Qwen2-VL, images everywhere), ``T(i) = floor(i * tokens_per_second *
second_per_grid_ts)`` for Qwen2.5-VL videos (in float64 as vLLM computes it; float32 as
transformers and verl do with ``video_time="transformers"``), and Qwen3-VL splits every video grid
``(t, h, w)`` into ``t`` grids ``(1, h, w)`` (its frames are separated by timestamp text).

Known divergence: transformers 5.23 advances ``pos += max(h, w) // m`` after a vision block
instead of ``block max + 1``. For images (t == 1) the two are equal. For videos they differ
when the temporal extent exceeds ``max(h, w) / m``; vLLM (the rollout engine) and the
trained checkpoints use ``block max + 1``, which is what this module implements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mmpipe._fork import torch_fork_safe
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.families import DEFAULT_FAMILY, ModelFamily, family_of
from mmpipe.rope_checks import as_batch_2d, as_grid_rows, as_tensor, diagnose_blocks, same_shape, VIDEO_TIME_RULES, video_time_scale

__all__ = ["get_rope_index", "text_positions", "to_verl_positions"]


def text_positions(attention_mask) -> torch.Tensor:
    """Plain 1-D positions of a padded batch.

    attention_mask: [B, L] or [L] (torch or numpy; nonzero = real token).
    Returns int64 [B, L] (torch, on the mask's device): ``0..n-1`` over each row's valid
    tokens in order, 0 at pads (left or right padding, or holes).
    """
    torch_fork_safe()
    mask = as_batch_2d(attention_mask, "attention_mask").ne(0)
    return (mask.cumsum(1) - 1).clamp_(min=0) * mask


def to_verl_positions(position_ids_3, attention_mask) -> torch.Tensor:
    """verl's 4-row position form.

    position_ids_3: int64 [3, B, L] (M-RoPE rows from :func:`get_rope_index`) or [3, L].
    attention_mask: [B, L] or [L].
    Returns int64 [4, B, L] (or [4, L] for [3, L] input): row 0 the plain text positions
    (:func:`text_positions`, used by verl to find packed-sequence boundaries), rows 1-3 the
    M-RoPE rows.
    """
    pos = as_tensor(position_ids_3).to(torch.long)
    squeeze = pos.dim() == 2
    if squeeze:
        pos = pos.unsqueeze(1)
    if pos.dim() != 3 or pos.shape[0] != 3:
        raise ArgumentError(f"position_ids_3 must be [3, B, L] or [3, L], got shape {tuple(pos.shape)}")
    text = text_positions(as_tensor(attention_mask, pos.device))
    if text.shape != pos.shape[1:]:
        raise ArgumentError(f"attention_mask shape {tuple(text.shape)} does not match position ids {tuple(pos.shape)}")
    out = torch.cat([text.unsqueeze(0), pos], dim=0)
    return out[:, 0] if squeeze else out


def get_rope_index(
    input_ids,
    mm_token_type_ids,
    image_grid_thw=None,
    video_grid_thw=None,
    second_per_grid_ts=None,
    attention_mask=None,
    *,
    family: str | ModelFamily = DEFAULT_FAMILY,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    video_time: str = "vllm",
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE position ids and rope deltas of a padded batch, fully vectorised.

    Args:
        input_ids: int [B, L] or [L] (only its shape and device are used).
        mm_token_type_ids: int [B, L] or [L]; 0 text, 1 image, 2 video.
        image_grid_thw: int64 [num_images, 3] patch grids (t, h, w), consumed in order
            across the whole batch (row-major), as the image processor returns them.
        video_grid_thw: int64 [num_videos, 3], likewise.
        second_per_grid_ts: float [num_videos] (Qwen2.5-VL only; default 1.0 each).
        attention_mask: [B, L] or [L]; 0 marks pads (ignored tokens). Default: all valid.
        family: family name or :class:`ModelFamily` (anything :func:`family_of` accepts);
            supplies ``merge_size``, the ``rope`` variant and ``tokens_per_second``.
        spatial_merge_size, tokens_per_second: override the family's values.
        video_time: the float arithmetic of Qwen2.5-VL's video temporal index
            ``floor(i * tokens_per_second * second_per_grid_ts)``: ``"vllm"`` (default; float64,
            what vLLM 0.32, the rollout engine, computes) or ``"transformers"`` (float32, what
            transformers 5.x's ``get_rope_index`` and verl compute). They differ near integers,
            e.g. 25 fps (seconds float32(0.08)): frame group 25 gets 3 in vLLM, 4 in float32.

    Returns:
        position_ids: int64 [3, B, L] (0 at pads), on the input's device.
        deltas: int64 [B, 1], ``max_pos + 1 - n_valid`` per row (0 for rows with no valid
        token). Generated token k of row b sits at ``n_valid_b + delta_b + k``.

    Raises:
        mmpipe.errors.PlaceholderError: a vision block's token count does not match its grid, a
            block has no grid left, or grids are left over (the message names the batch row).
        mmpipe.errors.InputError: a token type is not 0/1/2.
        mmpipe.errors.ArgumentError: wrong shapes, or no ``mm_token_type_ids`` for a
            vision family. All are ``ValueError``.

    Numpy inputs are accepted; the result is always torch.
    """
    torch_fork_safe()
    fam = family_of(family)
    if video_time not in VIDEO_TIME_RULES:
        raise ArgumentError(f"video_time must be one of {VIDEO_TIME_RULES}, got {video_time!r}")
    merge = int(spatial_merge_size if spatial_merge_size is not None else fam.merge_size)
    tps = float(tokens_per_second if tokens_per_second is not None else fam.tokens_per_second)
    ids = as_batch_2d(input_ids, "input_ids")
    device = ids.device
    mask = same_shape(as_batch_2d(attention_mask, "attention_mask", device), "attention_mask", ids)
    if fam.rope == "1d":
        return _text_rope(mask, *ids.shape, device)
    tt = _token_types(mm_token_type_ids, ids, fam)
    table = _grid_table(fam, image_grid_thw, video_grid_thw, second_per_grid_ts, merge, tps, device, video_time)
    return _vision_rope(tt, mask, table, fam, merge, device)


# ---- step 1: inputs -------------------------------------------------------------------
def _text_rope(mask, B: int, L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Text-only family: the 1-D positions on all three rows, deltas 0."""
    pos = text_positions(mask) if mask is not None else torch.arange(L, device=device).expand(B, L)
    return pos.unsqueeze(0).expand(3, B, L).contiguous(), torch.zeros(B, 1, dtype=torch.long, device=device)


def _token_types(mm_token_type_ids, ids: torch.Tensor, fam: ModelFamily) -> torch.Tensor:
    if mm_token_type_ids is None:
        raise ArgumentError(
            f"mm_token_type_ids is required for family {fam.name!r} (0 text, 1 image, 2 video); "
            "the processor returns it. Falling back to 1-D positions would silently train the "
            "model with wrong positions."
        )
    return same_shape(as_batch_2d(mm_token_type_ids, "mm_token_type_ids", ids.device), "mm_token_type_ids", ids)


# ---- step 2: per-grid layout (few rows; no Python loop) ------------------------------
@dataclass
class _GridTable:
    """Every vision block of the batch in grid order (images, then videos), int64 [n] each
    unless said: ``grid`` torch int64 [n, 3] (t, h, w) patches; ``gm`` [n, 3] merged grid
    (LLM tokens along t, h, w); ``rows`` (t, h) rows of ``w/m`` tokens; ``n`` tokens;
    ``adv`` block max - block start + 1; ``start``/``end`` token offsets in grid order;
    ``interval`` float [n] temporal scale (None: integer 1 everywhere)."""

    grid: torch.Tensor
    gm: np.ndarray
    rows: np.ndarray
    n: np.ndarray
    adv: np.ndarray
    start: np.ndarray
    end: np.ndarray
    n_img: int
    interval: np.ndarray | None


def _grid_table(fam, image_grid_thw, video_grid_thw, second_per_grid_ts, merge, tps, device,
                video_time: str = "vllm") -> _GridTable:
    img_grid = as_grid_rows(image_grid_thw, "image_grid_thw", device)
    vid_grid = as_grid_rows(video_grid_thw, "video_grid_thw", device)
    grids, intervals = [], []
    n_img = 0 if img_grid is None else img_grid.shape[0]
    if img_grid is not None:
        grids.append(img_grid)
    if vid_grid is not None:
        if fam.video_frames_are_blocks:
            # Qwen3-VL: every frame group is its own (1, h, w) block (timestamps in between).
            vid_grid = torch.repeat_interleave(vid_grid, vid_grid[:, 0], dim=0)
            vid_grid[:, 0] = 1
        elif fam.rope == "mrope_tps" and vid_grid.shape[0]:
            scale = video_time_scale(second_per_grid_ts, vid_grid.shape[0], tps, video_time, device)
            intervals = [torch.ones(n_img, dtype=scale.dtype, device=device), scale]
        grids.append(vid_grid)
    if grids:
        grid = torch.cat(grids) if len(grids) > 1 else grids[0]
    else:
        grid = torch.zeros(0, 3, dtype=torch.long, device=device)
    # The work runs on the CPU in numpy (plus one torch cumsum): per op it costs a fraction
    # of torch's dispatch, and numpy's elementwise ops and nonzero are faster on CPU.
    # Other devices round-trip through the host.
    interval = torch.cat(intervals).cpu().numpy() if intervals else None
    grid_np = grid.cpu().numpy().astype(np.int64, copy=False)
    gm = grid_np // np.array([1, merge, merge], dtype=np.int64)
    g_rows = gm[:, 0] * gm[:, 1]
    g_n = g_rows * gm[:, 2]
    if interval is None:
        g_adv = gm.max(1) if grid_np.shape[0] else np.zeros(0, np.int64)
    else:
        # (arange(t) * scale).long() in the scale's dtype: float64 as vLLM, float32 as transformers
        g_tmax = ((gm[:, 0] - 1).astype(interval.dtype) * interval).astype(np.int64)
        g_adv = np.maximum(g_tmax + 1, gm[:, 1:].max(1))
    g_end = np.cumsum(g_n)
    return _GridTable(grid, gm, g_rows, g_n, g_adv, g_end - g_n, g_end, n_img, interval)


# ---- step 3: vision tokens in grid order, checked against the grids --------------------
# Cost model: ~10 passes over the [B, L] batch, ~3 over the vision tokens, ~20 over the
# (t, h) rows of the grids, a few dozen small numpy calls. No Python loop anywhere.
def _vision_rope(tt, mask, table: _GridTable, fam, merge, device) -> tuple[torch.Tensor, torch.Tensor]:
    B, L = tt.shape
    N = B * L
    out = torch.empty(3 * N + 1, dtype=torch.long)
    position_ids = out[: 3 * N].view(3, B, L)
    if N == 0:
        return position_ids.to(device), torch.zeros(B, 1, dtype=torch.long, device=device)
    tt, mask, vis, vis_pos = _vision_tokens(tt, mask)
    first = None
    if vis_pos.size or table.n.size:
        vis_pos, first = _grid_order(vis_pos, tt, mask, table, fam, merge)
    mask_np = mask.numpy() if mask is not None else None
    _fill_advances(out, vis, mask_np, vis_pos, table)
    deltas = np.zeros(B, dtype=np.int64)
    if vis_pos.size:
        # delta = max_pos + 1 - n_valid = sum over the row's grids of (advance - tokens)
        np.add.at(deltas, first // L, table.adv - table.n)
    _advances_to_positions(out, position_ids, mask_np)
    deltas_t = torch.from_numpy(deltas.reshape(B, 1))
    if device.type != "cpu":
        return position_ids.to(device), deltas_t.to(device)
    return position_ids, deltas_t


def _vision_tokens(tt, mask):
    """Host copies of the token types and bool mask, the vision-token map bool [B, L] and the
    flat index ``b*L + l`` int64 [n_vis] of every valid vision token, in batch order."""
    tt = tt.cpu()
    # casts to bool through torch (vectorised; ~3x numpy's comparisons here)
    # nonzero type = vision token (types other than 1/2 are caught later); a fresh tensor
    vis_t = tt.bool() if tt.dtype != torch.bool else tt.clone()
    if mask is not None:
        mask = mask.cpu().bool()
        vis_t &= mask
    vis = vis_t.numpy()
    vis_pos = _arange(vis.size)[vis.reshape(-1)]  # ~3x np.flatnonzero
    return tt, mask, vis, vis_pos


def _grid_order(vis_pos, tt, mask, table: _GridTable, fam, merge):
    """Vision tokens reordered into grid order (images first, then videos), and the flat
    index of each grid's first token int64 [n_grids]. Checks that the tokens match the grids
    and leaves the exact verdict to `diagnose_blocks` when a cheap check fails."""
    L = tt.shape[1]
    n_vis, n_grids, n_img, g_n = vis_pos.size, table.n.size, table.n_img, table.n
    mod = np.take(tt.numpy().reshape(-1), vis_pos)
    if n_img > 0 and n_grids > n_img:
        order = np.argsort(mod, kind="stable")
        vis_pos, mod = vis_pos[order], mod[order]
    # The tokens of each grid must be one contiguous stretch of flat positions (they are
    # in increasing order, so first-to-last span == count - 1 suffices); then every run
    # of vision tokens is a whole number of grids. Grid boundaries inside a run are fine:
    # two adjacent blocks of one modality with no text between them form one run, split
    # here by the grid sizes (transformers 5.23 takes one grid per run, so it crashes or
    # misplaces the following grids). Pads inside a grid or a grid running from one row
    # into the next are flagged here and decided exactly by the slow path.
    img_need, vis_need = int(g_n[:n_img].sum()), int(g_n.sum())
    diagnose = lambda: diagnose_blocks(tt, mask, table.grid, torch.from_numpy(g_n), n_img, fam, merge)  # noqa: E731
    if vis_need != n_vis or not _types_match(mod, vis_need - img_need) or (n_grids and int(g_n.min()) <= 0):
        diagnose()
        raise PlaceholderError(  # pragma: no cover
            "mm_token_type_ids and the grids are inconsistent", column="mm_token_type_ids",
            expected=f"{vis_need} vision tokens for the grids", found=f"{n_vis} vision tokens", fix="re-encode the rows")
    last = vis_pos[table.end - 1] if n_grids else table.end
    first = vis_pos[table.start] if n_grids else table.start
    if ((last - first != g_n - 1) | (first // L != last // L)).any():
        # Raises on a real mismatch; returns for pads inside a block (transformers
        # ignores pads, so the block is still whole) or a grid ending a row exactly.
        diagnose()
    return vis_pos, first


def _types_match(mod: np.ndarray, n_video_tokens: int) -> bool:
    """Every vision token's type (nonzero) is 1 or 2, and ``n_video_tokens`` of them are 2."""
    if mod.size and not n_video_tokens and mod.dtype.kind in "iub":  # images only: one reduction
        return int(mod.view(f"u{mod.dtype.itemsize}").max()) == 1  # negatives wrap to huge
    return mod.size == 0 == n_video_tokens or bool(
        mod.size and int(mod.min()) >= 1 and int(mod.max()) <= 2 and int(mod.sum()) - mod.size == n_video_tokens)


# ---- step 4: advances, then positions by one cumsum ------------------------------------
# Each axis a gets its own "advance" d_a[x] = pos_a[x + 1] - pos_a[x] along a row: a valid
# text token 1 on all axes, a vision token 0 on axes t and h and 1 on axis w, corrected at
# the last token of every (grid, t, h) row: there the w index wraps, h steps, t steps at a
# frame end, and at the block end all three jump to start + advance (block max - block
# start + 1). Stored shifted by one token (buf_a[x + 1] = d_a[x]), an inclusive cumsum per
# row is the position; the element a row's shifted buffer spills into the next row (or
# axis) is its first token, zeroed. Measured alternative (issue 18): one 1-D scan copied to
# the three rows, vision tokens rewritten per axis by fancy index: a tie on the bench batches
# (a row copied + its vision tokens rewritten costs what a row's advances + cumsum do).
def _fill_advances(out: torch.Tensor, vis, mask_np, vis_pos, table: _GridTable) -> None:
    """Write the shifted advances of all three axes into ``out`` int64 [3*N + 1]."""
    N = vis.size
    d = out.numpy()
    # bool -> int64 writes through torch (its vectorised casts are ~3x numpy's here)
    text = np.not_equal(mask_np, vis) if mask_np is not None else ~vis  # valid text tokens
    out[1 : 2 * N + 1].view(2, N).copy_(torch.from_numpy(text).view(1, N).expand(2, N))
    if mask_np is not None:
        out[2 * N + 1 :].copy_(torch.from_numpy(mask_np).view(N))
    else:
        out[2 * N + 1 :].fill_(1)
    if vis_pos.size:
        tok, t_rows, a_t, a_h, a_w = _row_corrections(table.gm, table.rows, table.adv, table.interval)
        r_last = vis_pos[tok]  # flat index of the last token of each (grid, t, h) row
        # a valid vision token's base advance is (0, 0, 1); set the row-end advances
        d[1:][r_last if t_rows is None else r_last[t_rows]] = a_t
        d[N + 1 :][r_last] = a_h
        d[2 * N + 1 :][r_last] = a_w


def _advances_to_positions(out: torch.Tensor, position_ids: torch.Tensor, mask_np) -> None:
    """In place: shifted advances -> positions int64 [3, B, L], 0 at pads."""
    _, B, L = position_ids.shape
    d3 = out.numpy()[: 3 * B * L].reshape(3, B, L)
    d3[:, :, 0] = 0  # drop the spilled advance of the previous row / axis
    position_ids.cumsum_(2)
    # pads 0: pads before a row's first valid token already are (they do not advance)
    if mask_np is not None and (mask_np[:, 1:] < mask_np[:, :-1]).any():
        np.copyto(d3, 0, where=~mask_np)


_ARANGE = np.arange(0, dtype=np.int64)
_ARANGE_CACHE_MAX = 1 << 21  # 16 MB


def _arange(n: int) -> np.ndarray:
    """np.arange(n) (int64, read-only), cached up to 2M elements: it is read, never written."""
    global _ARANGE
    if n > _ARANGE.size:
        if n > _ARANGE_CACHE_MAX:
            return np.arange(n, dtype=np.int64)
        a = np.arange(max(n, min(2 * _ARANGE.size, _ARANGE_CACHE_MAX)), dtype=np.int64)
        a.flags.writeable = False
        _ARANGE = a
    return _ARANGE[:n]


def _row_corrections(gm, g_rows, g_adv, interval):
    """Per (grid, t, h) row: index (grid-order vision tokens) of its last token, the advances there
    on axes h, w int64 [n_rows], and on t at rows ``t_rows`` (None: all; elsewhere t's base 0)."""
    g_t, g_h, g_w = gm[:, 0], gm[:, 1], gm[:, 2]
    n_rows = int(g_rows.sum())
    r_w = np.repeat(g_w, g_rows)
    tok = np.cumsum(r_w) - 1  # grids, and rows within a grid, follow each other in grid order
    a_w = 1 - r_w  # w wraps to 0
    a_h = np.ones(n_rows, dtype=np.int64)  # h steps
    row_end = np.cumsum(g_rows)  # one past each grid's last row
    last = row_end - 1
    # block ends (each grid's last row; h and t set after the frame ends): jump to start + advance
    a_w[last] += g_adv
    if not (g_t > 1).any():  # one frame per grid: t steps only at block ends, from T = 0
        a_h[last] = g_adv - (g_h - 1)
        return tok, last, g_adv, a_h, a_w
    a_t = np.zeros(n_rows, dtype=np.int64)
    if interval is None:
        t_last = g_t - 1
    else:  # (arange(t) * interval).long() in the interval's dtype, as the chosen engine
        t_last = ((g_t - 1).astype(interval.dtype) * interval).astype(np.int64)
    # frame ends: h wraps to 0, t steps to the next frame's T
    r_grid = np.repeat(np.arange(gm.shape[0], dtype=np.int64), g_rows)
    q = np.arange(n_rows, dtype=np.int64) - (row_end - g_rows)[r_grid]  # row index in its grid
    r_h = g_h[r_grid]
    r_t = q // r_h
    f = np.flatnonzero(q - r_t * r_h == r_h - 1)
    a_h[f] = 1 - r_h[f]
    if interval is None:
        a_t[f] = 1
    else:
        iv = interval[r_grid[f]]
        ft = r_t[f]
        a_t[f] = ((ft + 1).astype(iv.dtype) * iv).astype(np.int64) - (ft.astype(iv.dtype) * iv).astype(np.int64)
    a_h[last] = g_adv - (g_h - 1)
    a_t[last] = g_adv - t_last
    return tok, None, a_t, a_h, a_w
