"""The validate stage's part of the ``patches`` kind (Qwen2/2.5/3-VL, GLM-4.1V, the text family),
one of its modules (`mmpipe.media.KINDS`, asked as ``fam.media.<name>``): the columns of
the published row schema (`mmpipe.records.row.MultiModalInputs.arrow_schema`), exactly typed,
with the safe repairs of older layouts (no video columns, no ``rope_delta``, no
``pixel_digest``), and each row's M-RoPE positions recomputed from its grids.

The same names exist in `mmpipe.media.tiles_validate` and `mmpipe.media.processor`; the
validate stage (`mmpipe.data.validate`) calls them as ``fam.media.<name>``.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from mmpipe.data.column_rules import ExpectedColumn
from mmpipe.records.codec import stored_row_error
from mmpipe.records.columns import ROW_COLUMNS, row_column_wanted

KIND_COLUMN = "image_grid_thw"  # only patch-grid rows store it (names a table without a family)
# columns an older layout lacks, and how they read (`ExpectedColumn.if_missing`)
_OLDER_LAYOUT = {"video_grid_thw": "empty", "second_per_grid_ts": "empty",
                 "pixel_values_videos": "empty", "pixel_values_videos_u8": "empty",
                 "pixel_digest": "digest", "rope_delta": "rope_delta"}


def expected_columns(table: pa.Table, *, labels: bool, pixel_format: str) -> list[ExpectedColumn]:
    """The row schema's columns for ``pixel_format`` (``"mixed"``: every pixel column) and
    ``labels``, exact types (a lossless cast repairs another width)."""
    fmt = None if pixel_format == "mixed" else pixel_format
    return [ExpectedColumn.stored(name, "patches", strict=True,
                                  if_missing=_OLDER_LAYOUT.get(name, "error"))
            for name, _, _ in ROW_COLUMNS if row_column_wanted(name, fmt, labels, "patches")]


def row_checks(table: pa.Table, *, processor=None, images_kwargs: Optional[dict] = None,
               positions: bool = True) -> Optional[Callable]:
    """``check(row, index)``: the row's positions and ``rope_delta`` recomputed from its grids
    (about a millisecond per row; not with ``positions=False``) and, with ``processor``, its image /
    video slots against the processor's pad ids (`patches_collate.check_pad_ids`) and its float32
    pixels against its image settings (`patches_collate.check_normalisation`): rows of another
    tokenizer or normalisation, which collate with this processor refuses; None when nothing is
    checked."""
    checks = [_check_positions] if positions else []
    if processor is not None:
        from mmpipe.families import resolve_family
        from mmpipe.images.spec import VisionSpec
        from mmpipe.media.patches_collate import check_normalisation, check_pad_ids
        from mmpipe.records.vision_tokens import VisionTokens

        # the processor's spec (an ArgumentError for one whose patch / merge sizes are not its family's)
        spec = VisionSpec.from_processor(processor) if resolve_family(processor).is_vision else None
        if spec is not None:
            tokens = VisionTokens.from_processor(processor)
            checks.append(lambda r, row: check_pad_ids([r], tokens, stage="validate", index=row))
        if spec is not None and {"pixel_values", "pixel_values_videos"} & set(table.column_names):
            checks.append(lambda r, row: check_normalisation([r], spec.for_rows([r.image_backend]),
                                                             stage="validate", index=row))
    if len(checks) < 2:
        return checks[0] if checks else None

    def check_all(r, row: int) -> None:
        for check in checks:
            check(r, row)

    return check_all


def _check_positions(r, row: int) -> None:
    """``position_ids`` [3, L] and ``rope_delta`` of row ``r`` vs the family's M-RoPE rule."""
    from mmpipe.media.patches_encode import row_positions

    if not r.fam.is_vision:
        return
    pos, want = row_positions(r.fam, r.input_ids, r.mm_token_type_ids, r.image_grid_thw, r.video_grid_thw,
                              r.second_per_grid_ts)
    if not np.array_equal(pos, r.position_ids):
        raise stored_row_error("position_ids differ from the M-RoPE rule recomputed from the grids "
                               "(written by another tool or version?)", row, "position_ids", fix=None)
    if want != r.rope_delta:
        raise stored_row_error(f"rope_delta {r.rope_delta} differs from max(position_ids) + 1 - L = {want}", row,
                               "rope_delta", fix=None)
