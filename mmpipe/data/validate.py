"""Validate an encoded dataset of any family against its stored-row columns before training on it.

A dataset written by another mmpipe version, by another tool or by hand may have the right
column names and still be wrong: ``list<int64>`` where the schema says ``list<int32>``, a
``large_list``, float64 pixels, compact pixels as ``list<uint8>`` instead of ``binary``, no
``rope_delta``, two position rows instead of three, pixel bytes that do not match the grids,
feature tokens that do not match the tiles, rows of two processors. `validate_dataset` checks
it, and returns a `ValidationReport` that says what is off, where (column, row indexes) and how
to fix it::

    report = mmpipe.validate_dataset("/data/encoded")    # save_to_disk dir, parquet, table, Dataset
    print(report)                                        # one line per problem, with the fix
    ds = mmpipe.load_encoded("/data/encoded")            # load + validate, SchemaError if wrong
    ds = mmpipe.load_encoded("/data/encoded", fix=True)  # ... after the safe repairs below

One path for every family: the rows' family (`dataset_family`) picks its media strategy
(``fam.media``, `mmpipe.media`), which says only what differs per kind: the columns its rows
carry (``expected_columns``: the published row schema's columns, `MultiModalInputs.arrow_schema`
for the kind, exactly typed for every kind; the generic path's own processor outputs, which
the schema does not list, by shape), its dataset-level checks
(``dataset_checks``: one processor layout per generic-path dataset) and its check of a read row
(``row_checks``: M-RoPE positions; tile feature tokens, exact counts with ``processor=``). The
rest is done once here: columns and types (`mmpipe.data.validate_columns`), then one family per
dataset and every row read as collate reads it, pixel digests verified
(`mmpipe.data.validate_rows`).

Safe repairs (``fix=True``; each reported as "fixed"): lossless casts to the schema types, for
every kind (int64 -> int32 when every value fits, large_list -> list, large_string -> string,
large_binary -> binary, float64 -> float32 when exact, a column holding no value at all such as
pandas' ``list<null>`` -> its typed empty lists), patch-grid rows' ``list<uint8>`` /
``list<list<uint8>>`` compact pixels ->
``binary`` with the end marker (when the sizes match the grids), a missing ``rope_delta``
recomputed as ``max(position_ids) + 1 - L``, missing video columns added empty. Anything else
(missing tokens, inconsistent rows) needs a re-encode: the report says so.
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

# re-exported: mmpipe.data.validate was the home of the report types and the loaders
from mmpipe.data.loading import DamagedDatasetError, load_table, table_to_dataset  # noqa: F401
from mmpipe.data.object_store import open_table
from mmpipe.data.report import REENCODE, Issue, SchemaError, ValidationReport  # noqa: F401
from mmpipe.data.validate_columns import BOOKKEEPING, check_columns  # noqa: F401
from mmpipe.data.validate_rows import (
    failed_rows, family_issues, images_without_tokens, listed, missing_pixels, row_issues,
    token_value_issues, unreadable_files, untrained_rows,
)
from mmpipe.errors import ArgumentError
from mmpipe.families import (
    ALL_FAMILIES, DEFAULT_FAMILY, ModelFamily, get_family, resolve_family,
)
from mmpipe.records.columns import STORED_PIXEL_COLUMN, stored_pixel_format



# ---- which kind of rows --------------------------------------------------------------------
def dataset_family(table: pa.Table) -> ModelFamily:
    """The family whose media strategy checks ``table``: its first row's (the first non-null
    ``family``); a table without one (no rows, no ``family`` column, an unknown name) by the
    column only one kind stores (``fam.media.KIND_COLUMN``), else the patch-grid families'
    (whose checks then report the missing or unknown family)."""
    if "family" in table.column_names and table.num_rows:
        fams = table.column("family").drop_null()
        if len(fams) and str(fams[0]) in ALL_FAMILIES:
            return get_family(str(fams[0]))
    for fam in ALL_FAMILIES.values():
        if fam.media.KIND_COLUMN in table.column_names:
            return fam
    return get_family(DEFAULT_FAMILY)


# ---- the checks after the columns ----------------------------------------------------------
def _processor_issues(fam: ModelFamily, processor) -> list[Issue]:
    """The processor passed for exact checks must be the one of the rows' family."""
    if _processor_accepts(processor, fam.name):
        return []
    return [Issue("error", "family", "family", f"rows of {fam.name} but the processor is "
                  f"{type(processor).__name__}", "pass the processor the rows were encoded with")]


def _dataset_issues(table: pa.Table, fam: ModelFamily, processor) -> tuple[list[Issue], bool]:
    """Checks of the whole dataset, no row read: failed rows, one family of the kind, the
    processor, the kind's own (``fam.media.dataset_checks``); and whether the rows can be
    checked further (not after an unknown family, a wrong processor, several layouts)."""
    known = sorted(n for n, f in ALL_FAMILIES.items() if f.media is fam.media)
    issues, readable = family_issues(table, known)
    if not readable:
        return failed_rows(table) + issues, False
    more = _processor_issues(fam, processor) if processor is not None else []
    more += fam.media.dataset_checks(table, processor)
    issues += token_value_issues(table, _vocab_size(processor)) + untrained_rows(table)
    return failed_rows(table) + issues + more, not any(i.severity == "error" for i in more)


def _vocab_size(processor) -> Optional[int]:
    """``len(tokenizer)`` of the processor (its tokenizer, or itself); None without one."""
    tok = getattr(processor, "tokenizer", processor)
    try:
        return len(tok) if tok is not None and hasattr(tok, "convert_tokens_to_ids") else None
    except TypeError:
        return None


def _row_level_issues(table: pa.Table, fam: ModelFamily, pixel_format: str, *, processor,
                      images_kwargs: Optional[dict], positions: bool, chunk: int) -> list[Issue]:
    """Checks reading rows: images without pixels, unreadable source files, every row read as
    collate reads it and given to its family's row check (``fam.media.row_checks``,
    `_row_check`); where the kind has nothing to check (no row marks an image token, so the tiles
    kind cannot tell its feature token), rows with images but no image token at all."""
    check = _row_check(table, fam, processor=processor, images_kwargs=images_kwargs, positions=positions)
    no_pixels = missing_pixels(table, pixel_format, fam.media.IMAGE_LAYOUT_COLUMN)
    if check is None:
        no_pixels += images_without_tokens(table, fam.media.IMAGE_LAYOUT_COLUMN)
    reported = frozenset(r for i in no_pixels for r in i.rows)
    return no_pixels + unreadable_files(table, chunk) + row_issues(table, check, chunk, reported)


def _row_check(table: pa.Table, fam: ModelFamily, *, processor, images_kwargs: Optional[dict],
               positions: bool):
    """The kind's row check (``fam.media.row_checks``) for the rows' family; where the rows are
    of several families of the kind (already an error, `family_issues`), one check per family,
    built from that family's rows alone and given the processor only where it is that family's,
    so each row is checked against its own family's tokens (a table-wide token would blame the
    right rows)."""
    names = sorted(str(n) for n in pc.unique(table.column("family").drop_null()).to_pylist()
                   if str(n) in ALL_FAMILIES) if "family" in table.column_names else []
    if len(names) < 2:
        return fam.media.row_checks(table, processor=processor, images_kwargs=images_kwargs, positions=positions)
    checks = {}
    for name in names:
        own = processor is not None and _processor_accepts(processor, name)
        rows = table.filter(pc.equal(table.column("family"), name))
        checks[name] = get_family(name).media.row_checks(rows, processor=processor if own else None,
                                                          images_kwargs=images_kwargs if own else None,
                                                          positions=positions)

    def check(r, i: int) -> None:
        one = checks.get(r.family)
        if one is not None:
            one(r, i)

    return check


def _processor_accepts(processor, name: str) -> bool:
    try:
        return resolve_family(processor).accepts(name)
    except (TypeError, ArgumentError):  # not a processor at all
        return False


def _cast_hint(table: pa.Table, fam: ModelFamily, fmt: Optional[str], labels: bool) -> str:
    """How to cast a table's columns to the stored types: ``ds.cast(features)`` where the row
    schema of the rows' kind lists every column (a cast needs them all), else the repair."""
    from mmpipe.records.row import MultiModalInputs

    listed = set(MultiModalInputs.arrow_schema(fmt, labels, fam.kind).names)
    if not set(table.column_names) <= listed:  # the generic path's own outputs, extra columns
        return "mmpipe.load_encoded(path, fix=True)"
    return f"ds = ds.cast(mmpipe.MultiModalInputs.features({fmt!r}, labels={labels}, kind={fam.kind!r}))"


def expected_columns(table: pa.Table, fam: ModelFamily, *, labels: bool, pixel_format: str) -> list:
    """The columns ``table``'s rows must carry (``fam.media.expected_columns``). A ``"mixed"``
    table (``concatenate_datasets`` of encodes with different ``pixels=``: each row reads its
    own format, and collate takes the mix) needs the columns of each format it stores, not
    those of every format: a float32 ``pixel_values`` column no row was written with is not
    missing."""
    if pixel_format != "mixed":
        return fam.media.expected_columns(table, labels=labels, pixel_format=pixel_format)
    out: dict = {}
    for fmt, col in STORED_PIXEL_COLUMN.items():
        if col in table.column_names:
            for c in fam.media.expected_columns(table, labels=labels, pixel_format=fmt):
                out.setdefault(c.name, c)
    return list(out.values())


# a column only an encode that stored pixels writes, next to its image pixel column
_PIXEL_SIBLINGS = (("pixel_values_videos_u8", "uint8"), ("pixel_values_videos", "float32"), ("pixel_digest", None))


def _lost_pixel_format(table: pa.Table, report: ValidationReport, fam) -> str:
    """The pixel format of a table that has no image pixel column (it reads as layout-only,
    ``"none"``) but keeps a column of an encode that stored pixels: the image pixel column was
    lost (``remove_columns``, ``select_columns``, a column subset written to parquet), and every
    row with images would be refused by collate. Returns that encode's format where a sibling
    column says it (``"uint8"``: ``pixel_values_videos_u8``; ``"float32"``: ``pixel_values_videos``),
    whose missing image column the column check then reports as an error; with only a
    ``pixel_digest`` left, adds the error here. ``"none"`` when nothing was lost. Only the siblings
    the family's kind declares count (``fam.media.COLUMNS``: a generic-path row's
    ``pixel_values_videos`` is its processor's own output, not a sibling)."""
    names = set(table.column_names)
    declared = {getattr(c, "name", None) for c in fam.media.COLUMNS}
    for column, fmt in _PIXEL_SIBLINGS:
        if column not in names or column not in declared:
            continue
        if fmt is not None:
            return fmt
        report.issues.append(Issue(
            "error", "missing_column", "pixel_values_u8 / pixel_values / image_sources",
            "missing: the table keeps pixel_digest, written only by an encode that stored pixels, but no image "
            "pixel column; its rows read as layout-only (pixels='none') and collate refuses those with images",
            "restore the column from the encoded dataset (remove_columns / select_columns or a column subset "
            "written to parquet dropped it), or re-encode"))
        return "none"
    return "none"


def _no_rows(table: pa.Table) -> list[Issue]:
    """A warning for a table without rows (a filter or select that kept none): it passes every
    check and yields no batch."""
    return [] if table.num_rows else [Issue("warning", "shape", None, "the dataset has no rows: training on it "
                                            "yields no batch", "check the filter / select before it (did it keep none?)")]


# ---- public API ----------------------------------------------------------------------------
def validate_dataset(data, *, fix: bool = False, rows: bool = True, positions: bool = True,
                     max_rows_listed: int = 10, chunk: int = 1024, processor=None,
                     images_kwargs: Optional[dict] = None, storage_options: Optional[dict] = None) -> ValidationReport:
    """Check an encoded dataset of any family against its stored columns and its rows' invariants.

    Args:
        data: a ``datasets.Dataset``, a ``save_to_disk`` directory, a ``.parquet`` or Arrow
            IPC file path, a folder or glob of ``.parquet`` shards (what ``write_shards`` writes),
            an object-store URL of those (``s3://bucket/folder``, any fsspec protocol:
            `mmpipe.data.object_store`), or a ``pyarrow.Table`` / ``RecordBatch``.
        storage_options: for a URL, the fsspec options (endpoint, credentials; default: the
            environment's, e.g. ``AWS_ENDPOINT_URL``).
        fix: apply the safe repairs (module docstring); ``report.data`` is then the repaired
            ``pyarrow.Table`` (or ``datasets.Dataset`` when a Dataset/directory was given).
        rows: check the rows (one family and one processor layout per dataset, each row's
            shapes, pixel bytes vs grids or tiles and their digests, image tokens vs grids or
            tiles, token types); False: the columns and their types only. ``positions``: also
            recompute M-RoPE positions (patch grids; about a millisecond per row; pass False
            for a quick look at a large dataset).
        max_rows_listed: row indexes listed per issue.
        processor: the processor the rows were encoded with (its family must be the rows');
            for tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision) each image's tile and
            feature-token counts are then checked, under ``images_kwargs`` (the encoder's,
            e.g. ``{"do_pan_and_scan": True}``).

    Returns a `ValidationReport` (``report.ok``, ``report.errors``, ``print(report)``). Raises
    `ArgumentError` for a path that does not exist or is not an encoded dataset (a ``.jsonl``
    file, a folder without ``state.json``), and `DamagedDatasetError` (stage "validate") for a
    stored file that cannot be read (truncated, corrupted IPC framing, a listed data file
    missing), naming the file and the rows readable before the damage.
    """
    table, ds = open_table(data, storage_options)  # a local path, a Dataset or table, or an s3:// (any fsspec) URL
    fam = dataset_family(table)
    fmt, labels = stored_pixel_format(table.column_names), "labels" in table.column_names
    report = ValidationReport(num_rows=table.num_rows, pixel_format=fmt, labels=labels, issues=_no_rows(table))
    if fmt == "mixed":
        report.issues.append(Issue("warning", "shape", None, "pixel columns of several formats "
                                   "(pixel_values_u8 / pixel_values / image_sources): rows may mix "
                                   "pixel formats", "encode with one pixels= setting"))
    if fmt == "none":
        fmt = _lost_pixel_format(table, report, fam)
    columns = expected_columns(table, fam, labels=labels, pixel_format=fmt)
    hint = _cast_hint(table, fam, None if fmt == "mixed" else fmt, labels)
    table = check_columns(table, columns, report, fix=fix, cast_hint=hint)
    if report.fixed:  # columns in schema order (appended ones move into place), extras last
        order = [c.name for c in columns if c.name in table.column_names]
        table = table.select(order + [n for n in table.column_names if n not in order])
    # the rows cannot be read on a table whose columns are wrong: those are reported first
    if rows and table.num_rows and report.ok:
        issues, readable = _dataset_issues(table, fam, processor)
        if readable:
            issues += _row_level_issues(table, fam, fmt, processor=processor,
                                        images_kwargs=images_kwargs, positions=positions,
                                        chunk=chunk)
        report.issues += [listed(i, max_rows_listed) for i in issues]
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
