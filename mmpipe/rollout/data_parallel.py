"""Data-parallel padding (rollout stage): pad a batch of prompts to a multiple of the
data-parallel world size with dummy rows, and trim every output back to the real rows.

VRAG-style loops hand each GPU the same number of prompts; the last batch is padded with
shallow copies of its first row (no pixel copy) and the engine's outputs are cut back::

    rows, n_real = pad_to_multiple(rows, world_size)
    gens = trim(engine.generate(rows, params), n_real)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from mmpipe.errors import ArgumentError
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs

__all__ = ["pad_to_multiple", "trim"]


def _dummy(row):
    """A dummy copy of ``row`` that shares its arrays (never mutated: dummies are trimmed)."""
    if isinstance(row, MultiModalInputs):
        return replace(row)  # shallow: shares every array with the real row
    if isinstance(row, dict):
        return dict(row)
    return row


def pad_to_multiple(rows: Sequence, multiple: int) -> tuple[list, int]:
    """Append dummy rows (shallow copies of the first row, sharing its arrays: no pixel
    copy) until ``len`` is a multiple of ``multiple`` (e.g. the data-parallel world size).

    Returns ``(padded_rows, n_real)``; undo on any output with ``trim(outputs, n_real)``.
    """
    if int(multiple) < 1:
        raise ArgumentError(f"multiple must be >= 1 (e.g. the data-parallel world size), got {multiple}")
    rows = list(rows)
    if not rows:
        raise ArgumentError("pad_to_multiple got no rows; it accepts one or more rows (there is nothing to copy as a dummy row)")
    n = len(rows)
    return rows + [_dummy(rows[0]) for _ in range((-n) % int(multiple))], n


def _leading(v) -> Optional[int]:
    """Leading (batch) size of an array / tensor / list; None for scalars and strings."""
    if isinstance(v, (str, bytes)) or v is None:
        return None
    if hasattr(v, "shape"):
        return int(v.shape[0]) if len(v.shape) else None
    if isinstance(v, (list, tuple)):
        return len(v)
    return None


def trim(outputs, n_real: int):
    """Drop the dummy rows that `pad_to_multiple` appended (they are last).

    outputs: a list/tuple (e.g. of `Generation`), a numpy array / torch tensor [P, ...], a
    dict whose sized values all have leading dim P (scalars and strings are kept), or a
    `BatchedMultiModalInputs` (every per-row field, pixel rows by ``patch_offsets``, grids
    by ``image_offsets``; offsets keep their prefix).
    """
    n = int(n_real)
    if isinstance(outputs, BatchedMultiModalInputs):
        return _trim_batch(outputs, n)
    if isinstance(outputs, dict):
        sizes = {k: _leading(v) for k, v in outputs.items()}
        P = {s for s in sizes.values() if s is not None}
        if len(P) > 1:
            raise ArgumentError(
                f"trim: the dict's fields have different leading sizes {sizes}; every array/list field "
                "must have the padded batch as its first dim (move the batch axis first)"
            )
        if P and n > P.pop():
            raise ArgumentError(f"trim: n_real={n} exceeds the padded size {sizes}; n_real must be at most the padded batch size")
        return {k: (v[:n] if sizes[k] is not None else v) for k, v in outputs.items()}
    size = _leading(outputs)
    if size is None:
        raise TypeError(f"trim: cannot trim a {type(outputs).__name__}")
    if n > size:
        raise ArgumentError(f"trim: n_real={n} exceeds the {size} padded rows; n_real must be at most {size} (the padded size)")
    return outputs[:n]


def _trim_batch(b: BatchedMultiModalInputs, n: int) -> BatchedMultiModalInputs:
    """The first ``n`` rows of a batch: per-row fields cut at ``n``, pixel rows and grids at
    the offsets of row ``n``; the pixel format recomputed from the rows kept."""
    B = b.batch_size
    if not 0 < n <= B:
        raise ArgumentError(f"trim: n_real={n} must be in 1..{B} (the batch size)")
    if n == B:
        return b
    io, po = b.image_offsets[: n + 1], b.patch_offsets[: n + 1]
    vo, vpo = b.video_offsets[: n + 1], b.video_patch_offsets[: n + 1]
    ni, npatch, nv, nvp = int(io[-1]), int(po[-1]), int(vo[-1]), int(vpo[-1])
    has_labels = b.row_has_labels[:n] if b.row_has_labels is not None else None
    keep_labels = b.labels is not None and (has_labels is None or bool(has_labels.any()))
    formats = list(b.row_pixel_formats[:n]) if b.row_pixel_formats is not None else None
    pixel_format = b.pixel_format
    if pixel_format != "none" and formats is not None:
        vis = {formats[r] for r in range(n)
               if int(io[r + 1] - io[r]) or int(vo[r + 1] - vo[r])}
        pixel_format = vis.pop() if len(vis) == 1 else ("mixed" if vis else "none")
    cut = lambda v, k: (v[:k] if (v is not None and k) else None)  # noqa: E731
    return replace(
        b,
        input_ids=b.input_ids[:n],
        attention_mask=b.attention_mask[:n],
        mm_token_type_ids=b.mm_token_type_ids[:n],
        position_ids=b.position_ids[:, :n],
        rope_deltas=b.rope_deltas[:n],
        labels=b.labels[:n] if keep_labels else None,
        image_grid_thw=b.image_grid_thw[:ni],
        image_offsets=io,
        patch_offsets=po,
        video_grid_thw=b.video_grid_thw[:nv],
        second_per_grid_ts=b.second_per_grid_ts[:nv],
        video_offsets=vo,
        video_patch_offsets=vpo,
        seq_lengths=b.seq_lengths[:n],
        row_has_labels=has_labels,
        row_pixel_formats=formats,
        row_images_kwargs=b.row_images_kwargs[:n] if b.row_images_kwargs is not None else None,
        row_audio_sources=b.row_audio_sources[:n] if b.row_audio_sources is not None else None,
        row_image_sources=b.row_image_sources[:n] if b.row_image_sources is not None else None,
        pixel_format=pixel_format,
        pixel_values=cut(b.pixel_values, npatch),
        pixel_values_u8=cut(b.pixel_values_u8, npatch),
        pixel_values_videos=cut(b.pixel_values_videos, nvp),
        pixel_values_videos_u8=cut(b.pixel_values_videos_u8, nvp),
    )

