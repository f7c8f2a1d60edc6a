"""Facts about rows and batches that both the HTML and the text views show (view stage): a
row's one-line summary, a batch's per-row table, and the coercions the views accept.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import to_numpy


def as_row(row: Union[MultiModalInputs, dict]) -> MultiModalInputs:
    """A `MultiModalInputs`, or a stored row dict read as one (`MultiModalInputs.from_dict`)."""
    if isinstance(row, MultiModalInputs):
        return row
    if isinstance(row, dict):
        return MultiModalInputs.from_dict(row)
    raise TypeError(f"expected a MultiModalInputs (or a stored row dict), found {type(row).__name__}")



def _n(n: int, word: str) -> str:
    """``"1 image"``, ``"2 images"``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def row_summary(row: MultiModalInputs) -> str:
    """One line: family, token counts by modality, images/videos, pixel storage, labels, rope_delta."""
    mm = np.asarray(row.mm_token_type_ids)
    n_img, n_vid = int((mm == 1).sum()), int((mm == 2).sum())
    lab = "no labels" if row.labels is None else f"{int((np.asarray(row.labels) != IGNORE_INDEX).sum())} trained tokens"
    if not row.fam.is_vision:
        return f"{row.family} · {row.num_tokens} tokens · {lab} · rope_delta {row.rope_delta}"
    vids = f", {_n(row.num_videos, 'video')}" if row.num_videos else ""
    return (f"{row.family} · {row.num_tokens} tokens ({row.num_tokens - n_img - n_vid} text, {n_img} image"
            f"{f', {n_vid} video' if n_vid else ''}) · {_n(row.num_images, 'image')}{vids} · pixels {row.pixel_format} · "
            f"{lab} · rope_delta {row.rope_delta}")


def batch_table_rows(batch: BatchedMultiModalInputs) -> list[dict]:
    """Per row of a batch: length, padding, images (batch indices via
    ``sample_to_image_indices``), tokens per image, grids, videos and labels."""
    B, L = batch.input_ids.shape
    lengths = to_numpy(batch.seq_lengths)
    grids = to_numpy(batch.image_grid_thw).reshape(-1, 3)
    vgrids = to_numpy(batch.video_grid_thw).reshape(-1, 3)
    tokens = batch.fam.tokens_per_grid(grids)  # int64 [I]
    labels = to_numpy(batch.labels) if batch.labels is not None else None
    has = to_numpy(batch.row_has_labels) if batch.row_has_labels is not None else np.full(B, labels is not None)
    att = to_numpy(batch.attention_mask)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    out = []
    for b, (imgs, vids) in enumerate(zip(batch.sample_to_image_indices, batch.sample_to_video_indices)):
        n = int(lengths[b])
        out.append({
            "row": b,
            "length": n,
            "padding": int(L - n),
            "attended": int(att[b].sum()),
            "images": list(imgs),
            "tokens_per_image": [int(tokens[i]) for i in imgs],
            "grids": [tuple(int(x) for x in grids[i]) for i in imgs],
            "videos": list(vids),
            "video_grids": [tuple(int(x) for x in vgrids[i]) for i in vids],
            "has_labels": bool(has[b]),
            "trained_tokens": int((labels[b] != IGNORE_INDEX).sum()) if (labels is not None and has[b]) else 0,
            "pixels": formats[b],
        })
    return out


def grid_str(g: Sequence[int]) -> str:
    """A (t, h, w) grid as ``"t×h×w"``."""
    return "×".join(str(x) for x in g)
