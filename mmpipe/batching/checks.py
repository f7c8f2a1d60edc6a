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
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.row_inputs import arrow_table, row_dicts
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.families import ALL_FAMILIES
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.columns import ERROR_COLUMN, IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.vision_tokens import VisionTokens

logger = logging.getLogger("mmpipe")


def checked_records(rows: Sequence[Any], verify_pixels: bool = False, family: Any = None) -> list[MultiModalInputs]:
    """Rows (records, dicts or Arrow) -> validated `MultiModalInputs`; any records-level
    error becomes a typed `InputError` naming the row.

    Stages, as collate has always reported them: what `MultiModalInputs.validate` finds and
    pixel data that disagree with the grids (`PixelDataError`) are "collate" errors; a value
    the reader cannot use at all (missing, not numeric, unknown family) keeps "validate".
    ``family``: the collator's family name, the kind a row of another kind is told apart from."""
    if not len(rows):
        raise InputError("collate got an empty list of rows", where="", stage="collate", expected="a row", found="none",
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


def _check_error_column(values, stage: str = "collate", first: int = 0) -> None:
    """Rows that failed under ``on_error="skip"`` are empty placeholders: never train on them."""
    for i, v in enumerate(values):
        if v:
            raise InputError(f"this row failed to encode ({v})", row=first + i, stage=stage, column=ERROR_COLUMN,
                             expected=f"an empty {ERROR_COLUMN}", found="a recorded failure (a placeholder row)",
                             fix="filter failed rows first: ds, errors = mmpipe.drop_failed(ds), or use "
                                 "mmpipe.encode_dataset")


def check_not_failed(rows, stage: str, *, first: int = 0) -> None:
    """`InputError` naming the first of ``rows`` that failed to encode under ``on_error="skip"``
    (an empty placeholder, 0 tokens, its failure in `ERROR_COLUMN`): what collate refuses, for the
    stages that read stored rows without collating them (rollout prompts and engines, verl rows,
    TRL prompts). ``rows``: an Arrow table or record batch, a dict of columns (with a list
    ``family`` column), one stored row, or a list of rows (records carry no failure); ``first``:
    the index of the first of them."""
    import pyarrow as pa

    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        names = rows.schema.names
        values = rows.column(names.index(ERROR_COLUMN)).to_pylist() if ERROR_COLUMN in names else ()
    elif isinstance(rows, Mapping):  # one row, or columns (``dataset[i:j]``): a list / 1-D family column
        v, fam = rows.get(ERROR_COLUMN), rows.get("family")
        values = ([] if v is None else list(v)) if isinstance(fam, (list, tuple)) or getattr(fam, "ndim", 0) == 1 \
            else [v]
    else:
        values = [r.get(ERROR_COLUMN) if isinstance(r, Mapping) else None for r in rows]
    _check_error_column(values, stage, first)


def check_none_failed(errors, who: str, stage: str = "collate") -> None:
    """`InputError` naming the rows of a whole dataset that failed to encode under ``on_error="skip"``
    (their count, the first ones, the first one's failure), for the entry points that read a dataset's
    lengths before any row is collated (`token_counts`, the verl dataset's length filter): such a
    row has 0 tokens, so it fits every budget, and training would run until the collator refuses its
    batch, possibly hours in. ``errors``: the dataset's `ERROR_COLUMN` (an Arrow array or chunked
    array: null or "" on good rows); ``who``: the caller, named in the message."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(errors, pa.ChunkedArray):
        errors = errors.combine_chunks()
    errors = pa.array(errors, pa.string()) if not isinstance(errors, pa.Array) else errors
    failed = np.flatnonzero(pc.fill_null(pc.not_equal(errors, ""), False).to_numpy(zero_copy_only=False))
    if not len(failed):
        return
    first = int(failed[0])
    more = f", e.g. rows {failed[:5].tolist()}" if len(failed) > 1 else ""
    raise InputError(
        f"{who}: {len(failed)} row(s) of the dataset failed to encode under on_error='skip' (empty rows of 0 "
        f"tokens that fit every budget; the collator would refuse their batch mid-epoch){more}; the first "
        f"failed with {errors[first].as_py()}", row=first, column=ERROR_COLUMN, stage=stage,
        expected="rows that encoded (an empty mmpipe_error)", found=f"{len(failed)} failed row(s)",
        fix="filter failed rows first: ds, errors = mmpipe.drop_failed(ds) (errors: each failed row's record), "
            "or encode with mmpipe.encode_dataset, which drops and reports them")


def check_dataset_not_failed(dataset, who: str, stage: str = "collate") -> None:
    """`check_none_failed` over the `ERROR_COLUMN` of a map-style ``datasets.Dataset`` (its selection
    honoured), for hosts handed a whole dataset before training; anything else (an ``IterableDataset``,
    a list, None, a dataset without that column) is left to the readers that refuse each failed row
    when it comes (collate, the prompt readers)."""
    names = getattr(dataset, "column_names", None)
    if isinstance(names, list) and ERROR_COLUMN in names and hasattr(dataset, "select_columns") \
            and hasattr(dataset, "__len__"):
        table = dataset.select_columns([ERROR_COLUMN]).with_format("arrow")[:]
        check_none_failed(table.column(ERROR_COLUMN), who, stage)


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
                             column="pixel_values_u8", stage="collate", expected="pixels in all media rows or none",
                             found=f"{len(missing)} row(s) without pixels, {len(carry)} with", fix="encode every row "
                                 "with the same pixels= option that stores pixels (or filter layout-only rows out)")
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


def check_slot_ids(rows: Sequence[Any], ids: Sequence[int], names: Sequence[str], *, stage: str = "collate",
                   index: Optional[int] = None, kinds: tuple = (1, 2)) -> None:
    """The reverse of `check_vision_tokens`: every media slot of each row (``mm_token_type_ids``
    in ``kinds``) must hold one of the processor's placeholder ``ids`` (named ``names``: the
    patch grids' image / video pads, the tiles' feature token; empty: not checked). Rows whose
    ids came from another tokenizer (a checkpoint of the family with another vocabulary:
    InternVL ships InternLM and Qwen ones) would reach the model with no placeholder where their
    media go and every other id read in the wrong vocabulary. `InputError` naming the row
    (``index``, else its place in ``rows``), ``input_ids``, the ids expected and found, the fix.
    One vectorised pass per row."""
    allowed = np.asarray(list(ids), np.int64)
    if not allowed.size:
        return
    for b, r in enumerate(rows):
        slots = np.flatnonzero(np.isin(r.mm_token_type_ids, kinds))
        wrong = slots[~np.isin(r.input_ids[slots], allowed)]
        if len(wrong):
            k = int(wrong[0])
            raise InputError("the row's media slots hold another id than the processor's placeholder tokens: its "
                             "ids come from another tokenizer than this processor's",
                             row=b if index is None else index, column="input_ids", stage=stage,
                             expected=f"{' or '.join(names)} (ids {allowed.tolist()})",
                             found=f"id {int(r.input_ids[k])} at token {k}",
                             fix="use the processor the rows were encoded with, or re-encode them with this one")


def _as_row_error(e: Exception) -> InputError:
    """A records-level ValueError (its message already says 'row i, column ...') -> typed."""
    msg = str(e)
    cls = PixelDataError if ("pixel" in msg or "grid" in msg or "image tokens" in msg) else InputError
    fix = None if "re-encode" in msg else "re-encode the row with mmpipe.encode"
    return cls(msg, where="", stage="collate", fix=fix)
