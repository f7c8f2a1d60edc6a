"""Facts about rows and batches that both the HTML and the text views show (view stage): a
row's head-line facts, a batch's per-row table, and the coercions the views accept. The same
for every family: each item's label and size from the row's items in one typed form
(`mmpipe.records.media_layout.MediaLayout`), what a kind adds (a processor's output shapes) from
its media strategy (``fam.media.view_summary``, `mmpipe.media`).
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, to_numpy
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import media_tokens, token_spans


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


def pixels_phrase(row: MultiModalInputs) -> str:
    """How the row stores its pixels: ``"uint8 patches"``, ``"uint8 tiles"``, ``"float32 output
    values"`` (the generic path), ``"source image files"``, ``"layout-only (no pixels)"``."""
    fmt = row.pixel_format
    if fmt == "none":
        return "layout-only (no pixels)"
    if fmt == "source":
        return "source image files"
    return f"{fmt} {row.fam.media.PIXEL_UNIT}"


def row_facts(row: MultiModalInputs) -> list[str]:
    """The head line's facts: family, token counts by modality, images (what the kind adds:
    tiles, output shapes) and videos, pixel storage, labels, ``rope_delta`` (M-RoPE rows)."""
    mm = np.asarray(row.mm_token_type_ids)
    n_img, n_vid = int((mm == 1).sum()), int((mm == 2).sum())
    lab = "no labels" if row.labels is None else f"{int((np.asarray(row.labels) != IGNORE_INDEX).sum())} trained tokens"
    facts = [row.family]
    if row.fam.is_vision:
        extra = row.media_layout().summary() + row.fam.media.view_summary(row)
        facts += [f"{row.num_tokens} tokens ({row.num_tokens - n_img - n_vid} text, {n_img} image"
                  f"{f', {n_vid} video' if n_vid else ''})",
                  _n(row.num_images, "image") + (f" ({', '.join(extra)})" if extra else "")]
        facts += [_n(row.num_videos, "video")] if row.num_videos else []
        facts.append(pixels_phrase(row))
    else:
        facts.append(f"{row.num_tokens} tokens")
    facts.append(lab)
    if np.ndim(row.position_ids) == 2:  # M-RoPE rows: how far generation positions are shifted
        facts.append(f"rope_delta {row.rope_delta}")
    return facts


def size_notes(row: MultiModalInputs, kind: str, index: int) -> list[str]:
    """Facts that describe lines and captions add after a media item's label: its size
    ``"W×H px"`` where the label does not show it (`MediaLayout.label_shows_size`: the grids)."""
    layout = row.media_layout(kind)
    size = None if layout.label_shows_size else layout.size(index)
    return [] if size is None else [f"{size[1]}×{size[0]} px"]


def row_summary(row: MultiModalInputs, sep: str = " · ") -> str:
    """`row_facts` on one line (``sep`` between them)."""
    return sep.join(row_facts(row))


def batch_table_rows(batch: BatchedMultiModalInputs, rows: Optional[list] = None) -> list[dict]:
    """Per row of a batch: length, padding, images (batch indices via
    ``sample_to_image_indices``), tokens per image (None where unknown), each image's layout
    (``"grid 1×4×6"``, ``"40×56 px · 1 tiles"``, ...), videos and labels. ``rows``: the batch unbatched, if at hand."""
    if rows is None:
        from mmpipe.batching.unbatch import unbatch

        rows = unbatch(batch)
    B, L = batch.input_ids.shape
    lengths = to_numpy(batch.seq_lengths)
    labels = to_numpy(batch.labels) if batch.labels is not None else None
    has = to_numpy(batch.row_has_labels) if batch.row_has_labels is not None else np.full(B, labels is not None)
    att = to_numpy(batch.attention_mask)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    out = []
    owners = zip(rows, batch.sample_to_image_indices, batch.sample_to_video_indices)
    for b, (row, imgs, vids) in enumerate(owners):
        n = int(lengths[b])
        tokens = media_tokens(token_spans(row))
        out.append({
            "row": b,
            "length": n,
            "padding": int(L - n),
            "attended": int(att[b].sum()),
            "images": list(imgs),
            # None: the image has no span of its own (touching tiled images, the generic path)
            "tokens_per_image": [tokens[("image", k)][1] if ("image", k) in tokens else None
                                 for k in range(len(imgs))],
            "layouts": [row.media_layout("image").label(k) for k in range(len(imgs))],
            "videos": list(vids),
            "video_layouts": [row.media_layout("video").label(k) for k in range(len(vids))],
            "has_labels": bool(has[b]),
            "trained_tokens": int((labels[b] != IGNORE_INDEX).sum()) if (labels is not None and has[b]) else 0,
            "pixels": formats[b],
        })
    return out


def count_list(values: list) -> str:
    """Tokens per image as a table cell: ``"6, 8"``, ``"?"`` for an unknown count."""
    return ", ".join("?" if v is None else str(v) for v in values)
