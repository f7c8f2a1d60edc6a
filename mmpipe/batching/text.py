"""The text part of a padded batch, the same for every kind of family: ids, masks, token types,
positions and labels placed under the padding (`text_fields`), the padded length
(`padded_length`), the pad id (`pad_id`); and the way back, each row's own text fields cut out
of a batch (`text_row_fields`)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.errors import InputError
from mmpipe.records.columns import IGNORE_INDEX, to_numpy


def pad_id(processor, pad_token_id: Optional[int] = None) -> int:
    """``pad_token_id``, else the pad id of ``processor``'s tokenizer (or of the tokenizer
    itself), else 0."""
    if pad_token_id is not None:
        return int(pad_token_id)
    tok = getattr(processor, "tokenizer", processor)
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    return 0 if pad is None else int(pad)


def padded_length(lengths: np.ndarray, pad_to_length: Optional[int], pad_to_multiple_of: Optional[int]) -> int:
    """The padded length L of a batch whose rows have ``lengths`` (int [B]): the longest, or
    ``pad_to_length`` (`InputError` naming the row when a row is longer), rounded up to
    ``pad_to_multiple_of``."""
    L = int(lengths.max()) if len(lengths) else 0
    if pad_to_length is not None:
        if pad_to_length < L:
            row = int(lengths.argmax())
            raise InputError(
                f"row {row} has {L} tokens, more than pad_to_length={pad_to_length}", where="", row=row,
                column="input_ids", stage="collate", expected=f"at most {pad_to_length} tokens", found=f"{L} tokens",
                fix="compute the length from these rows (e.g. DataPacker.policy_compute_max_len)",
            )
        L = pad_to_length
    if pad_to_multiple_of:
        L = -(-L // pad_to_multiple_of) * pad_to_multiple_of
    return L


def pad_sequences(seqs: Sequence[np.ndarray], length: int, fill: int, padding_side: str) -> np.ndarray:
    """int64 [B, length]: each int [n_b] sequence at the start (``padding_side="right"``) or the
    end (``"left"``) of its row, ``fill`` elsewhere."""
    out = np.full((len(seqs), length), fill, np.int64)
    for b, seq in enumerate(seqs):
        n = len(seq)
        out[b, slice(0, n) if padding_side == "right" else slice(length - n, length)] = seq
    return out


def _pad_positions(rows: Sequence, L: int, padding_side: str) -> np.ndarray:
    """int64 [B, L] from 1-D positions [n], or [P, B, L] from [P, n] (M-RoPE: P = 3); pads 0.
    The rows' own positions: they do not depend on the padding."""
    lead = rows[0].position_ids.shape[:-1] if rows else ()
    out = np.zeros((*lead, len(rows), L), np.int64)
    for b, r in enumerate(rows):
        n = len(r)
        out[..., b, slice(0, n) if padding_side == "right" else slice(L - n, L)] = r.position_ids
    return out


def text_fields(rows: Sequence, L: int, pad_token_id: int, padding_side: str) -> dict:
    """Records -> the batch's text fields (numpy; `BatchedMultiModalInputs.as_torch` converts):
    ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` int64 [B, L] (pads: the pad id, 0,
    0), ``position_ids`` int64 [B, L] or [P, B, L] (pads 0), ``rope_deltas`` int64 [B, 1],
    ``seq_lengths`` int64 [B], ``labels`` int64 [B, L] (pads and rows without labels -100) or
    None when no row has labels, ``row_has_labels`` bool [B], and ``sequence``: the rows' other
    int [n] outputs by name (the generic path's, e.g. ``token_type_ids``) int64 [B, L], pads 0."""
    def pad(get, fill):
        return pad_sequences([get(r) for r in rows], L, fill, padding_side)

    has_labels = [r.labels is not None for r in rows]
    return dict(
        input_ids=pad(lambda r: r.input_ids, pad_token_id), attention_mask=pad(lambda r: r.attention_mask, 0),
        mm_token_type_ids=pad(lambda r: r.mm_token_type_ids, 0), position_ids=_pad_positions(rows, L, padding_side),
        rope_deltas=np.asarray([[r.rope_delta] for r in rows], np.int64).reshape(len(rows), 1),
        seq_lengths=np.array([len(r) for r in rows], np.int64),
        labels=pad(lambda r: r.labels if r.labels is not None else np.full(len(r), IGNORE_INDEX), IGNORE_INDEX)
        if any(has_labels) else None, row_has_labels=np.asarray(has_labels, bool),
        sequence={k: pad(lambda r: r.sequence[k], 0) for k in sorted({k for r in rows for k in r.sequence})})


def packed_text(rows: Sequence, L: int) -> tuple[dict, dict]:
    """Records -> the text part of a pack, without a padded [B, L] array (a pack of many short
    rows and one long one would otherwise hold B x the longest row, seven times over):
    ``(meta, flat)``. ``meta``: the fields `text_fields` gives, with the token fields zero-width
    (``input_ids``, ``attention_mask``, ``mm_token_type_ids`` int64 [B, 0], ``position_ids``
    [B, 0] or [P, B, 0], ``labels`` None; ``sequence`` padded to ``L``, as `text_fields` pads it).
    ``flat``: the rows' tokens end to end, T = sum of the row lengths: ``input_ids``,
    ``attention_mask``, ``mm_token_type_ids``, ``text_positions`` (``0..n-1`` per row) int64
    [T], ``position_ids`` int64 [T] or [P, T], ``labels`` int64 [T] (-100 for rows without
    labels) or None when no row has labels."""
    def cat(get, lead=()):
        parts = [np.asarray(get(r)).astype(np.int64, copy=False) for r in rows]
        return np.concatenate(parts, axis=-1) if parts else np.zeros((*lead, 0), np.int64)

    B, has_labels = len(rows), [r.labels is not None for r in rows]
    lead = rows[0].position_ids.shape[:-1] if rows else ()
    none = np.zeros((B, 0), np.int64)
    meta = dict(input_ids=none, attention_mask=none, mm_token_type_ids=none, labels=None,
                position_ids=np.zeros((*lead, B, 0), np.int64),
                rope_deltas=np.asarray([[r.rope_delta] for r in rows], np.int64).reshape(B, 1),
                seq_lengths=np.array([len(r) for r in rows], np.int64), row_has_labels=np.asarray(has_labels, bool),
                sequence={k: pad_sequences([r.sequence[k] for r in rows], L, 0, "right")
                          for k in sorted({k for r in rows for k in r.sequence})})
    flat = dict(input_ids=cat(lambda r: r.input_ids), attention_mask=cat(lambda r: r.attention_mask),
                mm_token_type_ids=cat(lambda r: r.mm_token_type_ids), position_ids=cat(lambda r: r.position_ids, lead),
                text_positions=cat(lambda r: np.arange(len(r))),
                labels=cat(lambda r: r.labels if r.labels is not None else np.full(len(r), IGNORE_INDEX))
                if any(has_labels) else None)
    return meta, flat


def text_row_fields(batch) -> list[dict]:
    """A batch's text fields cut back into each row's own (numpy copies): ``input_ids``,
    ``attention_mask``, ``mm_token_type_ids`` [n], ``position_ids`` [n] or [P, n], ``rope_delta``,
    ``labels`` (only for rows that carried labels) and ``sequence`` (its keys [n])."""
    ids, att, mm = to_numpy(batch.input_ids), to_numpy(batch.attention_mask), to_numpy(batch.mm_token_type_ids)
    pos, deltas = to_numpy(batch.position_ids), to_numpy(batch.rope_deltas)[:, 0].tolist()
    labels = to_numpy(batch.labels) if batch.labels is not None else None
    sequence = {k: to_numpy(v) for k, v in batch.sequence.items()}
    has = to_numpy(batch.row_has_labels).tolist() if batch.row_has_labels is not None else [True] * len(ids)
    L, out = ids.shape[1], []
    for b, n in enumerate(to_numpy(batch.seq_lengths).tolist()):
        cols = slice(0, n) if batch.padding_side == "right" else slice(L - n, L)
        out.append(dict(input_ids=ids[b, cols].copy(), attention_mask=att[b, cols].copy(),
                        mm_token_type_ids=mm[b, cols].copy(), position_ids=pos[..., b, cols].copy(),
                        rope_delta=int(deltas[b]),
                        labels=labels[b, cols].copy() if labels is not None and has[b] else None,
                        sequence={k: v[b, cols].copy() for k, v in sequence.items()}))
    return out
