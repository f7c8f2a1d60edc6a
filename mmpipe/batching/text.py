"""The text part of a padded batch of 1-D-position rows (the tiles and processor kinds): ids,
masks, token types, ``0..n-1`` positions and labels padded to one length, as the torch fields
of `mmpipe.records.BatchedMultiModalInputs`; and the way back (`text_row_fields`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.records.columns import IGNORE_INDEX, offsets, to_numpy


def pad_sequences(seqs: Sequence[np.ndarray], length: int, fill: int, padding_side: str) -> np.ndarray:
    """int64 [B, length]: each int [n_b] sequence at the start (``padding_side="right"``) or the
    end (``"left"``) of its row, ``fill`` elsewhere."""
    out = np.full((len(seqs), length), fill, np.int64)
    for b, seq in enumerate(seqs):
        n = len(seq)
        out[b, slice(0, n) if padding_side == "right" else slice(length - n, length)] = seq
    return out


def text_fields(rows: Sequence, L: int, pad_token_id: int, padding_side: str) -> dict:
    """Records -> the batch's text fields (numpy, as the 1-D kinds' collates hand them over;
    `BatchedMultiModalInputs.as_torch` converts): ``input_ids``, ``attention_mask``,
    ``mm_token_type_ids`` int64 [B, L] (pads: the pad id, 0, 0), ``position_ids`` [B, L]
    (pads 0), ``rope_deltas`` [B, 1] (zeros), ``seq_lengths`` [B], ``labels`` [B, L] (pads -100)
    or None, ``row_has_labels`` bool [B], and empty video fields."""
    def pad(get, fill):
        return pad_sequences([get(r) for r in rows], L, fill, padding_side)

    lengths = np.array([len(r) for r in rows], np.int64)
    has_labels = [r.labels is not None for r in rows]
    empty3, zeros = np.zeros((0, 3), np.int64), np.zeros(len(rows) + 1, np.int64)
    return dict(
        input_ids=pad(lambda r: r.input_ids, pad_token_id), attention_mask=pad(lambda r: r.attention_mask, 0),
        mm_token_type_ids=pad(lambda r: r.mm_token_type_ids, 0), position_ids=pad(lambda r: r.position_ids, 0),
        rope_deltas=np.zeros((len(rows), 1), np.int64), seq_lengths=lengths,
        labels=pad(lambda r: r.labels if r.labels is not None else np.full(len(r), IGNORE_INDEX), IGNORE_INDEX)
        if any(has_labels) else None, row_has_labels=np.asarray(has_labels, bool),
        image_grid_thw=empty3, video_grid_thw=empty3, second_per_grid_ts=np.zeros(0, np.float32),
        video_offsets=zeros, video_patch_offsets=zeros,
        image_offsets=offsets([r.num_images for r in rows]))


def text_row_fields(batch) -> list[dict]:
    """A batch's text fields cut back into each row's own (numpy): ``input_ids``,
    ``attention_mask``, ``mm_token_type_ids``, ``position_ids`` [n] and ``labels`` (only for
    rows that carried labels)."""
    ids, att, mm = to_numpy(batch.input_ids), to_numpy(batch.attention_mask), to_numpy(batch.mm_token_type_ids)
    labels = to_numpy(batch.labels) if batch.labels is not None else None
    has = to_numpy(batch.row_has_labels).tolist() if batch.row_has_labels is not None else [True] * len(ids)
    L, out = ids.shape[1], []
    for b, n in enumerate(to_numpy(batch.seq_lengths).tolist()):
        cols = slice(0, n) if batch.padding_side == "right" else slice(L - n, L)
        out.append(dict(input_ids=ids[b, cols].copy(), attention_mask=att[b, cols].copy(),
                        mm_token_type_ids=mm[b, cols].copy(), position_ids=np.arange(n, dtype=np.int64),
                        labels=labels[b, cols].copy() if labels is not None and has[b] else None))
    return out
