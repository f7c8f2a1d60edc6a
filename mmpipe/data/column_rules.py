"""What a stored column must be, as `mmpipe.data.validate_dataset` checks it: one
`ExpectedColumn` per column a kind of rows carries, given by the kind's media strategy
(``fam.media.expected_columns``) and checked by `mmpipe.data.validate_columns.check_columns`.

Every column of the published row schema (`mmpipe.records.columns.ROW_COLUMNS`, i.e.
``schemas/multimodal_inputs.json``, with the kind's own type where ``arrow_type_by_kind`` gives
one) is checked exactly, for every kind: ``list<int32>`` is right, ``list<int64>`` an error that
a lossless cast repairs (``fix=True``). The type an earlier release stored for a column
(`EARLIER_TYPES`: the tiles' ``list<int32>`` ``mm_token_type_ids``) reads the same and is
accepted; ``fix=True`` casts it to today's. A column outside the published schema (the generic
path's own processor outputs, named by its layout) is checked by shape only where a type is
given (`same_shape`: any integer width, ``large_list`` for ``list``, ``large_string`` for
``string``; uint8 pixel bytes stay uint8), and nothing is repaired there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from mmpipe.errors import ArgumentError
from mmpipe.records.columns import KIND_TYPES, ROW_COLUMNS

__all__ = ["EARLIER_TYPES", "IF_MISSING", "ExpectedColumn", "published", "same_shape", "shape_text"]

# what a missing column means (`ExpectedColumn.if_missing`)
IF_MISSING = ("error", "optional", "empty", "digest", "rope_delta")
_STORED = {name: (typ, doc) for name, typ, doc in ROW_COLUMNS}

# (kind, column) -> the Arrow types earlier releases stored it with, which read the same: accepted,
# and cast to today's type by fix=True (the previous release's tiles rows: int32 token types)
EARLIER_TYPES: dict[tuple, tuple] = {("tiles", "mm_token_type_ids"): (pa.list_(pa.int32()),)}


def published(name: str) -> bool:
    """Whether ``name`` is a column of the published row schema (checked exactly for every kind)."""
    return name in _STORED


@dataclass(frozen=True)
class ExpectedColumn:
    """One column that stored rows of a kind carry.

    ``type``: the Arrow type the writer stores (None: any type, not checked). ``strict``: only
    that type is right (``fix=True`` casts when no value changes); else any type of the same
    shape is (`same_shape`). ``if_missing``: ``"error"`` (a re-encode), ``"optional"`` (no
    issue: collate reads the rows without it), or a safe repair of an older layout:
    ``"empty"`` (a video column: read as no videos), ``"digest"`` (``pixel_digest``: damage
    cannot be detected) or ``"rope_delta"`` (recomputed from the positions). ``earlier``: the
    types an earlier release stored it with (strict columns: accepted, cast by ``fix=True``)."""

    name: str
    type: Optional[pa.DataType] = None
    doc: str = ""
    strict: bool = False
    if_missing: str = "error"
    earlier: tuple = ()

    def __post_init__(self) -> None:
        if self.if_missing not in IF_MISSING:
            raise ArgumentError(f"ExpectedColumn {self.name!r}: if_missing={self.if_missing!r}; "
                                f"one of {IF_MISSING}")

    @classmethod
    def stored(cls, name: str, kind: str, **kw) -> "ExpectedColumn":
        """Column ``name`` as rows of family kind ``kind`` store it (`mmpipe.records.columns`:
        its Arrow type and doc; no type for a column outside the row schema)."""
        typ, doc = _STORED.get(name, (None, ""))
        kw.setdefault("earlier", EARLIER_TYPES.get((kind, name), ()))
        return cls(name, KIND_TYPES.get((kind, name), typ), doc, **kw)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def same_shape(found: pa.DataType, want: pa.DataType) -> bool:
    """Whether values of type ``found`` read as ``want``'s do: the same list depth, any integer
    width for integers (uint8 pixel bytes excepted), any float width, any string."""
    if _is_list(want):
        return _is_list(found) and same_shape(found.value_type, want.value_type)
    if pa.types.is_uint8(want):
        return pa.types.is_uint8(found)
    for kind in (pa.types.is_integer, pa.types.is_floating):
        if kind(want):
            return kind(found)
    if pa.types.is_string(want) or pa.types.is_large_string(want):
        return pa.types.is_string(found) or pa.types.is_large_string(found)
    return found.equals(want)


def shape_text(t: pa.DataType) -> str:
    """``t`` as `same_shape` reads it, e.g. ``list<any integer>``."""
    if _is_list(t):
        return f"list<{shape_text(t.value_type)}>"
    if pa.types.is_integer(t) and not pa.types.is_uint8(t):
        return "any integer"
    if pa.types.is_floating(t):
        return "any float"
    return "string" if pa.types.is_string(t) else str(t)
