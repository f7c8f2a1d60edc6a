"""The view stage's part of the ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision), one of its
modules (`mmpipe.media.KINDS`, asked as ``fam.media.<name>``): each image's feature tokens (from
its runs of ``mm_token_type_ids == 1``), its stored tiles as its pictures, and ``mmpipe
inspect``'s counts of stored rows (its size and tiles label it through the one typed layout,
`mmpipe.records.media_layout.MediaLayout`).

An image's feature tokens are one run, except that Gemma 3 writes one run per tile (pan-and-scan
crops, each with its own text): those runs make one span per image, text between them included.
Where images touch (LLaVA-OneVision renders ``<image><image>``) the run cannot be cut per image
(the stored columns do not say where one image's tokens end): one span covers them.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

PIXEL_UNIT = "tiles"  # what the stored pixel rows are (head lines, `mmpipe inspect`)
STATS_COLUMNS = ("mm_token_type_ids", "tiles_per_image")  # the columns `table_counts` reads


def _image_tokens(runs: np.ndarray, tiles: np.ndarray) -> Optional[list[int]]:
    """Each image's feature tokens from the lengths of its row's runs (int [R]) and its tiles
    (int [I]): a run per image, or a run per tile summed per image; None where images touch."""
    if len(runs) == len(tiles):
        return runs.tolist()
    if len(runs) == int(tiles.sum()):  # a run per tile: group them by image
        return [int(runs[e - t:e].sum()) for e, t in zip(np.cumsum(tiles), tiles)]
    return None


def view_runs(row, kind: str, runs: list) -> list:
    """The runs (``[start, end)``) of the row's image tokens, Gemma 3's run per tile joined
    into one per image (the text between included); touching images: the view takes a run per
    image, the last one covering the rest."""
    tiles = np.asarray(row.tiles_per_image)
    if len(runs) == int(tiles.sum()) and len(runs) != len(tiles):  # a run per tile: one per image
        ends = np.cumsum(tiles).tolist()
        runs = [(runs[e - t][0], runs[e - 1][1]) for e, t in zip(ends, tiles.tolist()) if t]
    return runs


def view_pictures(row, kind: str, source: Any = None) -> tuple[Optional[list], bool]:
    """Per image, its stored uint8 tiles [S, S, 3] (resized, cropped, padded: what the processor
    normalises into ``pixel_values``; ``pixels="source"`` rows: their files tiled as collate tiles
    them, with ``source``'s image processor), None without them (layout-only rows, source rows
    without a processor; videos); always exact."""
    if kind != "video" and row.image_sources is not None and getattr(source, "image_processor", None) is not None:
        from mmpipe.images.pictures import sourced_pixels
        from mmpipe.images.tiles import effective_image_processor
        from mmpipe.media.tiles_collate import decoded_source_rows

        ip = effective_image_processor(source)
        row = sourced_pixels(row, lambda r: decoded_source_rows([r], ip, r.fam.images())[0])
    if kind == "video" or row.pixel_values_u8 is None:
        return None, True
    first = np.concatenate([[0], np.cumsum(row.tiles_per_image)]).astype(int)
    return [list(row.pixel_values_u8[a:b]) for a, b in zip(first[:-1], first[1:])], True


# ---- mmpipe inspect: counts from the stored columns --------------------------------------------
def table_counts(table, families: list[str]) -> dict:
    """``mmpipe inspect``'s counts of one Arrow batch of stored rows (see
    `mmpipe.media.patches_view.table_counts`); ``tokens_per_image``: where images touch, the
    row's image tokens split evenly over them; ``units``: tiles; ``float32_bytes`` 4 x the stored
    tile bytes, unknown (``float32_unknown`` says why) for rows without tiles: their tile size is
    not stored."""
    from mmpipe.media.tiles import COLUMNS
    from mmpipe.records.codec import stored_pixel_bytes
    from mmpipe.view.spans import marked_runs

    tiles_rows = [np.asarray(t, np.int64) for t in table.column("tiles_per_image").to_pylist()]
    per_image = []
    for types, tiles in zip(table.column("mm_token_type_ids").to_pylist(), tiles_rows):
        runs = np.asarray([b - a for a, b in marked_runs(np.asarray(types, np.int64) == 1)], np.int64)
        total, n = int(runs.sum()), len(tiles)
        per_image += _image_tokens(runs, tiles) or [total // n + (k < total % n) for k in range(n)]
    pixel_bytes = f32 = 0
    unknown = None if not per_image else "the tile size is not stored with these rows"
    if "pixel_values_u8" in table.column_names:  # the declared pixel columns: the uint8 tiles
        pixel_bytes = stored_pixel_bytes(table, COLUMNS)
        f32, unknown = 4 * pixel_bytes, None
    return {"images_per_row": np.asarray([len(t) for t in tiles_rows], np.int64),
            "tokens_per_image": np.asarray(per_image, np.int64), "videos": 0,
            "units": int(sum(int(t.sum()) for t in tiles_rows)), "pixel_bytes": pixel_bytes,
            "float32_bytes": f32, "float32_unknown": unknown}
