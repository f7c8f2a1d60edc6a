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

import numpy as np

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
    if rows is None or isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise ArgumentError(f"pad_to_multiple takes a list of rows, got {type(rows).__name__}")
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
    # int(2.7) would floor and outputs[:-1] would drop a REAL row: both silent data loss
    if isinstance(n_real, bool) or not isinstance(n_real, (int, np.integer)) or n_real < 1:
        raise ArgumentError(f"trim: n_real must be an int >= 1 (the n_real pad_to_multiple returned), got {n_real!r}")
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


_OFFSETS = ("image_offsets", "patch_offsets", "video_offsets", "video_patch_offsets")
_PIXELS = ("pixel_values", "pixel_values_u8", "pixel_values_videos", "pixel_values_videos_u8")
_PER_ROW = ("input_ids", "attention_mask", "mm_token_type_ids", "rope_deltas", "seq_lengths", "row_has_labels")


def _trim_batch(b: BatchedMultiModalInputs, n: int) -> BatchedMultiModalInputs:
    """The first ``n`` rows of a batch, cut by what its kind declares (``fam.media``): the per-row
    fields and lists at ``n`` (positions on their row axis, after the ``POSITION_ROWS``), each
    media item's layout fields (``MEDIA_ITEMS``) at its offsets of row ``n`` and its per-unit pixel
    fields at its unit offsets, the offsets to their prefix, ``columns`` and the per-row lists
    (``ROW_FIELDS``); the pixel format recomputed from the rows kept. A batch holding outputs
    laid out for the whole batch (a tiled family's float ``pixel_values`` or ``extras``, the
    generic path's processor outputs) is refused (`ArgumentError`): trim its rows before collate."""
    B = b.batch_size
    if not 0 < n <= B:
        raise ArgumentError(f"trim: n_real={n} must be in 1..{B} (the batch size)")
    if n == B:
        return b
    media = b.fam.media
    units = {it.units: [name for name, _ in it.rows] for it in media.MEDIA_ITEMS if it.units is not None}
    if b.pixel_values is not None and "pixel_values" not in units.get("patch_offsets", ["pixel_values"]) and \
            len(b.pixel_values) == int(b.patch_offsets[-1]):  # the model's pixels one per unit (InternVL, Gemma 3 tiles)
        units["patch_offsets"].append("pixel_values")
    per_unit = {name for names in units.values() for name in names}
    whole = [k for k in ("extras", "sequence", "vision") if getattr(b, k)] + \
        [k for k in _PIXELS if getattr(b, k) is not None and k not in per_unit]
    if whole:
        raise ArgumentError(f"trim: this {b.family} batch holds {whole}, laid out by the processor for the whole "
                            "batch, which cannot be cut by row; trim the rows before collating (collate(rows[:n_real], "
                            "processor=...)), or trim the engine's outputs (a list) instead")
    change: dict = {k: getattr(b, k)[:n] for k in _PER_ROW if getattr(b, k) is not None}
    rows_axis = (slice(None),) * len(media.POSITION_ROWS)  # position_ids [*P, B, L]
    change["position_ids"] = b.position_ids[(*rows_axis, slice(0, n))]
    has_labels = change.get("row_has_labels")
    keep_labels = b.labels is not None and (has_labels is None or bool(has_labels.any()))
    change["labels"] = b.labels[:n] if keep_labels else None
    cuts = [(it.offsets, [f[0] for f in it.fields]) for it in media.MEDIA_ITEMS] + list(units.items())
    for offsets, names in cuts:  # each item's layout by its offsets, its pixel units by theirs
        k = int(getattr(b, offsets)[n])
        change.update({name: getattr(b, name)[:k] for name in names if getattr(b, name) is not None})
    change.update({k: getattr(b, k)[: n + 1] for k in _OFFSETS})
    lists = ["row_pixel_formats", *(per_row for _, per_row in media.ROW_FIELDS)]
    change.update({k: getattr(b, k)[:n] for k in lists if getattr(b, k) is not None})
    if b.columns is not None:
        change["columns"] = {k: list(v[:n]) for k, v in b.columns.items()}
    return replace(b, pixel_format=_kept_format(b, n), **change)


def _kept_format(b: BatchedMultiModalInputs, n: int) -> str:
    """The pixel format of the first ``n`` rows (from ``row_pixel_formats``, the rows with media)."""
    formats = b.row_pixel_formats
    if b.pixel_format == "none" or formats is None:
        return b.pixel_format
    io, vo = b.image_offsets, b.video_offsets
    vis = {formats[r] for r in range(n) if int(io[r + 1] - io[r]) or int(vo[r + 1] - vo[r])}
    return vis.pop() if len(vis) == 1 else ("mixed" if vis else "none")
