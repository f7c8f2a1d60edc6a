"""``mmpipe inspect``'s counts for one Arrow batch of a tiled family's stored rows (Gemma 3,
InternVL, LLaVA-OneVision: `mmpipe.records.tiled.MultiModalInputs.to_dict`), from the columns alone.

Tiled rows have no patch grids: an image is ``tiles_per_image`` tiles of ``tile_hw`` (S, S)
pixels, stored as uint8 (``pixel_values_u8``) or not at all (layout-only), and its feature
tokens are a run of ``mm_token_type_ids == 1``. Tokens per image: each run is one image (one
tile for Gemma 3, whose every tile has its own text); where a row's images touch (LLaVA-OneVision
renders ``<image><image>``) the row's image tokens are split evenly over its images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TiledCounts", "tiled_counts"]


@dataclass
class TiledCounts:
    """One batch: ``images_per_row`` int64 [B], ``tokens_per_image`` int64 [I], ``tiles``,
    ``pixel_bytes`` (stored uint8 bytes) and ``float32_bytes`` (what float32 ``pixel_values``
    [N, 3, S, S] would take; 0 for layout-only rows, which do not store S)."""

    images_per_row: np.ndarray
    tokens_per_image: np.ndarray
    tiles: int
    pixel_bytes: int
    float32_bytes: int


def _runs(marked: np.ndarray) -> np.ndarray:
    edges = np.diff(np.concatenate([[0], marked.astype(np.int8), [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def _per_image(types: np.ndarray, tiles: np.ndarray) -> list[int]:
    """Feature tokens of each image of one row (types int [L], tiles int [I])."""
    runs, n = _runs(types == 1), len(tiles)
    if n == 0:
        return []
    if len(runs) == n:
        return runs.tolist()
    if len(runs) == int(tiles.sum()):  # a run per tile: group them by image
        ends = np.cumsum(tiles)
        return [int(runs[e - t:e].sum()) for e, t in zip(ends, tiles)]
    total = int(runs.sum())
    return [total // n + (k < total % n) for k in range(n)]


def tiled_counts(table) -> TiledCounts:
    """`TiledCounts` of one Arrow batch (a ``pyarrow.Table`` of stored tiled rows)."""
    def lists(name):
        return table.column(name).to_pylist()

    tiles_rows = [np.asarray(t, np.int64) for t in lists("tiles_per_image")]
    per_image = []
    for types, tiles in zip(lists("mm_token_type_ids"), tiles_rows):
        per_image += _per_image(np.asarray(types, np.int64), tiles)
    n_tiles = int(sum(int(t.sum()) for t in tiles_rows))
    pixel_bytes = f32 = 0
    if "pixel_values_u8" in table.column_names:
        import pyarrow.compute as pc

        pixel_bytes = int(pc.sum(pc.list_value_length(table.column("pixel_values_u8"))).as_py() or 0)
        f32 = 4 * pixel_bytes
    elif "image_sources" in table.column_names:  # pixels="source": the image files (tile sizes unknown here)
        import pyarrow.compute as pc

        pixel_bytes = int(pc.sum(pc.binary_length(pc.list_flatten(table.column("image_sources")))).as_py() or 0)
    return TiledCounts(images_per_row=np.asarray([len(t) for t in tiles_rows], np.int64),
                       tokens_per_image=np.asarray(per_image, np.int64), tiles=n_tiles, pixel_bytes=pixel_bytes,
                       float32_bytes=f32)
