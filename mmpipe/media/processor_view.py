"""The view stage's part of the ``processor`` kind (the generic path), one of its
modules (`mmpipe.media.KINDS`, asked as ``fam.media.<name>``). Such a row holds what the
processor's own call returned: its image tokens are not marked (``mm_token_type_ids`` is all
0: no token spans), its images are known by their sizes (``image_hw``), and its float outputs
are in the processor's own layout, which mmpipe cannot turn back into pictures (the views draw
a labelled box per image). ``mmpipe inspect`` counts the stored output values.
"""

from __future__ import annotations

import json

import numpy as np

PIXEL_UNIT = "output values"  # what the stored pixel data are (head lines, `mmpipe inspect`)
STATS_COLUMNS = ("generic_layout",)  # the columns `table_counts` reads (image_hw when stored)


def view_summary(row) -> list[str]:
    """What a row's head line adds to its image count: the processor class and the shape and
    dtype of each of its vision outputs (``"pixel_values float32 [1, 8, 3, 32, 32]"``)."""
    shapes = [f"{k} {v.dtype} {list(v.shape)}" for k, v in sorted(row.vision.items())]
    return [row.processor_class or "processor outputs", *shapes]


# ---- mmpipe inspect: counts from the stored columns --------------------------------------------
def table_counts(table, families: list[str]) -> dict:
    """``mmpipe inspect``'s counts of one Arrow batch of stored rows (see
    `mmpipe.media.patches_view.table_counts`): images from ``image_hw`` (0 for rows stored
    without it); no tokens per image (not marked); ``units``: the stored vision values;
    ``pixel_bytes``: their bytes; ``float32_bytes``: those of the float outputs as float32."""
    from mmpipe.records.arrow import list_lengths

    names = set(table.column_names)
    images = np.zeros(table.num_rows, np.int64)
    if "image_hw" in names:  # flat (h, w) pairs
        images = list_lengths(table.column("image_hw")) // 2
    units = nbytes = f32 = 0
    layouts = {text for text in table.column("generic_layout").to_pylist() if text}
    vision = {tuple(v[:2]) for text in layouts for v in json.loads(text).get("vision", ())}
    for name, dtype in sorted(vision):
        if name in names:
            n = int(list_lengths(table.column(name)).sum())
            units, nbytes = units + n, nbytes + n * np.dtype(dtype).itemsize
            f32 += n * 4 if np.dtype(dtype).kind == "f" else 0
    videos = 0
    if "video_grid_thw" in names:  # use_audio_in_video rows: [V, 3] per row, stored flat
        videos = int(list_lengths(table.column("video_grid_thw")).sum()) // 3
    return {"images_per_row": np.asarray(images, np.int64),
            "tokens_per_image": np.zeros(0, np.int64),
            "videos": videos, "units": units, "pixel_bytes": nbytes, "float32_bytes": f32}
