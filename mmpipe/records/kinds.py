"""The kind of family (`mmpipe.families.ModelFamily.kind`) a stored row or record belongs to,
read from its ``family`` column: what the stages that still keep one module per kind use to
pick it (`mmpipe.media` holds what differs)."""

from __future__ import annotations

from typing import Any, Optional

from mmpipe.families import ALL_FAMILIES


def row_kind(row: Any) -> Optional[str]:
    """``"patches"``, ``"tiles"`` or ``"processor"`` for a record or a stored row (dict) whose
    ``family`` names a family; None for anything else (a raw row, an unknown family)."""
    family = getattr(row, "family", None) if not hasattr(row, "get") else row.get("family")
    fam = ALL_FAMILIES.get(family) if isinstance(family, str) else None
    return None if fam is None else fam.kind


def is_tiled_row(row: Any) -> bool:
    """Whether a stored row (dict) or record is a tiles-kind family's."""
    return row_kind(row) == "tiles"


def is_generic_row(row: Any) -> bool:
    """Whether a stored row (dict) or record comes from the generic path (kind ``processor``)."""
    return row_kind(row) == "processor"
