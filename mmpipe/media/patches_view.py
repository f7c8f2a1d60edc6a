"""The view stage's part of the ``patches`` kind (Qwen2/2.5/3-VL, GLM-4.1V, the text family),
one of its modules (`mmpipe.media.KINDS`, asked as ``fam.media.<name>``): each image's and
video's pictures rebuilt from the stored patches, and ``mmpipe inspect``'s counts of stored rows
read from their Arrow columns. Each item's token count, size and label come from its grid through
the one typed layout (`mmpipe.records.media_layout.MediaLayout`); the view stage (`mmpipe.view`)
and `mmpipe.cli.inspect` do the rest the same way for every kind.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

PIXEL_UNIT = "patches"  # what the stored pixel rows are (head lines, `mmpipe inspect`)
STATS_COLUMNS = ("mm_token_type_ids", "image_grid_thw")  # the columns `table_counts` reads


def view_pictures(row, kind: str, source: Any = None) -> tuple[Optional[list], bool]:
    """Per image (video) of ``kind``, its pictures rebuilt from the stored patches
    (`mmpipe.images.pictures`): the resized image uint8 [h*p, w*p, 3], or a video's first frame
    of each temporal patch group (``pixels="source"`` rows: their files decoded with ``source``'s
    sizes); None without pixels; and whether they are exact
    (float32 rows read with other constants than ``source``'s are undone approximately).
    ``source``: a `VisionSpec` or processor (default: the family's constants)."""
    from mmpipe.encoding.sources import with_pixels
    from mmpipe.images.pictures import grid_pictures, patches_u8, sourced_pixels, spec_for

    spec, video = spec_for(row.fam, source), kind == "video"
    if not video and row.image_sources is not None:  # pixels="source": the files, decoded as collate does
        row = sourced_pixels(row, lambda r: with_pixels(r, spec))
    if video:
        patches, exact = patches_u8(row.pixel_values_videos_u8, row.pixel_values_videos, spec, video=True)
    else:
        patches, exact = patches_u8(row.pixel_values_u8, row.pixel_values, spec, video=False)
    if patches is None:
        return None, exact
    return grid_pictures(patches, row.media_layout(kind).grid_thw.tolist(), spec, video=video), exact


# ---- mmpipe inspect: counts from the stored columns --------------------------------------------
def table_counts(table, families: list[str]) -> dict:
    """``mmpipe inspect``'s counts of one Arrow batch of stored rows (``families``: each row's
    ``family``): ``images_per_row`` int64 [B], ``tokens_per_image`` int64 [I], ``videos``,
    ``units`` (image patches), ``pixel_bytes`` (stored, besides source files: the declared pixel
    columns, `mmpipe.records.codec.stored_pixel_bytes`) and
    ``float32_bytes`` (what float32 ``pixel_values`` and ``pixel_values_videos`` would take)."""
    from mmpipe.families import get_family
    from mmpipe.media.patches import COLUMNS
    from mmpipe.records.arrow import list_items
    from mmpipe.records.codec import stored_pixel_bytes

    def col(name):
        return table.column(name).combine_chunks()

    names = set(table.column_names)
    counts, row_of_image, grids = list_items(col("image_grid_thw"), 3)
    per_image = np.zeros(len(grids), np.int64)
    image_family = np.asarray(families, dtype=object)[row_of_image]
    for name in set(families):  # each family's own token rule, over its rows' images at once
        sel = image_family == name
        per_image[sel] = get_family(name).tokens_per_grid(grids[sel])
    prod = grids.prod(axis=1)
    row_patches = np.bincount(row_of_image, weights=prod, minlength=len(counts)).astype(np.int64)
    videos = 0
    if "video_grid_thw" in names:
        v_counts, row_of_video, v_grids = list_items(col("video_grid_thw"), 3)
        videos = int(v_counts.sum())
        row_patches += np.bincount(row_of_video, weights=v_grids.prod(axis=1),
                                   minlength=len(v_counts)).astype(np.int64)
    patch_dim = np.asarray([get_family(f).patch_dim for f in families], dtype=np.int64)
    return {"images_per_row": counts, "tokens_per_image": per_image, "videos": videos,
            "units": int(prod.sum()), "pixel_bytes": stored_pixel_bytes(table, COLUMNS),
            "float32_bytes": int((row_patches * patch_dim * 4).sum())}
