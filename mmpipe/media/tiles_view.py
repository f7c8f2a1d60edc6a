"""The view stage's part of the ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision), re-exported
by `mmpipe.media.tiles` under its ``# ---- view ----`` section: where each image's feature tokens
are (runs of ``mm_token_type_ids == 1``), how a span is labelled (the image's size and tiles),
each image's stored tiles as its pictures, and ``mmpipe inspect``'s counts of stored rows.

An image's feature tokens are one run, except that Gemma 3 writes one run per tile (pan-and-scan
crops, each with its own text): those runs make one span per image, text between them included.
Where images touch (LLaVA-OneVision renders ``<image><image>``) the run cannot be cut per image
(the stored columns do not say where one image's tokens end): one span covers them.
Same names as `mmpipe.media.patches_view`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

PIXEL_UNIT = "tiles"  # what the stored pixel rows are (head lines, `mmpipe inspect`)
STATS_COLUMNS = ("mm_token_type_ids", "tiles_per_image")  # the columns `table_counts` reads


def _runs(marked: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of True in ``marked`` bool [L]."""
    edges = np.diff(np.concatenate([[0], marked.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


# ---- token spans and labels ------------------------------------------------------------------
def view_spans(row) -> list[tuple]:
    """The row's image token spans in order, ``(kind, start, end, index, last, part, parts)``:
    one per image (``index == last``), or one over touching images ``index..last``."""
    runs = _runs(np.asarray(row.mm_token_type_ids) == 1)
    tiles, n = np.asarray(row.tiles_per_image), row.num_images
    if len(runs) == int(tiles.sum()) and len(runs) != n:  # a run per tile (Gemma 3): a span per image
        ends = np.cumsum(tiles).tolist()
        groups = [(runs[e - t][0], runs[e - 1][1], k, k)
                  for k, (e, t) in enumerate(zip(ends, tiles.tolist())) if t]
    elif len(runs) == n:
        groups = [(a, b, k, k) for k, (a, b) in enumerate(runs)]
    else:  # touching images: runs in order, the last covering the rest
        groups = [(a, b, k, k if k < len(runs) - 1 else n - 1) for k, (a, b) in enumerate(runs)]
    return [("image", a, b, first, last, 0, 1) for a, b, first, last in groups]


def view_layout(row, kind: str, first: int, last: int) -> str:
    """The layout part of a span label: ``"40×56 px · 2 tiles"`` (height × width as stored in
    ``image_hw``), ``"5 tiles"`` over touching images ``first..last``."""
    n = len(row.tiles_per_image)
    if not 0 <= first <= last < n:
        return "? tiles"
    if last != first:
        return f"{int(row.tiles_per_image[first:last + 1].sum())} tiles"
    h, w = (int(x) for x in row.image_hw[first])
    return f"{h}×{w} px · {int(row.tiles_per_image[first])} tiles"


def view_size(row, kind: str, index: int) -> Optional[tuple[int, int]]:
    """(height, width) of image ``index`` as stored (``image_hw``); None for no such image."""
    return tuple(int(x) for x in row.image_hw[index]) if 0 <= index < row.num_images else None


def view_notes(row, kind: str, index: int) -> list[str]:
    """Facts added after the label (none: the label holds the size and tiles)."""
    return []


def view_summary(row) -> list[str]:
    """What a row's head line adds to its image count: its tiles."""
    return [f"{int(np.asarray(row.tiles_per_image).sum())} tiles"]


# ---- pictures from the stored tiles ------------------------------------------------------------
def view_images(row, source: Any = None) -> tuple[list[Optional[list[np.ndarray]]], bool]:
    """Per image, its stored uint8 tiles [S, S, 3] (resized, cropped, padded: what the processor
    normalises into ``pixel_values``), None without stored tiles (layout-only or
    ``pixels="source"`` rows); always exact. ``source`` is not needed (uint8 storage)."""
    if row.pixel_values_u8 is None:
        return [None] * row.num_images, True
    first = np.concatenate([[0], np.cumsum(row.tiles_per_image)]).astype(int)
    return [list(row.pixel_values_u8[first[k]:first[k + 1]]) for k in range(row.num_images)], True


def view_video_frames(row, source: Any = None) -> list[list[np.ndarray]]:
    """No video frames (the tiles kind stores no videos)."""
    return [[] for _ in range(row.num_videos)]


# ---- mmpipe inspect: counts from the stored columns --------------------------------------------
def _per_image(types: np.ndarray, tiles: np.ndarray) -> list[int]:
    """Feature tokens of each image of one row (types int [L], tiles int [I]); where images
    touch, the row's image tokens split evenly over its images."""
    runs, n = np.asarray([b - a for a, b in _runs(types == 1)], np.int64), len(tiles)
    if n == 0:
        return []
    if len(runs) == n:
        return runs.tolist()
    if len(runs) == int(tiles.sum()):  # a run per tile: group them by image
        ends = np.cumsum(tiles)
        return [int(runs[e - t:e].sum()) for e, t in zip(ends, tiles)]
    total = int(runs.sum())
    return [total // n + (k < total % n) for k in range(n)]


def table_counts(table, families: list[str]) -> dict:
    """``mmpipe inspect``'s counts of one Arrow batch of stored rows (see
    `mmpipe.media.patches_view.table_counts`); ``units``: tiles; ``float32_bytes`` 4 x the stored
    tile bytes, unknown (``float32_unknown`` says why) for rows without tiles: their tile size is
    not stored."""
    import pyarrow.compute as pc

    tiles_rows = [np.asarray(t, np.int64) for t in table.column("tiles_per_image").to_pylist()]
    per_image = []
    for types, tiles in zip(table.column("mm_token_type_ids").to_pylist(), tiles_rows):
        per_image += _per_image(np.asarray(types, np.int64), tiles)
    pixel_bytes = f32 = 0
    unknown = None if not per_image else "the tile size is not stored with these rows"
    if "pixel_values_u8" in table.column_names:
        pixel_bytes = int(pc.sum(pc.list_value_length(table.column("pixel_values_u8"))).as_py() or 0)
        f32, unknown = 4 * pixel_bytes, None
    elif "image_sources" in table.column_names:  # pixels="source": the image files
        files = pc.list_flatten(table.column("image_sources"))
        pixel_bytes = int(pc.sum(pc.binary_length(files)).as_py() or 0)
    return {"images_per_row": np.asarray([len(t) for t in tiles_rows], np.int64),
            "tokens_per_image": np.asarray(per_image, np.int64), "videos": 0,
            "units": int(sum(int(t.sum()) for t in tiles_rows)), "pixel_bytes": pixel_bytes,
            "float32_bytes": f32,
            "float32_unknown": unknown}
