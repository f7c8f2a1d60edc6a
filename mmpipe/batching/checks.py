"""Collate's input checks: stored rows (records, dicts or Arrow) -> validated `MultiModalInputs`.

Every check is O(rows) or vectorised and raises the typed errors of `mmpipe.errors` naming
the row (its index in the batch) and the column: rows that failed to encode under
``on_error="skip"``, rows of different kinds of family (`check_one_kind`), values whose dtype
would be cast silently (float token ids, integer pixel values), records-level inconsistencies
(`MultiModalInputs.validate`), token values no encoder writes (an attention mask with zeros
among ones, a negative token id or label other than -100: `check_token_values`), rows with image / video
tokens but no pixel data (layout-only
rows, alone or mixed with rows that carry pixels: `carries_pixels`), NaN/inf in float pixel
values (`check_finite`, once the batch's pixels are concatenated), and image / video pad tokens
at text positions
(`check_vision_tokens`: a sampled ``<|image_pad|>`` in a response, the "Image features and
image tokens do not match" crash).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.families import ALL_FAMILIES
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import ERROR_COLUMN, IGNORE_INDEX

logger = logging.getLogger("mmpipe")


def checked_records(rows: Sequence[Any], verify_pixels: bool = False, family: Any = None) -> list[MultiModalInputs]:
    """Rows (records, dicts or Arrow) -> validated `MultiModalInputs`; any records-level
    error becomes a typed `InputError` naming the row.

    Stages, as collate has always reported them: what `MultiModalInputs.validate` finds and
    pixel data that disagree with the grids (`PixelDataError`) are "collate" errors; a value
    the reader cannot use at all (missing, not numeric, unknown family) keeps "validate".
    ``family``: the collator's family name, the kind a row of another kind is told apart from."""
    if not len(rows):
        raise InputError("collate got an empty list of rows", where="", stage="collate",
                         fix="drop empty batches (DataLoader(drop_last=...)) or filter before collating")
    table = arrow_table(rows)
    if table is None:
        rows = row_dicts(rows)
    try:
        if table is not None:  # stored rows as Arrow (ArrowRows): numpy views of the column buffers
            _check_error_column(table.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in table.column_names else ())
            check_one_kind(_families(rows, table), family)
            read = rows_from_arrow(table, verify_pixels=verify_pixels)
            return [_validated(r, i, read=True) for i, r in enumerate(read)]
        _check_error_column([r.get(ERROR_COLUMN) if isinstance(r, dict) else None for r in rows])
        media = check_one_kind(_families(rows, None), family)
        recs = []
        for i, r in enumerate(rows):
            if media is None or media.CHECK_STORED_DTYPES:
                _check_dtypes(r, i)
            rec = MultiModalInputs.from_dict(r, row=i, verify_pixels=verify_pixels)
            recs.append(_validated(rec, i, read=rec is not r))
        return recs
    except PixelDataError as e:
        e.restage("collate")
        raise
    except InputError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise _as_row_error(e) from e


def _validated(r: MultiModalInputs, i: int, read: bool) -> MultiModalInputs:
    """``r.validate(i)``, its errors reported at stage "collate"; once: not again for a row
    just ``read`` from its stored columns by a kind whose reader validates (``CHECK_ON_READ``).
    Then its token values (`check_token_values`)."""
    if not (read and r.fam.media.CHECK_ON_READ):
        try:
            r = r.validate(i)
        except InputError as e:
            e.restage("collate")
            raise
    check_token_values(r, i)
    return r


# the token-value rule, once for collate (numpy, one row) and mmpipe.validate_dataset (Arrow compute,
# a column's flat values): the ops it is written in, (less, not_equal, and), per array library
NUMPY_OPS = (np.less, np.not_equal, np.logical_and)


def token_value_faults(name: str, values, ops=NUMPY_OPS):
    """bool [n]: which ``values`` (int [n], a token column's) no encoder writes in column ``name``: in
    ``attention_mask`` a value other than 0 / 1, in ``labels`` a negative value other than -100 (the
    ignore index), in ``input_ids`` (and any other) a negative id. ``ops``: `NUMPY_OPS` for a numpy
    array, ``(pc.less, pc.not_equal, pc.and_)`` for an Arrow array (then a null value gives null)."""
    less, not_equal, both = ops
    if name == "attention_mask":
        return both(not_equal(values, 0), not_equal(values, 1))
    if name == "labels":
        return both(less(values, 0), not_equal(values, IGNORE_INDEX))
    return less(values, 0)


def mask_has_holes(ones, zeros, other):
    """Whether an attention mask with ``ones`` 1s, ``zeros`` 0s and ``other`` other values (counts:
    ints, or int arrays [rows]) is refused: any other value, or zeros among ones (a stored row is
    unpadded; all 0 is a dummy row, which collate takes and validate warns about)."""
    return (other > 0) | ((ones > 0) & (zeros > 0))


def check_token_values(r: MultiModalInputs, i: int) -> None:
    """Values no encoder writes in a row's token fields, O(L) (`token_value_faults`,
    `mask_has_holes`): an ``attention_mask`` value other than 0 / 1, or zeros among ones (a stored
    row is unpadded: a 0 hides a real token from the model, silently, under positions that count it;
    a row of zeros only, a dummy row, is taken), a negative label other than -100 or a negative token
    id (the loss / the embedding lookup fails on it; on a GPU a device-side assert).
    `InputError` naming the row, the column and the first bad token."""
    att, labels = r.attention_mask, r.labels
    if att is not None and len(att) and not (att == 1).all():
        bad = token_value_faults("attention_mask", att)
        if mask_has_holes(np.count_nonzero(att == 1), np.count_nonzero(att == 0), np.count_nonzero(bad)):
            t = int(np.flatnonzero(bad if bad.any() else att == 0)[0])
            _bad_token(r, i, "attention_mask", t, "1 at every token (a dummy row: 0 at every token)")
    if labels is not None and len(labels) and labels.min() < 0:
        bad = token_value_faults("labels", labels)
        if bad.any():
            _bad_token(r, i, "labels", int(np.flatnonzero(bad)[0]), f"{IGNORE_INDEX} (ignored) or a token id >= 0")
    if len(r.input_ids) and r.input_ids.min() < 0:
        _bad_token(r, i, "input_ids", int(np.flatnonzero(token_value_faults("input_ids", r.input_ids))[0]),
                   "a token id >= 0")


def _bad_token(r: MultiModalInputs, i: int, name: str, t: int, expected: str) -> None:
    value = int(getattr(r, name)[t])
    why = ": a stored row must be unpadded (attention_mask all ones)" if name == "attention_mask" else ""
    raise InputError(f"{name} holds {value} at token {t}{why}", row=i, column=name, stage="collate",
                     expected=expected, found=value,
                     fix="re-encode the row with mmpipe.encode (mmpipe.validate_dataset names every such row), "
                         "or drop it")


_INT_COLUMNS = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "labels",
                "image_grid_thw", "video_grid_thw")
_FLOAT_PIXELS = ("pixel_values", "pixel_values_videos")
_U8_PIXELS = ("pixel_values_u8", "pixel_values_videos_u8")


def _check_error_column(values) -> None:
    """Rows that failed under ``on_error="skip"`` are empty placeholders: never train on them."""
    for i, v in enumerate(values):
        if v:
            raise InputError(
                f"this row failed to encode ({v})", row=i, stage="collate", column=ERROR_COLUMN,
                fix="filter failed rows first: ds, errors = mmpipe.drop_failed(ds), or use mmpipe.encode_dataset",
            )


def check_one_kind(families: Sequence[Any], expected: Any = None):
    """Every row of a batch of one kind of family (`mmpipe.families.ModelFamily.kind`): the kind of
    ``expected`` (the collator's family name) when a row has it, else the kind most rows have
    (ties: the first row's); a row of another kind raises `InputError` naming it - the row that
    differs, in the words of the batch's strategy (``BATCH_ROWS``, ``FOREIGN_ROW``). A row whose
    family is unknown is left to the row reader (it names the bad value). Returns the batch's
    strategy module (None when no row names a known family)."""
    media = [ALL_FAMILIES[f].media if isinstance(f, str) and f in ALL_FAMILIES else None for f in families]
    known = [m for m in media if m is not None]
    want = ALL_FAMILIES[expected].media if isinstance(expected, str) and expected in ALL_FAMILIES else None
    if want is not None and any(m is want for m in known):
        first = want
    else:
        first = max(known, key=lambda m: (sum(k is m for k in known), -known.index(m))) if known else None
    for i, m in enumerate(media):
        if m is not None and m is not first:
            raise InputError(f"{first.FOREIGN_ROW} in a batch of {first.BATCH_ROWS} rows", row=i, column="family",
                             stage="collate", expected=f"{first.BATCH_ROWS} rows"
                             + (f" (the collator's family {expected!r})" if first is want else ""),
                             found=f"family {families[i]!r}", fix="encode every row of the dataset with one processor")
    return first


def _families(rows: Any, table: Any) -> list:
    """The ``family`` value of each row (records, dicts or an Arrow table); None where absent."""
    if table is not None:
        return table.column("family").to_pylist() if "family" in table.column_names else [None] * table.num_rows
    return [r.get("family") if isinstance(r, dict) else getattr(r, "family", None) for r in rows]


def _dtype_of(value):
    """The dtype name of a numpy / torch value holding at least one value; None for python lists
    (typed by their Arrow schema) and for empty arrays: ``np.asarray([])`` / ``torch.tensor([])``
    (a row without videos) are float by default, and no value of theirs can be cast wrongly."""
    dt = getattr(value, "dtype", None)
    size = getattr(value, "size", None)
    size = value.numel() if callable(size) else size  # torch: size() is the shape, numel() the count
    return None if dt is None or size == 0 else str(dt).replace("torch.", "")


def _check_dtypes(r: Any, i: int) -> None:
    """O(columns) per row: values whose dtype would be silently cast into something wrong."""
    if not isinstance(r, dict):
        return
    for name in _INT_COLUMNS:
        dt = _dtype_of(r.get(name))
        if dt is not None and ("float" in dt or "complex" in dt):
            raise InputError(
                f"{name} holds {dt} values; casting them to int64 would silently truncate", row=i, column=name,
                stage="collate",
                expected="an integer dtype", found=dt, fix="store token ids, masks, positions and grids as int64",
            )
    for name in _FLOAT_PIXELS:
        dt = _dtype_of(r.get(name))
        if dt is not None and not ("float" in dt):
            raise PixelDataError(
                f"{name} holds {dt} values, not normalised float pixels", row=i, column=name,
                expected="float32 (the processor's normalised pixel_values)", found=dt,
                fix="store raw uint8 patches in pixel_values_u8, or the processor's float output in pixel_values",
            )
    for name in _U8_PIXELS:
        dt = _dtype_of(r.get(name))
        if dt is not None and dt != "uint8" and ("int" in dt or "float" in dt or "bool" in dt):  # bytes are fine
            raise PixelDataError(
                f"{name} holds {dt} values", row=i, column=name, expected="uint8", found=dt,
                fix="store compact pixels as uint8 (mmpipe.encode does)",
            )


def check_finite(pv: np.ndarray, offsets: np.ndarray, name: str) -> None:
    """One vectorised pass (a sum: NaN and inf propagate; about a third of the concatenation's
    time); the row is looked for only when the sum is not finite."""
    if not pv.size or np.isfinite(pv.sum()):
        return
    bad = np.flatnonzero(~np.isfinite(pv).all(axis=1))
    if not len(bad):  # finite values whose float32 sum overflowed: not this check's business
        return
    bad_patch = int(bad[0])
    row = int(np.searchsorted(offsets, bad_patch, side="right") - 1)
    raise PixelDataError(
        f"{name} hold NaN or inf (first at patch {bad_patch - int(offsets[row])} of the row)", row=row, column=name,
        expected="finite normalised pixel values", found="NaN/inf",
        fix="re-encode the row from its image (mmpipe.encode pixels='uint8' cannot produce NaN)",
    )


def carries_pixels(recs: Sequence[MultiModalInputs], allow_layout_only: bool = False) -> bool:
    """Whether a batch of ``recs`` (any kind) carries pixels. Rows holding images or videos
    (their image / video tokens) but no pixel data (layout-only rows, ``pixels="none"``) are
    refused with a `PixelDataError` naming the first such row: the model would train on their
    image tokens without seeing the images. ``allow_layout_only=True`` (an explicit opt-in for
    callers that want ids without pixels: token statistics, packing plans) returns False
    instead: a text-only batch without pixel inputs, logged. Such rows mixed with rows that
    carry pixels are refused either way (a text-only batch would silently drop the others'
    pixels, found by fuzzing). Rows without images or videos (text-only rows, layout-only ones
    included) lose nothing and batch with any rows; source-file rows carry pixels (collate
    decodes them)."""
    media = [i for i, r in enumerate(recs) if r.num_images or r.num_videos]
    missing = [i for i in media if recs[i].pixel_format == "none"]
    carry = [i for i in media if recs[i].pixel_format != "none"]
    if not missing:
        return True
    if carry:
        raise PixelDataError(f"rows {missing} hold images but no pixel data (layout-only rows, pixels='none') while "
                             f"rows {carry} carry pixels; one batch cannot mix them", row=missing[0],
                             column="pixel_values_u8", stage="collate",
                             fix="encode every row with the same pixels= option that stores pixels (or filter "
                                 "layout-only rows out)")
    if not allow_layout_only:
        r = recs[missing[0]]
        held = " and ".join(f"{n} {what}(s)" for n, what in ((r.num_images, "image"), (r.num_videos, "video")) if n)
        column = "pixel_values_u8" if r.num_images else "pixel_values_videos_u8"  # the column it lacks
        raise PixelDataError(
            f"rows {missing} hold image/video tokens but no pixel data (layout-only rows, pixels='none'): the model "
            "would train (or answer) without seeing them", row=missing[0], column=column, stage="collate",
            expected=f"the pixel data of its {held} (a row encoded with pixels='uint8', 'float32' or 'source')",
            found="no pixel column (a layout-only row, encoded with pixels='none')",
            fix="re-encode the rows with pixels='uint8' (or 'source') to train on them; layout-only rows are for "
                "length filters, token budgets and rollout prompt layouts. To collate their ids without pixels "
                "on purpose, pass allow_layout_only=True (collate, Collator, pack, PackingCollator)")
    logger.info("rows %s hold images but no pixel data (layout-only rows, allow_layout_only=True); the batch is "
                "text-only: a model given it does not see those images", missing)
    return False


def check_vision_tokens(recs: Sequence[MultiModalInputs], vision_tokens: Optional[VisionTokens] = None) -> None:
    """Refuse a row holding an image / video pad id where ``mm_token_type_ids`` says text
    (`mmpipe.errors.PlaceholderError`, stage "collate", naming the row, position and token).

    ``vision_tokens``: the processor's (`VisionTokens.from_processor`, what `mmpipe.Collator`
    and ``collate(processor=...)`` use); None: the pads the batch's own image blocks show
    (`VisionTokens.from_rows`; a batch without images shows none). Only pads are checked
    here: they are what breaks the model's image-token count, and a row from `mmpipe.encode`
    never holds one at a text position (literal pad text is refused at encode). A vision
    start / end inside a response is refused where the response becomes a row
    (``RolloutSample.to_row``, the data packers, multi-turn appends). One vectorised pass per row.
    """
    vt = vision_tokens if vision_tokens is not None else VisionTokens.from_rows(recs)
    if not vt.pad_ids:
        return
    for i, r in enumerate(recs):
        bad = vt.find(r.input_ids, r.mm_token_type_ids, pads_only=True)
        if len(bad):
            labelled = r.labels is not None and bool((r.labels[bad] != IGNORE_INDEX).any())
            vt.refuse(r.input_ids, bad, where=f"row {i}", row=i, offset=None, stage="collate",
                      what="the row (its mm_token_type_ids say text here" + (", a labelled response token)" if
                                                                            labelled else ")"))


def _as_row_error(e: Exception) -> InputError:
    """A records-level ValueError (its message already says 'row i, column ...') -> typed."""
    msg = str(e)
    cls = PixelDataError if ("pixel" in msg or "grid" in msg or "image tokens" in msg) else InputError
    fix = None if "re-encode" in msg else "re-encode the row with mmpipe.encode"
    return cls(msg, where="", stage="collate", fix=fix)


def row_dicts(rows):
    """Rows as collate reads them, from what ``datasets``' pandas format hands over: a
    ``pandas.DataFrame`` (``ds.with_format("pandas")[a:b]``) or a list of one-row frames
    (``ds.with_format("pandas")[i]``) become a list of dicts, and in each dict row a nested list
    that pandas gives as a 1-D object array of equally long arrays (``position_ids`` [3, L], a
    grid [I, 3]) is stacked into its 2-D array (exact: the same values, their own dtype; a
    ragged one is left for the reader to refuse). Other rows are returned as they are (a
    cheap per-column dtype check). A dict of columns (``ds[i:j]`` in the python / numpy / torch
    formats, a batched map's batch) becomes its rows too (`_column_rows`)."""
    if isinstance(rows, dict):
        rows = _column_rows(rows)
    if _is_frame(rows):
        rows = rows.to_dict("records")
    elif isinstance(rows, (list, tuple)) and rows and all(_is_frame(r) for r in rows):
        rows = [d for r in rows for d in r.to_dict("records")]
    if not isinstance(rows, (list, tuple)) or not any(isinstance(r, dict) for r in rows):
        return rows
    return [_stacked(r) if isinstance(r, dict) else r for r in rows]


def _column_rows(cols: dict) -> list[dict]:
    """A dict of columns -> its rows, each value the column's entry ``i`` as the format holds it
    (a list, a numpy array or a tensor; exact). One row's dict (``ds[i]``: its ``family`` a
    string) or columns of unequal lengths raise `ArgumentError` (iterating a dict would take its
    keys for rows and blame a "row 0" that is a column name)."""
    fam = cols.get("family")
    if isinstance(fam, str) or fam is None:
        what = "one row's dict (ds[i])" if isinstance(fam, str) else f"a dict with keys {sorted(cols)[:8]}"
        raise ArgumentError(f"collate takes a list of rows, a dict of columns (ds[i:j]), an Arrow table or a "
                            f"DataFrame; got {what}: pass a list, e.g. [ds[i]]")
    try:
        lengths = {k: len(v) for k, v in cols.items()}
    except TypeError as e:
        raise ArgumentError(f"collate got a dict of columns with a value that is not a column ({e}): pass "
                            "ds[i:j] as datasets returns it, or a list of rows") from e
    n = len(fam)
    uneven = {k: m for k, m in lengths.items() if m != n}
    if uneven:
        raise ArgumentError(f"collate got a dict of columns of unequal lengths: 'family' has {n} rows, "
                            f"{uneven}; pass ds[i:j] as datasets returns it, or a list of rows")
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def _is_frame(x) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "to_dict") and hasattr(x, "iloc")


def _stacked(r: dict) -> dict:
    """``r`` with each 1-D object array of equally shaped numeric arrays stacked (see `row_dicts`)."""
    out = None
    for k, v in r.items():
        if not (isinstance(v, np.ndarray) and v.dtype == object and v.ndim == 1 and len(v)):
            continue
        parts = list(v)
        if not all(isinstance(p, np.ndarray) and p.dtype.kind in "biuf" and p.shape == parts[0].shape
                   for p in parts):
            continue
        if out is None:
            out = dict(r)
        out[k] = np.stack(parts)
    return r if out is None else out


def arrow_table(rows):
    """The rows as one Arrow table if they came as Arrow (a table, a record batch, or a list
    of one-row tables from ``ArrowRows.__getitem__``), else None. `mmpipe.collate` calls it
    once and hands the table to both `checked_records` and its pass-through columns."""
    import pyarrow as pa

    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return rows
    if isinstance(rows, (list, tuple)) and rows and isinstance(rows[0], (pa.Table, pa.RecordBatch)):
        return pa.concat_tables([r if isinstance(r, pa.Table) else pa.Table.from_batches([r]) for r in rows])
    return None
