"""Validate an encoded dataset against the stored-row schema before training on it.

A dataset written by another mmpipe version, by another tool or by hand may have the right
column names and still be wrong: ``list<int64>`` where the schema says ``list<int32>``, a
``large_list``, float64 pixels, compact pixels as ``list<uint8>`` instead of ``binary``, no
``rope_delta``, two position rows instead of three, pixel bytes that do not match the grids.
`validate_dataset` compares it with `MultiModalInputs.arrow_schema` (the schema
``schemas/multimodal_inputs.json`` is generated from) and checks every row's content, and
returns a `ValidationReport` that says what is off, where (column, row indexes) and how to
fix it::

    report = mmpipe.validate_dataset("/data/encoded")        # a save_to_disk dir, parquet, table, Dataset
    print(report)                                            # one line per problem, with the fix
    ds = mmpipe.load_encoded("/data/encoded")                # load + validate, raise SchemaError if wrong
    ds = mmpipe.load_encoded("/data/encoded", fix=True)      # ... after the safe repairs below

Safe repairs (``fix=True``; each reported as "fixed"): lossless casts to the schema types
(int64 -> int32 when every value fits, large_list -> list, large_binary -> binary, float64
-> float32 when exact), ``list<uint8>`` / ``list<list<uint8>>`` compact pixels -> ``binary``
with the end marker (when the sizes match the grids), a missing ``rope_delta`` recomputed
as ``max(position_ids) + 1 - L``, missing video columns added empty. Anything else (missing
tokens, inconsistent rows) needs a re-encode: the report says so.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmpipe.data.repair import (
    add_empty_column,
    is_u8_list,
    lossless_cast,
    pixel_digests,
    recompute_rope_deltas,
    u8_list_to_binary,
)
from mmpipe.data.report import REENCODE, Issue, SchemaError, ValidationReport  # noqa: F401 (re-exported)
from mmpipe.data.loading import DamagedDatasetError, load_table, table_to_dataset  # noqa: F401 (re-exported)
from mmpipe.data.sources_check import unreadable_sources
from mmpipe.data.validate_generic import is_generic_table, validate_generic
from mmpipe.data.validate_tiled import is_tiled_table, validate_tiled
from mmpipe.errors import InputError
from mmpipe.families import FAMILIES
from mmpipe.records.columns import OPTIONAL_ROW_COLUMNS, STORED_PIXEL_COLUMN, stored_pixel_format
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.arrow import list_lengths, rows_from_arrow

# columns every stored row needs (the reader cannot default them correctly)
REQUIRED = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "rope_delta", "image_grid_thw",
            "family")
# columns older versions / text-only writers may lack; their empty default is right
DEFAULTABLE = ("video_grid_thw", "second_per_grid_ts")
# columns the encoder adds for bookkeeping (encode_dataset / on_error="skip")
BOOKKEEPING = ("mmpipe_error", "mmpipe_drop_reason")


# ---- schema comparison -------------------------------------------------------------------------
def _detect(table: pa.Table) -> tuple[str, bool]:
    return stored_pixel_format(table.column_names), "labels" in table.column_names


def _expected_schema(fmt: str, labels: bool) -> pa.Schema:
    return MultiModalInputs.arrow_schema(None if fmt == "mixed" else fmt, labels)


def _compare_schema(table: pa.Table, report: ValidationReport, fix: bool, features_hint: str) -> pa.Table:
    expected = _expected_schema(report.pixel_format, report.labels)
    names = set(table.column_names)
    for f in expected:
        if f.name in names:
            continue
        if f.name in DEFAULTABLE or f.name.startswith("pixel_values_videos"):
            if fix:
                table = add_empty_column(table, f)
                report.issues.append(Issue("fixed", "missing_column", f.name, "missing; added with empty values (no videos)"))
            else:
                report.issues.append(Issue("warning", "missing_column", f.name,
                                           "missing (an older layout?); read as empty (no videos)",
                                           "validate_dataset(..., fix=True) adds it"))
        elif f.name == "pixel_digest":  # rows written by an mmpipe without digests
            if fix:
                table = table.append_column(f, pixel_digests(table))
                report.issues.append(Issue("fixed", "missing_column", f.name, "missing; computed from the pixel "
                                           "data as stored now (damage already there is not detected)"))
            else:
                report.issues.append(Issue("warning", "missing_column", f.name,
                                           "missing (written by an older mmpipe): damaged pixel bytes cannot be "
                                           "detected", "re-encode, or validate_dataset(..., fix=True) stores "
                                           "digests of the pixel data as it is now"))
        elif f.name == "rope_delta" and "position_ids" in names and "input_ids" in names:
            if fix:
                table = table.append_column(pa.field("rope_delta", pa.int32()), recompute_rope_deltas(table))
                report.issues.append(Issue("fixed", "missing_column", "rope_delta",
                                           "missing; recomputed as max(position_ids) + 1 - L"))
            else:
                report.issues.append(Issue("warning", "missing_column", "rope_delta",
                                           "missing (an older layout?); read as max(position_ids) + 1 - L",
                                           "validate_dataset(..., fix=True) stores it"))
        else:
            report.issues.append(Issue("error", "missing_column", f.name, f"missing ({_doc(f)})", REENCODE))
    for name in table.column_names:
        if name not in expected.names:
            if name in BOOKKEEPING or name in OPTIONAL_ROW_COLUMNS:
                continue
            report.issues.append(Issue("warning", "extra_column", name,
                                       "not a stored-row column; collate ignores it",
                                       f"ds.remove_columns([{name!r}]) if it is not yours"))
    for f in expected:
        if f.name not in table.column_names:
            continue
        col = table.column(f.name)
        if col.type.equals(f.type):
            continue
        found = str(col.type)
        repaired = None
        if f.name.endswith("_u8") and is_u8_list(col.type):
            if fix:
                repaired = u8_list_to_binary(col)
            how = "compact pixels as a list of uint8 (older layout) instead of binary + end marker"
        else:
            repaired = lossless_cast(col, f.type) if fix else None
            how = "wrong Arrow type"
            if not fix and lossless_cast(col, f.type) is None:
                how = "wrong Arrow type, and a cast would change values"
        if repaired is not None:
            table = table.set_column(table.column_names.index(f.name), pa.field(f.name, f.type), repaired)
            report.issues.append(Issue("fixed", "type", f.name, f"{how}: expected {f.type}, found {found}; cast"))
        else:
            report.issues.append(Issue("error", "type", f.name, f"{how}: expected {f.type}, found {found}",
                                       f"{features_hint} or validate_dataset(..., fix=True)"
                                       if "change values" not in how else REENCODE))
    return table


def _doc(f: pa.Field) -> str:
    return (f.metadata or {}).get(b"doc", b"").decode()


# ---- per-row content ---------------------------------------------------------------------------
def _check_rows(table: pa.Table, report: ValidationReport, max_rows_listed: int, chunk: int,
                positions: bool) -> None:
    """Read rows as collate does (checked `rows_from_arrow` + `validate`), chunk by chunk;
    a failing chunk is re-read row by row to find every bad row."""
    if not report.ok and any(i.kind in ("missing_column", "type") for i in report.errors):
        # the reader cannot be trusted on a table whose columns are wrong: report those first
        return
    _check_failed_rows(table, report, max_rows_listed)
    if not _check_families(table, report, max_rows_listed):
        return
    _check_missing_pixels(table, report, max_rows_listed)
    _check_sources(table, report, max_rows_listed, chunk)
    problems: dict[tuple, list] = {}
    for start in range(0, table.num_rows, chunk):
        _check_chunk(table.slice(start, chunk), start, positions, problems)
    for (col, msg), rows in problems.items():
        report.issues.append(Issue("error", "content", col, msg, REENCODE, rows[:max_rows_listed], len(rows)))


def _check_failed_rows(table: pa.Table, report: ValidationReport, max_rows_listed: int) -> None:
    """Rows that failed to encode under ``on_error="skip"`` (stored empty): a warning."""
    if "mmpipe_error" in table.column_names:
        bad = [i for i, x in enumerate(table.column("mmpipe_error").to_pylist()) if x]
        if bad:
            report.issues.append(Issue("warning", "failed_rows", "mmpipe_error",
                                       "rows that failed to encode (on_error='skip'), stored empty",
                                       "mmpipe.drop_failed(ds) (or filter on the column) before training",
                                       bad[:max_rows_listed], len(bad)))


def _check_families(table: pa.Table, report: ValidationReport, max_rows_listed: int) -> bool:
    """Unknown families (an error; False: the rows cannot be read further) and rows of
    several families (an error: token ids and positions differ between families)."""
    fams = table.column("family")
    unknown = pc.invert(pc.is_in(fams, value_set=pa.array(sorted(FAMILIES))))
    unknown = pc.fill_null(unknown, True)
    bad_fam = np.flatnonzero(np.asarray(unknown.to_numpy(zero_copy_only=False)))
    if len(bad_fam):
        vals = sorted({str(v) for v in pc.unique(pc.filter(fams, unknown)).to_pylist()})
        report.issues.append(Issue("error", "family", "family", f"unknown model family {vals}; known: {sorted(FAMILIES)}",
                                   REENCODE, bad_fam[:max_rows_listed].tolist(), len(bad_fam)))
        return False
    counts = pc.value_counts(fams).to_pylist()
    if len(counts) > 1:
        main = max(counts, key=lambda c: c["counts"])["values"]
        other = np.flatnonzero(np.asarray(pc.not_equal(fams, main).to_numpy(zero_copy_only=False)))
        report.issues.append(Issue("error", "family", "family",
                                   f"rows of several model families {sorted(c['values'] for c in counts)} "
                                   f"(most are {main!r}); token ids and positions differ between families",
                                   "re-encode these rows with the training model's processor, or split by family",
                                   other[:max_rows_listed].tolist(), len(other)))
    return True


def _check_chunk(part: pa.Table, start: int, positions: bool, problems: dict[tuple, list]) -> None:
    """Validate the rows of ``part`` (table rows ``start...``) at once; when that fails, row by
    row, adding each bad row to ``problems[(column, message without the row)]``."""
    try:
        rows = rows_from_arrow(part, verify_pixels=True)
        for i, r in enumerate(rows):
            r.validate(start + i)
        if positions:
            _check_positions(rows, start)
        return
    except ValueError:
        pass
    for i in range(part.num_rows):
        try:
            (r,) = rows_from_arrow(part.slice(i, 1), verify_pixels=True)
            r.validate(start + i)
            if positions:
                _check_positions([r], start + i)
        except ValueError as e:
            problems.setdefault(_problem(e), []).append(start + i)


def _check_missing_pixels(table: pa.Table, report: ValidationReport, max_rows_listed: int) -> None:
    """Rows with images but a null pixel value in a dataset that stores pixels: collate
    refuses them next to rows with pixels (and would train blind on them alone)."""
    col = STORED_PIXEL_COLUMN.get(report.pixel_format)
    if col is None:
        return
    n_images = list_lengths(table.column("image_grid_thw"))
    null = np.asarray(table.column(col).is_null().to_numpy(zero_copy_only=False))
    bad = np.flatnonzero(null & (n_images > 0))
    if len(bad):
        report.issues.append(Issue("error", "content", col, "rows hold images but no pixel data (null)", REENCODE,
                                   bad[:max_rows_listed].tolist(), len(bad)))


def _check_sources(table: pa.Table, report: ValidationReport, max_rows_listed: int, chunk: int) -> None:
    """``pixels="source"`` rows: every stored file must open as an image (`unreadable_sources`)."""
    for why, rows in unreadable_sources(table, chunk).items():
        report.issues.append(Issue("error", "content", "image_sources", f"a stored image file does not open: {why}",
                                   "re-encode these rows from the original images (or restore the files from "
                                   "a good copy)", rows[:max_rows_listed], len(rows)))


def _problem(e: ValueError) -> tuple[Optional[str], str]:
    """(column, what is wrong) of a row's error: the issue says where (column, rows) and how
    to fix it itself, so the text is the error's body alone and identical problems group."""
    if isinstance(e, InputError):
        return e.column, e.message_body()
    return None, str(e)  # not raised by the records' checks: kept whole


def _check_positions(rows: list, first: int) -> None:
    from mmpipe.rope import get_rope_index

    for k, r in enumerate(rows):
        if not r.fam.is_vision:
            continue
        pos, delta = get_rope_index(r.input_ids[None], r.mm_token_type_ids[None],
                                    image_grid_thw=r.image_grid_thw if r.num_images else None,
                                    video_grid_thw=r.video_grid_thw if r.num_videos else None,
                                    second_per_grid_ts=r.second_per_grid_ts if r.num_videos else None, family=r.fam)
        if not np.array_equal(pos[:, 0].numpy(), r.position_ids):
            raise InputError("position_ids differ from the M-RoPE rule recomputed from the grids "
                             "(written by another tool or version?)", row=first + k, column="position_ids",
                             stage="validate")
        if int(delta.reshape(-1)[0]) != r.rope_delta:
            raise InputError(f"rope_delta {r.rope_delta} differs from max(position_ids) + 1 - L = "
                             f"{int(delta.reshape(-1)[0])}", row=first + k, column="rope_delta", stage="validate")


# ---- public API --------------------------------------------------------------------------------
def validate_dataset(data, *, fix: bool = False, rows: bool = True, positions: bool = True,
                     max_rows_listed: int = 10, chunk: int = 1024, processor=None,
                     images_kwargs: Optional[dict] = None) -> ValidationReport:
    """Check an encoded dataset against the stored-row schema and its rows' invariants.

    Args:
        data: a ``datasets.Dataset``, a ``save_to_disk`` directory, a ``.parquet`` or Arrow
            IPC file path, or a ``pyarrow.Table`` / ``RecordBatch``.
        fix: apply the safe repairs (module docstring); ``report.data`` is then the repaired
            ``pyarrow.Table`` (or ``datasets.Dataset`` when a Dataset/directory was given).
        rows: check every row's content (shapes, pixel bytes vs grids, image tokens vs
            grids, token types, families); ``positions``: also recompute M-RoPE positions
            (about a millisecond per row; pass False for a quick look at a large dataset).
        max_rows_listed: row indexes listed per issue.
        processor, images_kwargs: tiled-family rows only (Gemma 3, InternVL, LLaVA-OneVision,
            checked by `mmpipe.data.validate_tiled`, which has no repairs): with the processor
            the rows were encoded with, each image's tile and feature-token counts are checked.

    Returns a `ValidationReport` (``report.ok``, ``report.errors``, ``print(report)``). Raises
    `ArgumentError` for a path that does not exist or is not an encoded dataset (a ``.jsonl``
    file, a folder without ``state.json``), and `DamagedDatasetError` (stage "validate") for a
    stored file that cannot be read (truncated, corrupted IPC framing, a listed data file
    missing), naming the file and the rows readable before the damage.
    """
    table, ds = load_table(data)
    if is_tiled_table(table):
        report = validate_tiled(table, processor=processor, images_kwargs=images_kwargs, rows=rows,
                                max_rows_listed=max_rows_listed, chunk=chunk)
        report.data = table if ds is None else ds
        return report
    if is_generic_table(table):  # the generic path's rows (mmpipe.data.validate_generic; no repairs)
        report = validate_generic(table, rows=rows, max_rows_listed=max_rows_listed, chunk=chunk)
        report.data = table if ds is None else ds
        return report
    fmt, labels = _detect(table)
    report = ValidationReport(num_rows=table.num_rows, pixel_format=fmt, labels=labels)
    hint = (f"ds = ds.cast(mmpipe.MultiModalInputs.features({None if fmt == 'mixed' else fmt!r}, labels={labels}))")
    if fmt == "mixed":
        report.issues.append(Issue("warning", "shape", None,
                                   "pixel columns of several formats (pixel_values_u8 / pixel_values / image_sources): "
                                   "rows may mix pixel formats",
                                   "encode with one pixels= setting"))
    table = _compare_schema(table, report, fix, hint)
    if report.fixed:  # columns in schema order (appended ones move into place), extras last
        order = [n for n in _expected_schema(fmt, labels).names if n in table.column_names]
        table = table.select(order + [n for n in table.column_names if n not in order])
    if rows and table.num_rows:
        _check_rows(table, report, max_rows_listed, chunk, positions)
    report.data = table
    if ds is not None:
        report.data = table_to_dataset(table) if report.fixed else ds
    return report


def check_dataset(data, *, fix: bool = False, **kw):
    """`validate_dataset`, raising `SchemaError` (an `mmpipe.errors.InputError`, a
    ValueError) with the whole report when anything is an error; returns the (repaired) data."""
    return validate_dataset(data, fix=fix, **kw).raise_if_errors().data


def load_encoded(path, *, fix: bool = False, **kw):
    """Load an encoded dataset (``save_to_disk`` directory, ``.parquet`` or ``.arrow`` file)
    as a ``datasets.Dataset`` and validate it; raises `SchemaError` naming what is off
    (`DamagedDatasetError` / `ArgumentError` as `validate_dataset` does)."""
    data = check_dataset(path, fix=fix, **kw)
    if isinstance(data, pa.Table):
        data = table_to_dataset(data)
    return data
