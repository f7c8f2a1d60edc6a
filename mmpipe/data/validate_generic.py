"""Validate a stored dataset of the generic path (rows of a processor mmpipe has no family
table for: `mmpipe.records.generic.MultiModalInputs.to_dict`); `mmpipe.validate_dataset` comes
here by itself when the rows' ``family`` is ``"generic"``::

    report = mmpipe.validate_dataset("/data/encoded_idefics3")

Checked (each problem an `Issue` naming the column and the rows):

- the columns a generic row needs (``input_ids``, ``attention_mask``, ``family``,
  ``generic_layout``, ``generic_shapes``) and their Arrow types (integer lists for the
  sequences, a string layout);
- one processor per dataset: every row's ``generic_layout`` names the same processor class and
  outputs (collate reads a batch with one layout);
- each row read as collate reads it (`rows_from_arrow`): each vision key's flat values
  fill its stored shape, the sequence keys and labels are as long as ``input_ids``.

Not checkable here: the image-token counts against the pixels (only the processor's own model
knows its rule) and damaged pixel values (generic rows carry no digest: the processor's float
outputs are stored as they are).
"""

from __future__ import annotations

import pyarrow as pa

from mmpipe.data.report import REENCODE, Issue, ValidationReport
from mmpipe.errors import InputError
from mmpipe.families import GENERIC_FAMILY
from mmpipe.media.processor import LAYOUT_COLUMN, ProcessorLayout, SHAPES_COLUMN
from mmpipe.records.arrow import rows_from_arrow

__all__ = ["is_generic_table", "validate_generic"]

_REQUIRED = ("input_ids", "attention_mask", "family", LAYOUT_COLUMN, SHAPES_COLUMN)


def is_generic_table(table: pa.Table) -> bool:
    """Whether a stored table holds generic-path rows (a ``generic_layout`` column, or its first
    non-null ``family`` is ``"generic"``)."""
    if LAYOUT_COLUMN in table.column_names:
        return True
    if "family" not in table.column_names or table.num_rows == 0:
        return False
    fams = table.column("family").drop_null()
    return len(fams) > 0 and str(fams[0]) == GENERIC_FAMILY


def _is_int_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)


def _schema_issues(table: pa.Table) -> list[Issue]:
    out = [Issue("error", "missing_column", n, "missing (a generic-path row's column)", REENCODE)
           for n in _REQUIRED if n not in table.column_names]
    names = set(table.column_names)
    for n in ("input_ids", "attention_mask", "labels"):
        if n in names and not _is_int_list(table.column(n).type):
            out.append(Issue("error", "type", n, f"wrong Arrow type {table.column(n).type} (a list of integers)",
                             REENCODE))
    for n in ("family", LAYOUT_COLUMN):
        if n in names and not pa.types.is_string(table.column(n).type) and not pa.types.is_large_string(
                table.column(n).type):
            out.append(Issue("error", "type", n, f"wrong Arrow type {table.column(n).type} (a string)", REENCODE))
    return out


def _layout_issues(table: pa.Table) -> list[Issue]:
    fams = table.column("family").to_pylist()
    other = [i for i, f in enumerate(fams) if f != GENERIC_FAMILY]
    out = []
    if other:
        out.append(Issue("error", "family", "family", f"rows of family {fams[other[0]]!r} among generic-path rows",
                         "encode every row with one processor, or split the dataset by family", other[:10],
                         len(other)))
    texts = table.column(LAYOUT_COLUMN).to_pylist()
    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    if len(first) > 1:
        classes = sorted({ProcessorLayout.from_json(t, i).processor_class for t, i in first.items()})
        rows = sorted(first.values())[1:]
        out.append(Issue("error", "content", LAYOUT_COLUMN,
                         f"rows encoded by {len(first)} different processor layouts ({', '.join(classes)}): a batch "
                         "is collated with one layout", "encode every row with one processor, or split the dataset",
                         rows[:10], len(rows)))
    return out


def _row_issues(table: pa.Table, chunk: int, max_rows_listed: int) -> list[Issue]:
    problems: dict[tuple, list] = {}
    for start in range(0, table.num_rows, chunk):
        part = table.slice(start, chunk)
        try:
            rows_from_arrow(part)
            continue
        except (InputError, ValueError):
            pass
        for i in range(part.num_rows):  # the chunk holds a bad row: find each
            try:
                rows_from_arrow(part.slice(i, 1))
            except InputError as e:
                problems.setdefault((e.column, e.message_body()), []).append(start + i)
            except ValueError as e:
                problems.setdefault((None, str(e)), []).append(start + i)
    return [Issue("error", "content", col, msg, REENCODE, bad[:max_rows_listed], len(bad))
            for (col, msg), bad in problems.items()]


def validate_generic(table: pa.Table, *, rows: bool = True, max_rows_listed: int = 10,
                     chunk: int = 1024) -> ValidationReport:
    """`ValidationReport` of a table of generic-path rows (module doc); ``report.data`` is ``table``."""
    vision = table.num_rows and LAYOUT_COLUMN in table.column_names and \
        ProcessorLayout.from_json(table.column(LAYOUT_COLUMN)[0].as_py(), 0).vision
    report = ValidationReport(num_rows=table.num_rows, pixel_format="float32" if vision else "none",
                              labels="labels" in table.column_names)
    report.data = table
    report.issues += _schema_issues(table)
    if not report.ok or not table.num_rows:
        return report
    report.issues += _layout_issues(table)
    if rows and report.ok:
        report.issues += _row_issues(table, chunk, max_rows_listed)
    return report
