"""The column part of `mmpipe.data.validate.validate_dataset`: a stored table's columns and their
Arrow types against the columns its kind of rows carries (``fam.media.expected_columns``, one
`mmpipe.data.column_rules.ExpectedColumn` each), with the safe repairs of ``fix=True``: a
missing column (error, or a warning and its repair for an older layout), a column no kind
stores (a warning), a column of the wrong Arrow type (strict: a lossless cast repairs it; of
the same shape: any type that reads the same passes). Every kind's columns of the published
row schema are strict (`mmpipe.data.column_rules`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pyarrow as pa

from mmpipe.data.column_rules import ExpectedColumn, published, same_shape, shape_text
from mmpipe.data.repair import (
    add_empty_column, class_ids_to_names, class_label_names, is_u8_list, lossless_cast,
    pixel_digests, recompute_rope_deltas, u8_list_to_binary, u8_values_fit,
)
from mmpipe.data.report import REENCODE, Issue, ValidationReport
from mmpipe.records.columns import OPTIONAL_ROW_COLUMNS

__all__ = ["BOOKKEEPING", "check_columns", "declared_columns"]

# columns the encoder adds for bookkeeping (encode_dataset / on_error="skip"): never "extra"
BOOKKEEPING = ("mmpipe_error", "mmpipe_drop_reason")


class _Repair(NamedTuple):
    """How a column an older layout lacks reads (a warning) and how ``fix=True`` adds it."""

    read_as: str
    fix: str
    fixed: str
    add: Callable[[pa.Table, pa.Field], pa.Table]


_REPAIRS = {  # by `ExpectedColumn.if_missing`
    "empty": _Repair("missing (an older layout?); read as empty (no videos)",
                     "validate_dataset(..., fix=True) adds it",
                     "missing; added with empty values (no videos)", add_empty_column),
    "digest": _Repair("missing (written by an older mmpipe): damaged pixel bytes cannot be "
                      "detected",
                      "re-encode, or validate_dataset(..., fix=True) stores digests of the pixel "
                      "data as it is now",
                      "missing; computed from the pixel data as stored now (damage already there "
                      "is not detected)", lambda t, f: t.append_column(f, pixel_digests(t))),
    "rope_delta": _Repair("missing (an older layout?); read as max(position_ids) + 1 - L",
                          "validate_dataset(..., fix=True) stores it",
                          "missing; recomputed as max(position_ids) + 1 - L",
                          lambda t, f: t.append_column(f, recompute_rope_deltas(t))),
}
_REPAIR_NEEDS = {"rope_delta": {"position_ids", "input_ids"}}  # what a repair is computed from


def declared_columns(table: pa.Table, columns: tuple, kind: str) -> list[ExpectedColumn]:
    """The columns a kind's rows store, as its declarations (``fam.media.COLUMNS``,
    `mmpipe.records.codec.Column`) say: a column of the published row schema with its exact
    Arrow type for the kind (strict: ``fix=True`` repairs another width by a lossless cast, as
    for the patch grids), any other one unchecked. A column is required when its reader needs
    it (``missing="error"``) and, for a column of some pixel formats only (``pixels``), when the
    table stores another column of the same formats (the tiles' ``tile_hw`` with their
    ``pixel_values_u8``); every other declared column is optional, but for a ``pixel_digest`` lost
    next to stored pixels (warned as for the patch grids; ``fix=True`` adds it). A declaration that is a
    function (the processor kind's own outputs) is left to the kind."""
    declared = [c for c in columns if not callable(c)]
    stored = set(table.column_names)

    def required(c) -> bool:
        if c.missing != "error":
            return False
        return not c.pixels or any(o is not c and o.pixels == c.pixels and o.name in stored for o in declared)

    def if_missing(c) -> str:  # a digest lost next to stored pixels: warned (damage undetectable), fix=True adds it
        return "digest" if c.name == "pixel_digest" and stored & {"pixel_values_u8", "image_sources"} else "optional"

    need = [c.name for c in declared if required(c)]
    return [ExpectedColumn.stored(n, kind, strict=published(n)) for n in need] + \
        [ExpectedColumn.stored(c.name, kind, strict=published(c.name), if_missing=if_missing(c))
         for c in declared if c.name not in need]


def check_columns(table: pa.Table, columns: list[ExpectedColumn], report: ValidationReport, *,
                  fix: bool, cast_hint: str) -> pa.Table:
    """Add to ``report`` an `Issue` per missing column, extra column and column of a wrong
    type (``cast_hint``: the fix of a strict column a cast repairs); returns ``table``,
    repaired when ``fix`` (missing columns appended, types cast)."""
    names = set(table.column_names)
    for c in columns:
        if c.name not in names:
            table = _missing(table, c, report, fix, names)
    expected = {c.name for c in columns}
    for name in table.column_names:
        if name not in expected and name not in BOOKKEEPING and name not in OPTIONAL_ROW_COLUMNS:
            report.issues.append(Issue("warning", "extra_column", name,
                                       "not a stored-row column; collate ignores it",
                                       f"ds.remove_columns([{name!r}]) if it is not yours"))
    for c in columns:
        if c.name in table.column_names and _float16(table.column(c.name).type):
            report.issues.append(Issue("error", "type", c.name, f"float values stored as float16 ("
                                       f"{table.column(c.name).type}): rounded from the float32 values encode "
                                       "wrote, so the model gets other values than the processor's; a cast back "
                                       "cannot restore them", REENCODE + _COMPACT))
        elif c.type is not None and c.name in table.column_names:
            table = _check_type(table, c, report, fix, cast_hint)
        if c.if_missing == "digest" and c.name in table.column_names and table.column(c.name).null_count:
            table = _null_digests(table, c.name, report, fix)
    return table


# smaller stored pixels than float32, exactly: what to say instead of a float16 cast
_COMPACT = " (to store less: pixels='uint8' where the family takes it, 1 byte per value, exact)"


def _float16(t: pa.DataType) -> bool:
    """Whether ``t`` (a column's Arrow type) holds float16 values (in lists): never written by
    encode (it stores float32, and a processor's float16 / bfloat16 outputs exactly as float32)."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_float16(t)


def _null_digests(table: pa.Table, name: str, report: ValidationReport, fix: bool, listed: int = 10) -> pa.Table:
    """Rows whose ``pixel_digest`` is null although they store pixel data (a row of another
    dataset concatenated in, a value nulled by an edit): reading them skips the digest check, so
    their damage cannot be detected. A warning naming them (the first ``listed``); ``fix=True``
    stores digests of their pixel data as it is now. Rows without pixel data (null by right) pass."""
    import pyarrow.compute as pc

    nulls = pc.indices_nonzero(pc.is_null(table.column(name))).to_pylist()
    computed = pixel_digests(table.take(nulls)).to_pylist()
    bare = [(i, d) for i, d in zip(nulls, computed) if d is not None]
    if not bare:
        return table
    rows = [i for i, _ in bare]
    if not fix:
        report.issues.append(Issue("warning", "content", name, "null in rows that store pixel data: damaged pixel "
                                   "bytes in them cannot be detected", "re-encode them, or validate_dataset(..., "
                                   "fix=True) stores digests of their pixel data as it is now",
                                   rows=rows[:listed], num_rows=len(rows)))
        return table
    values = table.column(name).to_pylist()
    for i, d in bare:
        values[i] = d
    report.issues.append(Issue("fixed", "content", name, "null in rows that store pixel data; computed from their "
                               "pixel data as stored now (damage already there is not detected)",
                               rows=rows[:listed], num_rows=len(rows)))
    at = table.column_names.index(name)
    return table.set_column(at, table.schema.field(name), pa.array(values, table.schema.field(name).type))


def _missing(table: pa.Table, c: ExpectedColumn, report: ValidationReport, fix: bool,
             names: set) -> pa.Table:
    """A missing column: nothing (optional), its repair (``fix``) or a warning saying how it
    reads (an older layout's), or an error."""
    if c.if_missing == "optional":
        return table
    repair = _REPAIRS.get(c.if_missing)
    if repair is None or not _REPAIR_NEEDS.get(c.if_missing, set()) <= names:
        report.issues.append(Issue("error", "missing_column", c.name, f"missing ({c.doc})",
                                   REENCODE))
    elif fix:
        report.issues.append(Issue("fixed", "missing_column", c.name, repair.fixed))
        table = repair.add(table, pa.field(c.name, c.type))
    else:
        report.issues.append(Issue("warning", "missing_column", c.name, repair.read_as, repair.fix))
    return table


def _check_type(table: pa.Table, c: ExpectedColumn, report: ValidationReport, fix: bool,
                cast_hint: str) -> pa.Table:
    """Column ``c``'s Arrow type: of the same shape (not strict), or exactly (strict, cast
    when ``fix`` and no value changes)."""
    col = table.column(c.name)
    found = str(col.type)
    if not c.strict:
        if not same_shape(col.type, c.type):
            report.issues.append(Issue("error", "type", c.name, f"wrong Arrow type: expected "
                                       f"{shape_text(c.type)}, found {found}", REENCODE))
        return table
    if col.type.equals(c.type):
        return table
    if pa.types.is_string(c.type) and pa.types.is_integer(col.type):
        return _class_ids(table, c, report, fix)
    earlier = any(col.type.equals(t) for t in c.earlier)
    if earlier and not fix:
        return table  # an earlier release's type: reads the same (fix=True casts it to today's)
    if pa.types.is_binary(c.type) and c.name.endswith("_u8") and is_u8_list(col.type):
        how = "compact pixels as a list of uint8 (older layout) instead of binary + end marker"
        fits = u8_values_fit(col)  # a value outside 0..255 is no pixel byte: nothing to convert losslessly
        how += "" if fits else ", and a cast would change values (values outside 0..255)"
        repaired = u8_list_to_binary(col) if fix and fits else None
    else:
        cast = lossless_cast(col, c.type)
        how = ("an earlier release's Arrow type" if earlier else "wrong Arrow type") + \
            ("" if cast is not None else ", and a cast would change values")
        repaired = cast if fix else None
    if repaired is not None:
        report.issues.append(Issue("fixed", "type", c.name,
                                   f"{how}: expected {c.type}, found {found}; cast"))
        at = table.column_names.index(c.name)
        return table.set_column(at, pa.field(c.name, c.type), repaired)
    cast_fix = f"{cast_hint} or validate_dataset(..., fix=True)"
    report.issues.append(Issue("error", "type", c.name, f"{how}: expected {c.type}, found {found}",
                               REENCODE if "change values" in how else cast_fix))
    return table


def _class_ids(table: pa.Table, c: ExpectedColumn, report: ValidationReport, fix: bool) -> pa.Table:
    """A name column (``family``) holding integer class ids (a ``datasets`` ClassLabel): a cast
    would store the ids as text ("0"), so only the ClassLabel's own names (schema metadata,
    `class_label_names`) repair it, with ``fix``; the table's stale metadata is then dropped."""
    names = class_label_names(table.schema, c.name)
    repaired = class_ids_to_names(table.column(c.name), names) if names is not None else None
    how = (f"integer class ids instead of names (a datasets ClassLabel: class_encode_column, "
           f"stratify_by_column?): expected {c.type}, found {table.column(c.name).type}")
    if repaired is not None and fix:
        report.issues.append(Issue("fixed", "type", c.name, f"{how}; mapped back to the ClassLabel's names {names}"))
        at = table.column_names.index(c.name)
        return table.set_column(at, pa.field(c.name, c.type), repaired).replace_schema_metadata(None)
    if repaired is not None:
        fix_text = "validate_dataset(..., fix=True) maps them back to the ClassLabel's names (a cast stores '0')"
    else:
        how += "; the ClassLabel's names are not stored with it"
        fix_text = (f"map the ids back to the names they were made from (ds.map(lambda r: {{{c.name!r}: "
                    f"names[r[{c.name!r}]]}})), or {REENCODE}; a cast would store the ids as text ('0')")
    report.issues.append(Issue("error", "type", c.name, how, fix_text))
    return table
