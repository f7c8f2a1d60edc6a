"""The stored-row codec of every family kind: ONE writer (record -> stored columns, `write_columns`)
and ONE reader (stored columns -> record, `read_row`), driven by each kind's declaration of its
columns (``fam.media.COLUMNS``: `Column` s in storage order); what no declaration says (M-RoPE's
``rope_delta``, the tiles' [N, S, S, 3] shape, the processor's layout-typed outputs) each kind
reads in its ``read_media``. Also the digest of a row's stored pixels and the one shape check of
a record's [L] fields. Stage: records (validate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np

from mmpipe.errors import InputError, PixelDataError
from mmpipe.images.backends import BACKENDS
from mmpipe.records.columns import (
    PIXEL_COLUMNS, as_array, fit_width, pixel_digest, source_list, sources_digest, u8_block, u8_bytes,
)


@dataclass(frozen=True, eq=False)  # one declaration is one column: compared by identity
class Column:
    """One stored column of a kind's row, in the order the row stores them.

    ``name``: the column and the record field it holds (unless ``value`` derives it).
    ``store``: its dtype on disk (numpy name; ``"bytes"``: uint8 raw bytes + one end marker,
    `mmpipe.records.columns.u8_bytes`; ``"object"``: the value as it is: strings, bytes lists).
    ``read`` / ``ndim``: the record field's dtype and dims (``read=None``: the reader leaves it to
    the kind). ``width``: the values per row of an [n, width] field, an int or the name of a
    `ModelFamily` attribute (``"patch_dim"``); ``rows``: the per-image layout field whose pixel
    rows it holds (``image_grid_thw``: sum(t*h*w)); ``flat``: stored flat ([I, 2] as [2*I]).
    ``missing``: a stored row without it: ``"error"``, ``"none"`` (the field keeps its default),
    ``"ones"`` / ``"zeros"`` (int [L]), ``"no rows"`` (also left unset when its ``rows`` layout
    holds nothing: the video pixels of an image row). ``pixels``: the pixel formats whose rows
    store it (empty: every row). ``value``: derives the stored value from the record (None: the
    row stores no such column); ``load``: reads it back, ``load(stored value, fields read so far,
    fam, row)`` (None: by ``read``)."""

    name: str
    store: str
    read: Optional[str] = "int64"
    ndim: int = 1
    width: Union[int, str, None] = None
    rows: Optional[str] = None
    missing: str = "error"
    pixels: tuple = ()
    flat: bool = False
    value: Optional[Callable] = None
    load: Optional[Callable] = None


def column_width(c: Column, fam) -> Optional[int]:
    """The values per row of ``c`` for family ``fam`` (None: not declared)."""
    return getattr(fam, c.width) if isinstance(c.width, str) else c.width


def pixel_rows(layout: Optional[np.ndarray]) -> int:
    """The pixel rows a per-image layout calls for: patch grids [n, 3] -> sum(t*h*w), tile counts
    [I] -> their sum (0 for None / no image)."""
    if layout is None or not len(layout):
        return 0
    return int(layout.prod(axis=1).sum()) if layout.ndim == 2 else int(layout.sum())


_PIXEL_STORES = {"bytes": 1, "uint8": 1, "float32": 4}  # a stored pixel column's bytes per value


def stored_pixel_bytes(table, columns: tuple) -> int:
    """Bytes the pixel data columns of ``columns`` (declared with ``pixels``, stored as ``"bytes"``,
    ``"uint8"`` or ``"float32"``) hold in Arrow ``table`` (``mmpipe inspect``'s counts): each
    value's bytes, a ``"bytes"`` column's end marker apart; the columns ``table`` lacks count 0."""
    import pyarrow.compute as pc

    total = 0
    for c in columns:
        if callable(c) or not c.pixels or c.store not in _PIXEL_STORES or c.name not in table.column_names:
            continue
        col = table.column(c.name).combine_chunks()
        if c.store == "bytes":  # one binary per row + an end marker
            lengths = pc.binary_length(col).to_numpy(zero_copy_only=False)
            total += int(np.maximum(lengths - 1, 0).sum())
            continue
        while hasattr(col.type, "value_type"):  # list<...<values>>: every value
            col = pc.list_flatten(col)
        total += _PIXEL_STORES[c.store] * len(col)
    return total


# ---- record -> stored columns --------------------------------------------------------
# columns of more than one kind (each documented in mmpipe.records.columns.ROW_COLUMNS)
FAMILY = Column("family", "object", read=None)
def _load_sources(value, kw: dict, fam, row) -> Optional[list]:
    """Stored ``image_sources``: one file per image of the kind's per-image layout."""
    return source_list(value, len(kw.get(fam.media.IMAGE_LAYOUT_COLUMN, ())), row)


SOURCES = Column("image_sources", "object", read=None, pixels=("source",), missing="none",
                 value=lambda r: [bytes(b) for b in r.image_sources], load=_load_sources)
DIGEST = Column("pixel_digest", "int64", read=None, ndim=0, missing="none",  # older rows: no digest
                value=lambda r: r.stored_pixel_digest())


def backend_column(pixels: tuple) -> Column:
    """``image_backend`` of the rows of ``pixels`` formats, stored when not ``"pil"``."""
    return Column("image_backend", "object", read=None, pixels=pixels, missing="none",  # absent: "pil"
                  value=lambda r: None if r.image_backend == "pil" else r.image_backend,
                  load=lambda v, kw, fam, row: stored_backend(v, row))


def write_columns(r, columns: tuple) -> dict:
    """The stored row of record ``r``: each `Column` of ``columns`` that ``r``'s pixel format
    stores, in order, as its ``store`` dtype (a missing field of a known width: empty [0, width];
    otherwise left out); a function among ``columns`` adds the columns it returns (``f(r)``)."""
    out: dict = {}
    fmt = r.pixel_format
    for c in columns:
        if callable(c):
            out.update(c(r))
            continue
        if c.pixels and fmt not in c.pixels:
            continue
        v = c.value(r) if c.value is not None else getattr(r, c.name)
        if v is None and c.width is not None:
            v = np.zeros((0, column_width(c, r.fam)), np.uint8 if c.store == "bytes" else c.store)
        if v is None:
            continue
        if c.store == "bytes":
            v = u8_bytes(v)
        elif c.store != "object":
            v = np.dtype(c.store).type(v) if c.ndim == 0 else v.astype(c.store, copy=False)
            v = v.reshape(-1) if c.flat else v
        out[c.name] = v
    return out


# ---- stored columns -> record --------------------------------------------------------
def read_columns(d, columns: tuple, fam, row) -> dict:
    """The record fields of stored row ``d`` that ``columns`` declare (``read`` set), checked:
    each an array of its ``read`` dtype and ``ndim`` (`as_array`), rows of ``width`` values
    (`fit_width`), uint8 bytes of ``rows`` x ``width`` (`u8_block`); a field whose ``rows``
    layout holds nothing is left unset."""
    kw: dict = {}
    for c in columns:
        if not callable(c) and c.load is not None:
            kw[c.name] = c.load(d.get(c.name), kw, fam, row)
        if callable(c) or c.read is None:
            continue
        default = None  # "ones" / "zeros": only for an absent column (a null value is missing data)
        if c.missing in ("ones", "zeros"):
            default = getattr(np, c.missing)(len(kw["input_ids"]))
        v = d.get(c.name, default)
        if v is None and c.pixels and pixel_rows(kw.get(c.rows)) and _stores_pixels(d, columns, c):
            raise _dropped_pixels(c, kw, row)
        if (v is None and c.missing in ("none", "no rows")) or \
                (c.missing == "no rows" and not pixel_rows(kw.get(c.rows))):
            continue
        if c.store == "bytes":
            kw[c.name] = u8_block(v, pixel_rows(kw.get(c.rows)), column_width(c, fam), c.name, row)
            continue
        arr = as_array(v, c.read, 1 if c.flat else c.ndim, c.name, row)
        if c.flat:
            arr = arr.reshape(-1, column_width(c, fam))
        elif c.width is not None:
            arr = fit_width(arr, column_width(c, fam), c.name, row)
        kw[c.name] = arr
    return kw


def _stores_pixels(d, columns: tuple, c: Column) -> bool:
    """Whether stored row ``d`` holds another pixel column of ``c``'s pixel formats (the row's
    pixel format is theirs: ``c`` belongs to it too; a layout-only row holds none)."""
    return any(not callable(o) and o is not c and o.rows and o.pixels == c.pixels and d.get(o.name) is not None
               for o in columns)


def _dropped_pixels(c: Column, kw: dict, row) -> InputError:
    """The error of a row whose pixel column ``c`` is absent or null although its ``c.rows``
    layout holds items and the row stores pixels (its other pixel columns): the column was dropped
    (``select_columns`` / ``remove_columns``) or nulled; collate would batch the items without it."""
    n = len(kw[c.rows])
    return stored_row_error(f"no {c.name!r} value, but the row's {c.rows} holds {n} item(s) and the row stores "
                            f"its other pixel data in the {'/'.join(c.pixels)} format: the column was dropped or "
                            "nulled", row, c.name, expected=f"the pixel rows of its {n} item(s)", found="none",
                            fix="keep every column mmpipe.encode wrote (select_columns / remove_columns must not "
                                "drop it), or re-encode the row", error=PixelDataError)


def read_row(cls, d, fam, row=None, *, verify_pixels: bool = False):
    """A stored row of family ``fam`` (python lists, numpy or torch formatted) -> a ``cls``
    record: the declared columns (`read_columns`), then the kind's own (``read_media``). A kind
    with ``CHECK_ON_READ`` validates every row it reads and checks its stored ``pixel_digest``
    (a `PixelDataError` when a byte changed after encoding); the others check the digest when
    ``verify_pixels``."""
    media = fam.media
    kw = read_columns(d, media.COLUMNS, fam, row)
    kw.update(media.read_media(d, kw, fam, row))
    out = cls(family=fam.name, **kw)
    if (verify_pixels or media.CHECK_ON_READ) and digest_value(d.get("pixel_digest")) is not None:
        out.verify_pixel_digest(d["pixel_digest"], row)
    return out.validate(row) if media.CHECK_ON_READ else out


def digest_value(stored: Any) -> Union[int, np.floating, None]:
    """A stored ``pixel_digest`` as read back: a python int, or None for a row without one (null;
    NaN where numpy / torch / pandas formatting turned a column holding nulls into floats). Such a
    column's other digests come back as floats too (float32 or float64, rounded): returned as that
    float, for `digest_matches`."""
    if stored is None:
        return None
    if hasattr(stored, "detach"):  # torch tensor, no torch import here
        stored = stored.detach().cpu().numpy()
    v = np.asarray(stored).reshape(-1)[0] if not isinstance(stored, int) else stored
    if isinstance(v, (float, np.floating)):
        return None if np.isnan(v) else v
    return int(v)


def digest_matches(found: int, stored: Union[int, np.floating]) -> bool:
    """Whether digest ``found`` (of the row's pixel data) is the stored one: exactly for an int;
    for a digest read back as a float (`digest_value`), to that float's precision (two units in
    its last place), all a rounded copy can tell - never a false alarm about damage."""
    if not isinstance(stored, (float, np.floating)):
        return found == stored
    eps = np.finfo(np.asarray(stored).dtype).eps
    return abs(float(found) - float(stored)) <= 2 * eps * max(abs(float(found)), 1.0)


def stored_backend(value: Any, row: Any = None) -> str:
    """A stored ``image_backend`` value, checked (`mmpipe.images.backends.BACKENDS`); None
    (rows without the column: PIL rows and rows of older mmpipe) -> ``"pil"``."""
    value = "pil" if value is None else value.decode() if isinstance(value, bytes) else value
    if value not in BACKENDS:
        raise InputError(f"unknown image backend {value!r}", row=row, column="image_backend", stage="validate",
                         expected=" or ".join(map(repr, BACKENDS)), found=repr(value),
                         fix="re-encode the row (Encoder(image_backend=...))")
    return value


# ---- checks ---------------------------------------------------------------------------
def _pixel_columns(columns: tuple, fmt: str) -> list:
    """The declared ``columns`` that hold the stored pixels of pixel format ``fmt``."""
    return [c for c in columns if not callable(c) and fmt in c.pixels and c.name in PIXEL_COLUMNS.get(fmt, ())]


def stored_pixel_digest(r) -> Optional[int]:
    """The ``pixel_digest`` a row of ``r``'s kind and pixel format stores (None where it stores
    none): the digest of its stored pixel columns, or of its source files."""
    fmt, columns = r.pixel_format, r.fam.media.COLUMNS
    if fmt == "none" or DIGEST not in columns:
        return None
    if fmt == "source":
        return sources_digest(r.image_sources)
    return pixel_digest(*(getattr(r, c.name) for c in _pixel_columns(columns, fmt)))


def digested_columns(r) -> str:
    """The stored pixel column(s) the row's digest covers (those whose ``rows`` layout holds
    rows), for error messages."""
    if r.pixel_format == "source":
        return "image_sources"
    cols = _pixel_columns(r.fam.media.COLUMNS, r.pixel_format)
    return " / ".join([c.name for c in cols if c.rows is None or len(getattr(r, c.rows))] or
                      [c.name for c in cols[:1]])


REENCODE = "re-encode the row with mmpipe.encode"  # the fix of a stored row that does not hold together


def stored_row_error(message: str, row: Any, column: str, expected: Any = None, found: Any = None, *,
                     fix: Optional[str] = REENCODE, error: type = InputError, **kw) -> InputError:
    """The error of a stored row that does not hold together, at the validate stage: ``message``,
    its row and column, expected vs found, and ``fix`` (default `REENCODE`); ``error``: the
    `InputError` class (`PixelDataError` for pixels vs layouts); ``kw``: ``column_in_location``."""
    return error(message, row=row, column=column, stage="validate", expected=expected, found=found, fix=fix, **kw)


def check_token_shapes(r, row, *, stage: str = "validate", fix: str = REENCODE) -> None:
    """Every [L] field of ``r`` (``attention_mask``, ``mm_token_type_ids``, ``labels``, each
    ``sequence`` key) holds L values and ``position_ids`` is [*POSITION_ROWS, L]; else an
    `InputError` naming the field, at ``stage``."""
    L = r.num_tokens
    fields = [("attention_mask", r.attention_mask), ("mm_token_type_ids", r.mm_token_type_ids),
              ("labels", r.labels), *r.sequence.items(), ("position_ids", r.position_ids)]
    for name, arr in fields:
        want = (*r.fam.media.POSITION_ROWS, L) if name == "position_ids" else (L,)
        if arr is not None and arr.shape != want:
            raise InputError(f"{name} does not line up with input_ids", row=row, column=name, stage=stage,
                             expected=f"shape {want}", found=f"shape {arr.shape}", fix=fix)
