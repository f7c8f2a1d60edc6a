"""The row part of `mmpipe.data.validate.validate_dataset`, the same for every kind of family:
rows that failed to encode, one kind and one family per dataset, token values no encoder writes
(`token_value_issues`), rows that train nothing or lost their labels (`untrained_rows`), rows
with images but no pixel data, ``pixels="source"`` files that do not open, and every row read as
collate reads it (`rows_from_arrow`, pixel digests checked), validated, and given to the kind's own row check
(``fam.media.row_checks``: M-RoPE positions, tile feature tokens). Each finding is an `Issue`
naming the column and the rows; identical problems of several rows are one issue.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmpipe.batching.checks import mask_has_holes, token_value_faults
from mmpipe.data.report import REENCODE, Issue
from mmpipe.data.sources_check import unreadable_sources
from mmpipe.errors import InputError
from mmpipe.records.arrow import list_lengths, rows_from_arrow
from mmpipe.records.columns import IGNORE_INDEX, STORED_PIXEL_COLUMN

ARROW_OPS = (pc.less, pc.not_equal, pc.and_)  # `token_value_faults` over Arrow arrays

__all__ = ["failed_rows", "family_issues", "images_without_tokens", "listed", "missing_pixels",
           "token_value_issues", "unreadable_files", "row_issues", "untrained_rows"]

RowCheck = Callable[..., None]  # (row: MultiModalInputs, index: int) -> None, raising InputError


def listed(issue: Issue, max_rows_listed: int) -> Issue:
    """``issue`` with its rows cut to the first ``max_rows_listed`` (``num_rows``: all)."""
    issue.num_rows = issue.num_rows or len(issue.rows)
    issue.rows = list(issue.rows[:max_rows_listed])
    return issue


def _flags(mask) -> np.ndarray:
    """Row indexes where an Arrow boolean array is true."""
    return np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False)))


def failed_rows(table: pa.Table) -> list[Issue]:
    """Rows that failed to encode under ``on_error="skip"`` (stored empty): a warning."""
    if "mmpipe_error" not in table.column_names:
        return []
    bad = [i for i, x in enumerate(table.column("mmpipe_error").to_pylist()) if x]
    if not bad:
        return []
    return [Issue("warning", "failed_rows", "mmpipe_error",
                  "rows that failed to encode (on_error='skip'), stored empty",
                  "mmpipe.drop_failed(ds) (or filter on the column) before training", bad)]


def family_issues(table: pa.Table, known: list[str]) -> tuple[list[Issue], bool]:
    """Rows of a family not in ``known`` (the families of the dataset's kind; an error, and
    False: the rows cannot be read further): a name no family has is "unknown", a known family
    of another kind (a Qwen row among generic-path rows) is named with its kind; and rows of
    several families (an error: token ids and positions differ between families)."""
    from mmpipe.families import ALL_FAMILIES

    fams = table.column("family")
    outside = pc.fill_null(pc.invert(pc.is_in(fams, value_set=pa.array(known))), True)
    if len(_flags(outside)):
        other = pc.fill_null(pc.is_in(fams, value_set=pa.array(sorted(ALL_FAMILIES))), False)
        issues = []
        unknown = pc.and_(outside, pc.invert(other))
        if len(_flags(unknown)):
            vals = sorted({str(v) for v in pc.unique(pc.filter(fams, unknown)).to_pylist()})
            issues.append(Issue("error", "family", "family", f"unknown model family {vals}; known: "
                                f"{sorted(ALL_FAMILIES)}", REENCODE, _flags(unknown).tolist()))
        foreign = pc.and_(outside, other)
        if len(_flags(foreign)):
            vals = sorted(str(v) for v in pc.unique(pc.filter(fams, foreign)).to_pylist())
            kinds = ", ".join(f"{v!r} ({ALL_FAMILIES[v].kind})" for v in vals)
            kind = ALL_FAMILIES[known[0]].kind if known else "?"
            issues.append(Issue("error", "family", "family", f"rows of model families of another kind: {kinds}, "
                                f"in a dataset of {kind} rows (families {known}); one dataset holds rows of one "
                                "family: their columns, token ids and positions differ",
                                "re-encode these rows with the training model's processor, or split by family",
                                _flags(foreign).tolist()))
        return issues, False
    counts = pc.value_counts(fams).to_pylist()
    if len(counts) < 2:
        return [], True
    main = max(counts, key=lambda c: c["counts"])["values"]
    names = sorted(c["values"] for c in counts)
    return [Issue("error", "family", "family", f"rows of several model families {names} "
                  f"(most are {main!r}); token ids and positions differ between families",
                  "re-encode these rows with the training model's processor, or split by family",
                  _flags(pc.not_equal(fams, main)).tolist())], True


def missing_pixels(table: pa.Table, pixel_format: str, layout_column: str) -> list[Issue]:
    """Rows with images (a non-empty ``layout_column``, the kind's per-image layout) but a
    null pixel value in a dataset that stores pixels: collate refuses them next to rows with
    pixels (and would train blind on them alone)."""
    # a "mixed" table (encodes of several pixels= settings concatenated): a row's pixels are in
    # the column of its own format, the others null; a row is missing them when every one is null
    cols = [STORED_PIXEL_COLUMN[pixel_format]] if pixel_format in STORED_PIXEL_COLUMN else \
        list(STORED_PIXEL_COLUMN.values()) if pixel_format == "mixed" else []
    cols = [c for c in cols if c in table.column_names]
    if not cols or layout_column not in table.column_names:
        return []
    null = np.logical_and.reduce([np.asarray(table.column(c).is_null().to_numpy(zero_copy_only=False))
                                  for c in cols])
    bad = np.flatnonzero(null & (list_lengths(table.column(layout_column)) > 0))
    col = cols[0] if len(cols) == 1 else " / ".join(cols)
    return [Issue("error", "content", col, "rows hold images but no pixel data (null)", REENCODE,
                  bad.tolist())] if len(bad) else []


def _per_row_count(column: pa.ChunkedArray, hit, num_rows: int) -> np.ndarray:
    """int64 [rows]: how many values of each row of a list column ``hit(values)`` (an Arrow
    compute of the flat values -> bool) marks; a null row counts 0. No row is built."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    parents = np.asarray(pc.list_parent_indices(col).to_numpy(zero_copy_only=False), np.int64)
    mask = np.asarray(pc.fill_null(hit(pc.list_flatten(col)), False).to_numpy(zero_copy_only=False), bool)
    return np.bincount(parents[mask], minlength=num_rows)


def images_without_tokens(table: pa.Table, layout_column: str) -> list[Issue]:
    """Rows with images (a non-empty ``layout_column``) but no token marked as an image
    (``mm_token_type_ids == 1``): their image tokens were cut (a truncating ``map``) while the
    images stayed; collate still sends the pixels and the model fails ("image features and image
    tokens do not match"). For a kind whose row check needs a marked token to find its feature
    token (`mmpipe.media.tiles_validate` without a processor), the one check left when no row
    marks any."""
    if "mm_token_type_ids" not in table.column_names or layout_column not in table.column_names:
        return []
    marked = _per_row_count(table.column("mm_token_type_ids"), lambda v: pc.equal(v, 1), table.num_rows)
    bad = np.flatnonzero((marked == 0) & (list_lengths(table.column(layout_column)) > 0))
    return [Issue("error", "content", "input_ids", f"rows hold images ({layout_column}) but no image token "
                  "(no mm_token_type_ids == 1): the image tokens were cut from input_ids (truncated?) while "
                  "the images stayed", REENCODE + " (truncate before encoding, never the encoded ids)",
                  bad.tolist())] if len(bad) else []


def untrained_rows(table: pa.Table) -> list[Issue]:
    """Rows of a labelled dataset without a trained token while other rows have some: they add
    nothing to the loss (a batch of only such rows gives a NaN loss). Warnings, one per cause: every
    label -100 (a response cut away by a truncating ``map``), or null labels (`_null_labels`: the row
    reads as unlabelled; its labels were lost). A dataset whose rows all train nothing (prompt-only
    rows for RL) gets none. Rows that failed to encode (`failed_rows`) are warned about there."""
    if "labels" not in table.column_names or not table.num_rows:
        return []
    trained = _per_row_count(table.column("labels"), lambda v: pc.not_equal(v, IGNORE_INDEX), table.num_rows) > 0
    if "mmpipe_error" in table.column_names:
        failed = pc.fill_null(pc.greater(pc.utf8_length(table.column("mmpipe_error").cast(pa.string())), 0), False)
        trained |= np.asarray(failed.to_numpy(zero_copy_only=False), bool)
    if not trained.any() or trained.all():
        return []
    null = np.asarray(table.column("labels").is_null().to_numpy(zero_copy_only=False), bool)
    cut = np.flatnonzero(~trained & ~null).tolist()
    issues = [Issue("warning", "content", "labels", "rows without a trained token (every label -100) among rows "
                    "with trained tokens: they add nothing to the loss (their response cut by a truncation?)",
                    "drop them (ds.filter(lambda r: any(x != -100 for x in r['labels'] or []))) or re-encode them "
                    "with a longer max_length", cut)] if cut else []
    return issues + _null_labels(np.flatnonzero(null & ~trained).tolist())


def _null_labels(rows: list) -> list[Issue]:
    """A warning naming the rows of a labelled dataset whose ``labels`` are null: each reads as an
    unlabelled row (collate gives it all -100 labels, unbatch gives it none), so it trains silently
    with no loss."""
    if not rows:
        return []
    return [Issue("warning", "content", "labels", "null labels among labelled rows: each reads as an unlabelled "
                  "(prompt-only) row and trains with no loss (collate gives it all -100); its labels were lost "
                  "(a concatenation with an unlabelled encode, a map returning None?)",
                  "re-encode these rows from their conversations, or drop them (ds.filter(lambda r: r['labels'] "
                  "is not None))", rows)]


def token_value_issues(table: pa.Table, vocab: Optional[int] = None) -> list[Issue]:
    """Token columns holding values no encoder writes, found without reading a row (errors): an
    ``attention_mask`` with values other than 0 / 1 or zeros among ones (stored rows are unpadded:
    a 0 hides a real token from the model, silently, and collate refuses the row), a negative token
    id or a negative label other than -100 (the embedding lookup / the loss fails on them, on a GPU
    as a device-side assert), and, given ``vocab`` (the processor's ``len(tokenizer)``), ids or labels
    the tokenizer does not have (rows of another tokenizer). Rows whose mask is all 0 (dummy rows:
    the model attends to none of their tokens) are warned."""
    out, n = [], table.num_rows
    if "attention_mask" in table.column_names and n:
        col = table.column("attention_mask")
        ones = _per_row_count(col, lambda v: pc.equal(v, 1), n)
        zeros = _per_row_count(col, lambda v: pc.equal(v, 0), n)
        other = _per_row_count(col, lambda v: token_value_faults("attention_mask", v, ARROW_OPS), n)
        holed = np.flatnonzero(mask_has_holes(ones, zeros, other)).tolist()
        if holed:
            out.append(Issue("error", "content", "attention_mask", "values other than 1 inside rows (a stored row is "
                             "unpadded: all 1): the model would not attend to those tokens, silently",
                             REENCODE + " (or drop these rows)", holed))
        dummy = np.flatnonzero((zeros > 0) & (ones == 0) & (other == 0)).tolist()
        if dummy:
            out.append(Issue("warning", "content", "attention_mask", "all 0 (dummy rows?): the model attends to none "
                             "of their tokens", "drop them (ds.filter(lambda r: any(r['attention_mask'])))", dummy))
    for name, ignored in (("input_ids", None), ("labels", IGNORE_INDEX)):
        if name in table.column_names and n:
            out += _out_of_range(table.column(name), name, ignored, vocab, n)
    return out


def _out_of_range(col, name: str, ignored: Optional[int], vocab: Optional[int], n: int) -> list[Issue]:
    """Rows of a token column holding a negative value other than ``ignored`` (-100 in labels: the
    rule collate checks, `token_value_faults`), and values >= ``vocab`` when given: one error each."""
    out = []
    what = "token ids" if ignored is None else f"labels other than {ignored} (the ignore index)"
    neg = _per_row_count(col, lambda v: token_value_faults(name, v, ARROW_OPS), n)
    if neg.any():
        out.append(Issue("error", "content", name, f"negative {what}: the model fails on them (an embedding "
                         "index / the loss; on a GPU a device-side assert)", REENCODE + " (or drop these rows)",
                         np.flatnonzero(neg).tolist()))
    if vocab is not None:
        big = _per_row_count(col, lambda v: pc.greater_equal(v, vocab), n)
        if big.any():
            # a warning: sampled rollout ids may lie in the model's embedding beyond the tokenizer
            # (`mmpipe.rollout.support.token_ids` keeps them), which an encode never writes
            out.append(Issue("warning", "content", name, f"{name} values >= {vocab}, the size of the processor's "
                             "tokenizer: rows encoded with another tokenizer (or edited), unless they hold sampled "
                             "ids from the model's larger embedding (rollouts)",
                             "pass the processor the rows were encoded with, or re-encode these rows with this one",
                             np.flatnonzero(big).tolist()))
    return out


def unreadable_files(table: pa.Table, chunk: int) -> list[Issue]:
    """``pixels="source"`` rows: every stored file must open as an image
    (`unreadable_sources`)."""
    return [Issue("error", "content", "image_sources", f"a stored image file does not open: {why}",
                  "re-encode these rows from the original images (or restore the files from a "
                  "good copy)", rows) for why, rows in unreadable_sources(table, chunk).items()]


def row_issues(table: pa.Table, check: Optional[RowCheck], chunk: int,
               reported: frozenset = frozenset()) -> list[Issue]:
    """Every row read as collate reads it (checked `rows_from_arrow`, digests verified), then
    ``validate`` and ``check(row, index)``, chunk by chunk; a chunk that does not read is
    re-read row by row to find every bad row. One error `Issue` per distinct problem; rows in
    ``reported`` (already named for their pixels) are not named again."""
    problems: dict[tuple, list] = {}
    for start in range(0, table.num_rows, chunk):
        part = table.slice(start, chunk)
        try:
            rows = rows_from_arrow(part, verify_pixels=True)
        except ValueError:
            rows = None
        for i in range(part.num_rows):
            try:
                r = rows[i] if rows is not None else \
                    rows_from_arrow(part.slice(i, 1), verify_pixels=True)[0]
                if not r.fam.media.CHECK_ON_READ:  # else reading it did
                    r.validate(start + i)
                if check is not None:
                    check(r, start + i)
            except ValueError as e:
                if start + i not in reported:
                    problems.setdefault(_problem(e), []).append(start + i)
    return [Issue("error", "content", col, msg, REENCODE, rows)
            for (col, msg), rows in problems.items()]


def _problem(e: ValueError) -> tuple[Optional[str], str]:
    """(column, what is wrong) of a row's error: the issue says where (column, rows) and how
    to fix it itself, so the text is the error's body alone and identical problems group."""
    if isinstance(e, InputError):
        return e.column, e.message_body()
    return None, str(e)  # not raised by the records' checks: kept whole
