"""The typed records every stage speaks: one row (`MultiModalInputs`) and one batch
(`BatchedMultiModalInputs`), with their Arrow schemas and `datasets.Features`.

Data flow::

    raw row --encode--> MultiModalInputs --(Arrow rows)--> collate --> BatchedMultiModalInputs
                              ^                                              |
                              +------------------unbatch---------------------+

Pixel storage of a row is one of three modes (``MultiModalInputs.pixel_format``):

- ``"uint8"`` (default, compact): ``pixel_values_u8`` holds the *resized* image's pixels in
  patch order, ONE temporal copy, uint8 ``[N, 3*p*p]``. float32 ``pixel_values`` equal to
  the transformers processor's are produced at collate time (8x smaller on disk).
- ``"float32"``: ``pixel_values`` float32 ``[N, 3*T*p*p]`` exactly as the processor returns.
- ``"none"``: layout only (ids, grids, positions from image sizes, no pixels).

In Arrow, ``pixel_values_u8`` is one ``binary`` value per row (all its images' patches,
then one ``0xFF`` end marker): its shape follows from ``image_grid_thw`` and the family's
patch size; bytes cost no per-patch offsets and read back as one buffer (50x faster than a
``list<uint8>`` under datasets' python formatting, which builds a Python int per byte).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from .errors import InputError
from .families import ModelFamily, get_family

PIXEL_FORMATS = ("uint8", "float32", "none")
IGNORE_INDEX = -100


def _as_np(value, dtype, ndim: int, name: str, row: Any = None) -> np.ndarray:
    """Any array-like (list, numpy, torch) -> numpy of `dtype` with `ndim` dims, or an
    `InputError` naming the row and column (missing, not numeric, fractional ids, wrong rank)."""
    if value is None:
        raise InputError(f"column {name!r} is missing", row=row, column=name, stage="validate",
                         fix="re-encode the row with mmpipe.encode")
    if hasattr(value, "detach"):  # torch tensor, no torch import needed here
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise InputError(f"column {name!r}: not a rectangular array ({e})", row=row, column=name,
                         stage="validate", fix="re-encode the row with mmpipe.encode") from None
    if arr.size == 0 and arr.ndim != ndim:
        arr = np.zeros((0,) * ndim, dtype=dtype)
    if arr.ndim != ndim:
        raise InputError(f"column {name!r}: expected {ndim}-D array, found shape {arr.shape}", row=row,
                         column=name, stage="validate", fix="re-encode the row with mmpipe.encode")
    if arr.size and arr.dtype.kind not in "biuf":
        raise InputError(f"column {name!r}: expected numbers, found dtype {arr.dtype}", row=row, column=name,
                         stage="validate", fix="re-encode the row with mmpipe.encode")
    if np.dtype(dtype).kind in "iu" and arr.dtype.kind == "f" and arr.size and not np.array_equal(arr, np.round(arr)):
        # casting would silently truncate ids/positions/grids: never guess
        raise InputError(f"column {name!r}: expected integers, found fractional {arr.dtype} values", row=row,
                         column=name, stage="validate", fix="re-encode the row with mmpipe.encode")
    return arr.astype(dtype, copy=False)


def _width(arr: np.ndarray, width: int, name: str, row: Any) -> np.ndarray:
    """``arr`` [n, width] (an empty array becomes [0, width]); a wrong width is an error, never a reshape."""
    if arr.size == 0:
        return arr.reshape(0, width)
    if arr.shape[1] != width:
        raise InputError(f"column {name!r}: expected rows of {width} values, found shape {arr.shape}", row=row,
                         column=name, stage="validate", fix="re-encode the row with mmpipe.encode")
    return arr


def _empty2(width: int, dtype) -> np.ndarray:
    return np.zeros((0, width), dtype=dtype)


@dataclass(eq=False)
class MultiModalInputs:
    """One encoded row.

    Attributes (L tokens, I images, N image patches, V videos, Nv video patches):
        input_ids:          int64 [L], image/video placeholders already expanded.
        attention_mask:     int64 [L] (all ones for an unpadded row).
        mm_token_type_ids:  int64 [L], 0 text, 1 image, 2 video.
        position_ids:       int64 [3, L], M-RoPE (t, h, w); text-only families: 3 equal rows.
        rope_delta:         int, ``max(position_ids) + 1 - L``.
        labels:             int64 [L] or None, -100 except assistant response tokens.
        image_grid_thw:     int64 [I, 3], patch grid (t, h, w) per image.
        pixel_values:       float32 [N, 3*T*p*p] or None (pixel_format "float32").
        pixel_values_u8:    uint8 [N, 3*p*p] or None (pixel_format "uint8").
        video_grid_thw:     int64 [V, 3].
        second_per_grid_ts: float32 [V].
        pixel_values_videos:    float32 [Nv, 3*T*p*p] or None.
        pixel_values_videos_u8: uint8 [Nv, 3*T*p*p] or None (frames differ, so all T kept).
        family:             model family name (``mmpipe.families``).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    mm_token_type_ids: np.ndarray
    position_ids: np.ndarray
    rope_delta: int
    family: str
    labels: Optional[np.ndarray] = None
    image_grid_thw: np.ndarray = field(default_factory=lambda: _empty2(3, np.int64))
    pixel_values: Optional[np.ndarray] = None
    pixel_values_u8: Optional[np.ndarray] = None
    video_grid_thw: np.ndarray = field(default_factory=lambda: _empty2(3, np.int64))
    second_per_grid_ts: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    pixel_values_videos: Optional[np.ndarray] = None
    pixel_values_videos_u8: Optional[np.ndarray] = None

    # ---- derived facts -------------------------------------------------------------
    @property
    def fam(self) -> ModelFamily:
        return get_family(self.family)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_images(self) -> int:
        return int(self.image_grid_thw.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.video_grid_thw.shape[0])

    @property
    def num_image_patches(self) -> int:
        return int(self.image_grid_thw.prod(axis=1).sum()) if self.num_images else 0

    @property
    def num_video_patches(self) -> int:
        return int(self.video_grid_thw.prod(axis=1).sum()) if self.num_videos else 0

    @property
    def pixel_format(self) -> str:
        if self.pixel_values_u8 is not None or self.pixel_values_videos_u8 is not None:
            return "uint8"
        if self.pixel_values is not None or self.pixel_values_videos is not None:
            return "float32"
        return "none"

    @property
    def has_pixels(self) -> bool:
        return self.pixel_format != "none"

    # ---- checks --------------------------------------------------------------------
    def validate(self, row: Any = None) -> "MultiModalInputs":
        """Check every invariant a model relies on; raise ValueError naming the row."""
        where = f"row {row}" if row is not None else "row"
        fam = self.fam
        L = self.num_tokens
        for name in ("attention_mask", "mm_token_type_ids") + (("labels",) if self.labels is not None else ()):
            if getattr(self, name).shape != (L,):
                raise ValueError(f"{where}, column {name!r}: expected shape ({L},), found {getattr(self, name).shape}")
        if self.position_ids.shape != (3, L):
            raise ValueError(f"{where}, column 'position_ids': expected shape (3, {L}), found {self.position_ids.shape}")
        bad_type = np.flatnonzero((self.mm_token_type_ids < 0) | (self.mm_token_type_ids > 2))
        if len(bad_type):
            raise ValueError(
                f"{where}, column 'mm_token_type_ids': expected 0 (text), 1 (image) or 2 (video), found "
                f"{int(self.mm_token_type_ids[bad_type[0]])} at token {int(bad_type[0])} - re-encode the row"
            )
        m2 = fam.merge_size**2
        for kind, code, grid in (("image", 1, self.image_grid_thw), ("video", 2, self.video_grid_thw)):
            n_tok = int((self.mm_token_type_ids == code).sum())
            expect = int(grid.prod(axis=1).sum()) // m2 if len(grid) else 0
            if n_tok != expect:
                raise ValueError(
                    f"{where}: {n_tok} {kind} tokens in input_ids but {kind}_grid_thw {grid.tolist()} "
                    f"needs sum(t*h*w)/{m2} = {expect}; the text and the {kind} data disagree "
                    f"(truncated or appended without its pixels?) - re-encode the row"
                )
        checks = (
            ("pixel_values", self.pixel_values, self.num_image_patches, fam.patch_dim),
            ("pixel_values_u8", self.pixel_values_u8, self.num_image_patches, fam.patch_dim_u8),
            ("pixel_values_videos", self.pixel_values_videos, self.num_video_patches, fam.patch_dim),
            ("pixel_values_videos_u8", self.pixel_values_videos_u8, self.num_video_patches, fam.patch_dim),
        )
        for name, arr, n, d in checks:
            if arr is not None and arr.shape != (n, d):
                raise ValueError(
                    f"{where}, column {name!r}: expected shape ({n}, {d}) from the grids "
                    f"and the {fam.name} patch size, found {tuple(arr.shape)}"
                )
        return self

    # ---- conversion ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, row: Any = None) -> "MultiModalInputs":
        """Build from an encoded row as stored (Arrow/datasets python, numpy or torch format)."""
        if isinstance(d, cls):
            return d
        try:
            family = d["family"]
        except KeyError:
            raise InputError(
                "no 'family' column; this is not a row produced by mmpipe.encode", row=row, column="family",
                stage="validate", fix="encode the raw row with mmpipe.encode",
            ) from None
        try:
            fam = get_family(family)
        except (ValueError, TypeError) as e:
            raise InputError(str(e), row=row, column="family", stage="validate",
                             fix="re-encode the row with this model's processor") from None
        ids = _as_np(d.get("input_ids"), np.int64, 1, "input_ids", row)
        L = ids.shape[0]
        pos = _as_np(d.get("position_ids"), np.int64, 2, "position_ids", row)
        if d.get("rope_delta") is None:  # older layouts: derive it (0 would shift every image row's generation)
            delta = np.asarray([int(pos.max()) + 1 - L if pos.size else 0])
        else:
            delta = _as_np(d["rope_delta"], np.int64, np.ndim(d["rope_delta"]), "rope_delta", row).reshape(-1)
        if delta.size != 1:
            raise InputError(f"column 'rope_delta': expected one integer, found {delta.size} values", row=row,
                             column="rope_delta", stage="validate", fix="re-encode the row with mmpipe.encode")
        kw: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=_as_np(d.get("attention_mask", np.ones(L)), np.int64, 1, "attention_mask", row),
            mm_token_type_ids=_as_np(d.get("mm_token_type_ids", np.zeros(L)), np.int64, 1, "mm_token_type_ids", row),
            position_ids=pos,
            rope_delta=int(delta[0]),
            family=fam.name,
        )
        if d.get("labels") is not None:
            kw["labels"] = _as_np(d["labels"], np.int64, 1, "labels", row)
        for name in ("image_grid_thw", "video_grid_thw"):
            if d.get(name) is not None:
                kw[name] = _width(_as_np(d[name], np.int64, 2, name, row), 3, name, row)
        if d.get("second_per_grid_ts") is not None:
            kw["second_per_grid_ts"] = _as_np(d["second_per_grid_ts"], np.float32, 1, "second_per_grid_ts", row)
        if d.get("pixel_values") is not None:
            kw["pixel_values"] = _width(_as_np(d["pixel_values"], np.float32, 2, "pixel_values", row),
                                        fam.patch_dim, "pixel_values", row)
        if d.get("pixel_values_videos") is not None and len(kw.get("video_grid_thw", ())):
            kw["pixel_values_videos"] = _width(_as_np(
                d["pixel_values_videos"], np.float32, 2, "pixel_values_videos", row
            ), fam.patch_dim, "pixel_values_videos", row)
        n_img = int(kw["image_grid_thw"].prod(axis=1).sum()) if "image_grid_thw" in kw else 0
        n_vid = int(kw["video_grid_thw"].prod(axis=1).sum()) if "video_grid_thw" in kw else 0
        if d.get("pixel_values_u8") is not None:
            kw["pixel_values_u8"] = _u8_block(d["pixel_values_u8"], n_img, fam.patch_dim_u8, "pixel_values_u8", row)
        if d.get("pixel_values_videos_u8") is not None and n_vid:
            kw["pixel_values_videos_u8"] = _u8_block(
                d["pixel_values_videos_u8"], n_vid, fam.patch_dim, "pixel_values_videos_u8", row
            )
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The row as stored: numpy arrays in the Arrow storage dtypes (see `arrow_schema`).

        Only the columns of this row's pixel format are present, so every row that one
        ``encode`` call produces has the same columns (what ``datasets`` needs).
        """
        out: dict[str, Any] = {
            "input_ids": self.input_ids.astype(np.int32),
            "attention_mask": self.attention_mask.astype(np.int8),
            "mm_token_type_ids": self.mm_token_type_ids.astype(np.int8),
            "position_ids": self.position_ids.astype(np.int32),
            "rope_delta": np.int32(self.rope_delta),
            "image_grid_thw": self.image_grid_thw.astype(np.int32),
            "video_grid_thw": self.video_grid_thw.astype(np.int32),
            "second_per_grid_ts": self.second_per_grid_ts.astype(np.float32),
            "family": self.family,
        }
        if self.labels is not None:
            out["labels"] = self.labels.astype(np.int32)
        fmt = self.pixel_format
        if fmt == "uint8":
            fam = self.fam
            out["pixel_values_u8"] = _u8_bytes(_u8_or_empty(self.pixel_values_u8, fam.patch_dim_u8))
            out["pixel_values_videos_u8"] = _u8_bytes(_u8_or_empty(self.pixel_values_videos_u8, fam.patch_dim))
        elif fmt == "float32":
            fam = self.fam
            out["pixel_values"] = _f32_or_empty(self.pixel_values, fam.patch_dim)
            out["pixel_values_videos"] = _f32_or_empty(self.pixel_values_videos, fam.patch_dim)
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiModalInputs):
            return NotImplemented
        return not self.diff(other)

    def diff(self, other: "MultiModalInputs") -> list[str]:
        """Names of the fields that differ (exact comparison, dtype-insensitive)."""
        out = []
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a is None or b is None:
                if a is not b:
                    out.append(f.name)
            elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                a, b = np.asarray(a), np.asarray(b)
                if a.shape != b.shape or not np.array_equal(a, b):
                    out.append(f.name)
            elif a != b:
                out.append(f.name)
        return out

    def __repr__(self) -> str:
        return (
            f"MultiModalInputs(family={self.family!r}, tokens={self.num_tokens}, "
            f"images={self.num_images} grids={self.image_grid_thw.tolist()}, "
            f"videos={self.num_videos}, pixels={self.pixel_format}, "
            f"labels={'yes' if self.labels is not None else 'no'}, rope_delta={self.rope_delta})"
        )

    def _repr_html_(self) -> str:
        """Jupyter display: thumbnails and the token strip (`mmpipe.display.row_html`)."""
        from .display import row_html

        return row_html(self)

    def describe(self, *, tokenizer=None) -> str:
        """Plain-text description for terminals (`mmpipe.display.describe`)."""
        from .display import describe

        return describe(self, tokenizer=tokenizer)

    # ---- schemas -------------------------------------------------------------------
    @staticmethod
    def arrow_schema(pixel_format: Optional[str] = None, labels: bool = True) -> pa.Schema:
        """Arrow schema of stored rows. ``pixel_format=None`` gives every column (the union)."""
        cols = [c for c in ROW_COLUMNS if _row_column_wanted(c[0], pixel_format, labels)]
        return pa.schema(
            [pa.field(name, typ, nullable=name in _NULLABLE_ROW, metadata={"doc": doc}) for name, typ, doc in cols]
        )

    @staticmethod
    def features(pixel_format: Optional[str] = None, labels: bool = True):
        """`datasets.Features` of stored rows (same columns as `arrow_schema`)."""
        import datasets

        return datasets.Features.from_arrow_schema(MultiModalInputs.arrow_schema(pixel_format, labels))


END_MARKER = 0xFF


def _u8_block(value, n_patches: int, width: int, name: str, row) -> np.ndarray:
    """Stored compact pixels -> uint8 [n_patches, width].

    Stored as raw bytes followed by one ``0xFF`` end marker. numpy/torch formatting of a
    binary column goes through numpy's fixed-width ``S`` dtype, which strips trailing NUL
    bytes; with the marker the buffer never ends in NUL, so nothing is stripped and a
    length mismatch is always a real error. Arrays/lists (already decoded) are accepted too.
    """
    want = n_patches * width
    if isinstance(value, (bytes, bytearray, memoryview)):
        buf = np.frombuffer(bytes(value), dtype=np.uint8)
        if buf.size != want + 1 or buf[-1] != END_MARKER:
            raise ValueError(
                f"row {row}, column {name!r}: {buf.size} bytes, expected {want} pixel bytes "
                f"({n_patches} patches x {width}) plus the end marker; the pixel data and the grids "
                "disagree or the bytes were altered - re-encode the row"
            )
        arr = buf[:-1]
    else:
        arr = _as_np(value, np.uint8, np.ndim(value) or 1, name, row)
    if arr.size != want:
        raise ValueError(
            f"row {row}, column {name!r}: {arr.size} values but the grids need {n_patches} patches x {width} "
            f"= {want}; the pixel data and the grids disagree - re-encode the row"
        )
    return arr.reshape(n_patches, width)


_END = bytes([END_MARKER])


def _u8_bytes(arr) -> bytes:
    """uint8 array -> its bytes plus the end marker, in one copy."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    return b"".join((memoryview(arr).cast("B"), _END)) if arr.size else _END


def _u8_or_empty(arr, width):
    return arr if arr is not None else np.zeros((0, width), np.uint8)


def _f32_or_empty(arr, width):
    return arr if arr is not None else np.zeros((0, width), np.float32)


# ---- stored rows straight from Arrow ------------------------------------------------------
def _list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) list array -> (offsets [n+1] into values, values as numpy), zero-copy."""
    return arr.offsets.to_numpy(), _values_np(arr.values)


def list_lengths(column) -> np.ndarray:
    """Per-row lengths of an Arrow list column (Array or ChunkedArray), int64 [n]; a null
    row counts 0. Reads the offsets only: no value is decoded."""
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray) and column.num_chunks == 0:
        return np.zeros(0, np.int64)
    return pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _values_np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)  # zero-copy for primitive values without nulls


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A (possibly sliced) binary array -> (offsets [n+1] into data, data uint8), zero-copy."""
    large = pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], np.int64 if large else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return off, data


def rows_from_arrow(table) -> list["MultiModalInputs"]:
    """Stored rows as an Arrow table (or record batch) -> `MultiModalInputs`, reading the
    column buffers directly: token columns and compact pixels are numpy views of the Arrow
    memory (no Python object per token or byte), checked like `MultiModalInputs.from_dict`.

    ``table``: what ``dataset.with_format("arrow")[indices]`` returns for a dataset made by
    ``mmpipe.encode`` (see `mmpipe.collate.ArrowRows`)."""
    if isinstance(table, pa.Table):
        # a gathered table is often many small chunks (slices of the memory-mapped file):
        # read chunk by chunk rather than copy them into one
        rows = []
        for batch in table.to_batches():
            rows += _rows_from_batch(batch, len(rows))
        return rows
    return _rows_from_batch(table, 0)


def _need_list(c: pa.Array, name: str, depth: int) -> bool:
    """Check ``c`` is a list column ``depth`` levels deep; False when the inner level is
    untyped (``list<null>``) and empty in every row (then the rows are empty)."""
    t = c.type
    for level in range(depth):
        if pa.types.is_null(t) and level and len(c) == 0:
            return False
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise InputError(f"column {name!r}: expected a {depth}-level list, found {c.type}", where="", column=name,
                             stage="validate", fix="check the table with mmpipe.validate_dataset")
        c, t = c.values, t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or (pa.types.is_null(t) and len(c) == 0)):
        raise InputError(f"column {name!r}: expected numbers, found {c.type if depth == 0 else t}", where="",
                         column=name, stage="validate", fix="check the table with mmpipe.validate_dataset")
    return True


def _rows_from_batch(table: pa.RecordBatch, first_row: int) -> list["MultiModalInputs"]:
    names = set(table.schema.names)
    if "family" not in names:
        raise ValueError("no 'family' column; this is not a table of rows produced by mmpipe.encode")
    n = table.num_rows

    def col(name):
        return table.column(name)

    def lists(name):
        if name not in names:
            return None
        c = col(name)
        _need_list(c, name, 1)
        off, vals = _list_parts(c)
        valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
        return off, vals, valid, c

    families = col("family").to_pylist()
    ids = lists("input_ids")
    if ids is None:
        raise ValueError("no 'input_ids' column; this is not a table of rows produced by mmpipe.encode")
    per_row = {k: lists(k) for k in ("attention_mask", "mm_token_type_ids", "labels", "second_per_grid_ts")}
    nested = {}
    for k in ("position_ids", "image_grid_thw", "video_grid_thw", "pixel_values", "pixel_values_videos"):
        if k in names:
            c = col(k)
            valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
            # row b's values: the inner lists of outer entries off[b]..off[b+1], back to back
            typed = _need_list(c, k, 2)
            outer = c.offsets.to_numpy()
            if typed:
                inner = c.values.offsets.to_numpy()
                nested[k] = (inner[outer], _values_np(c.values.values), valid, len(c.values))
            else:  # every row empty, typed list<null> by a writer that saw no values
                nested[k] = (np.zeros_like(outer), np.zeros(0, np.int64), valid, 0)
    blobs = {}
    for k in ("pixel_values_u8", "pixel_values_videos_u8"):
        if k in names:
            c = col(k)
            if not (pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type)):
                raise InputError(f"column {k!r}: expected binary (pixel bytes + end marker), found {c.type}",
                                 where="", column=k, stage="validate",
                                 fix="mmpipe.validate_dataset(ds, fix=True) converts older list<uint8> layouts")
            valid = None if c.null_count == 0 else ~np.asarray(c.is_null())
            blobs[k] = (*_binary_parts(c), valid)
    deltas = col("rope_delta").to_numpy(zero_copy_only=False) if "rope_delta" in names else None

    def take(entry, b):
        off, vals, valid, _ = entry
        if valid is not None and not valid[b]:
            return None
        return vals[off[b]:off[b + 1]]

    rows = []
    for b in range(n):
        d: dict[str, Any] = {"family": families[b], "input_ids": take(ids, b)}
        if deltas is not None:  # else from_dict derives it from the positions
            d["rope_delta"] = deltas[b]
        if d["input_ids"] is None:
            raise InputError("column 'input_ids' is null", row=first_row + b, column="input_ids", stage="validate",
                             fix="re-encode the row with mmpipe.encode")
        L = d["input_ids"].shape[0]
        for k, entry in per_row.items():
            if entry is not None:
                d[k] = take(entry, b)
        for k, (off, vals, valid, _) in nested.items():
            if valid is not None and not valid[b]:
                continue
            v = vals[off[b]:off[b + 1]]
            if k == "position_ids":
                width = L
            elif k.endswith("grid_thw"):
                width = 3
            else:
                width = get_family(d["family"]).patch_dim
            if width and v.size % width:
                raise ValueError(
                    f"row {first_row + b}, column {k!r}: {v.size} values are not rows of {width}; "
                    "the stored row is damaged - re-encode it"
                )
            d[k] = v.reshape(-1, width) if width else np.zeros((3, 0), v.dtype)
        for k, (off, data, valid) in blobs.items():
            if valid is not None and not valid[b]:
                continue
            block = data[off[b]:off[b + 1]]
            if block.size == 0 or block[-1] != END_MARKER:
                raise ValueError(
                    f"row {first_row + b}, column {k!r}: {block.size} bytes without the 0xFF end marker; the bytes were "
                    "altered or not written by mmpipe - re-encode the row"
                )
            d[k] = block[:-1]
        rows.append(MultiModalInputs.from_dict(d, row=first_row + b))
    return rows


_GRID = pa.list_(pa.list_(pa.int32()))  # [n, 3]; datasets stores numpy [n, 3] as nested lists
ROW_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("input_ids", pa.list_(pa.int32()), "int [L] token ids, placeholders expanded"),
    ("attention_mask", pa.list_(pa.int8()), "int [L] 1 for real tokens"),
    ("mm_token_type_ids", pa.list_(pa.int8()), "int [L] 0 text, 1 image, 2 video"),
    ("position_ids", pa.list_(pa.list_(pa.int32())), "int [3, L] M-RoPE positions (t, h, w)"),
    ("rope_delta", pa.int32(), "int max(position)+1-L"),
    ("labels", pa.list_(pa.int32()), "int [L] -100 except assistant response tokens"),
    ("image_grid_thw", _GRID, "int [I, 3] patch grid per image"),
    ("video_grid_thw", _GRID, "int [V, 3] patch grid per video"),
    ("second_per_grid_ts", pa.list_(pa.float32()), "float32 [V] seconds per temporal grid step"),
    ("pixel_values", pa.list_(pa.list_(pa.float32())), "float32 [N, 3*T*p*p] processor pixel_values"),
    ("pixel_values_videos", pa.list_(pa.list_(pa.float32())), "float32 [Nv, 3*T*p*p]"),
    ("pixel_values_u8", pa.binary(), "uint8 [N, 3*p*p] raw bytes + one 0xFF end marker: resized image in patch order, one temporal copy"),
    ("pixel_values_videos_u8", pa.binary(), "uint8 [Nv, 3*T*p*p] raw bytes + one 0xFF end marker: resized video frames in patch order"),
    ("family", pa.string(), "model family name: qwen2_vl, qwen2_5_vl, qwen3_vl, text"),
]
_NULLABLE_ROW = {"labels", "pixel_values", "pixel_values_videos", "pixel_values_u8", "pixel_values_videos_u8"}
_PIXEL_COLUMNS = {
    "uint8": ("pixel_values_u8", "pixel_values_videos_u8"),
    "float32": ("pixel_values", "pixel_values_videos"),
    "none": (),
}


def _row_column_wanted(name: str, pixel_format: Optional[str], labels: bool) -> bool:
    if name == "labels":
        return labels
    if pixel_format is None:
        return True
    if pixel_format not in _PIXEL_COLUMNS:
        raise ValueError(f"pixel_format must be one of {PIXEL_FORMATS}, got {pixel_format!r}")
    all_pixel = {c for cols in _PIXEL_COLUMNS.values() for c in cols}
    return name not in all_pixel or name in _PIXEL_COLUMNS[pixel_format]


@dataclass(eq=False)
class BatchedMultiModalInputs:
    """A padded batch of B rows (torch tensors).

    Attributes (L = padded length, I = images in the batch, N = their patches):
        input_ids:          int64 [B, L]
        attention_mask:     int64 [B, L]
        mm_token_type_ids:  int64 [B, L]
        position_ids:       int64 [3, B, L] M-RoPE (pads 0); `model_inputs(positions="verl")`
                            gives the [4, B, L] form with the plain text row first.
        rope_deltas:        int64 [B, 1]
        labels:             int64 [B, L] or None (-100 on pads)
        pixel_values:       float32 [N, 3*T*p*p] or None (no image in the batch / no pixels)
        image_grid_thw:     int64 [I, 3]
        image_offsets:      int64 [B+1]; row b owns images image_offsets[b]:image_offsets[b+1]
        patch_offsets:      int64 [B+1]; row b owns pixel rows patch_offsets[b]:patch_offsets[b+1]
        pixel_values_u8:    uint8 [N, 3*p*p] or None, kept when rows were compact (exact unbatch,
                            and the resized images for rollout engines)
        pixel_values_videos, video_grid_thw, second_per_grid_ts, video_offsets,
        video_patch_offsets, pixel_values_videos_u8: the same for videos.
        seq_lengths:        int64 [B], each row's unpadded length.
        row_has_labels:     bool [B], which rows carried labels.
        row_pixel_formats:  list[str] [B], each row's pixel storage (for an exact unbatch).
        spec:               the `VisionSpec` used to build float32 pixels.
        padding_side:       "left" or "right".
        family:             model family name.
        pixel_format:       the rows' pixel storage ("uint8", "float32", "none").
    """

    input_ids: Any
    attention_mask: Any
    mm_token_type_ids: Any
    position_ids: Any
    rope_deltas: Any
    image_grid_thw: Any
    image_offsets: Any
    patch_offsets: Any
    video_grid_thw: Any
    second_per_grid_ts: Any
    video_offsets: Any
    video_patch_offsets: Any
    seq_lengths: Any
    padding_side: str
    family: str
    pixel_format: str
    labels: Any = None
    pixel_values: Any = None
    pixel_values_u8: Any = None
    pixel_values_videos: Any = None
    pixel_values_videos_u8: Any = None
    row_has_labels: Any = None
    row_pixel_formats: Any = None
    spec: Any = None

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def fam(self) -> ModelFamily:
        return get_family(self.family)

    @property
    def sample_to_image_indices(self) -> list[list[int]]:
        """Per row, the indices of its images in ``image_grid_thw`` (and pixel blocks)."""
        off = self.image_offsets.tolist()
        return [list(range(off[b], off[b + 1])) for b in range(self.batch_size)]

    @property
    def sample_to_video_indices(self) -> list[list[int]]:
        off = self.video_offsets.tolist()
        return [list(range(off[b], off[b + 1])) for b in range(self.batch_size)]

    @property
    def image_to_sample(self):
        """int64 [I]: the row each image belongs to."""
        import torch

        counts = self.image_offsets[1:] - self.image_offsets[:-1]
        return torch.repeat_interleave(torch.arange(self.batch_size), counts)

    def model_inputs(self, device=None, *, positions: str = "mrope", labels: bool = True) -> dict[str, Any]:
        """Exactly the kwargs a transformers Qwen-VL (or text LLM) ``forward`` accepts.

        Pixel data goes to the device of ``input_ids`` (or ``device``). Keys without data
        (no image in the batch) are left out, so a text-only batch runs a text-only forward.
        ``positions``: ``"mrope"`` -> position_ids [3, B, L]; ``"verl"`` -> [4, B, L] with the
        plain text positions first; ``"none"`` -> let the model compute them.
        """
        from .rope import text_positions

        dev = device if device is not None else self.input_ids.device
        fam = self.fam
        out: dict[str, Any] = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if fam.is_vision:
            out["mm_token_type_ids"] = self.mm_token_type_ids
            if positions == "mrope":
                out["position_ids"] = self.position_ids
            elif positions == "verl":
                import torch

                out["position_ids"] = torch.cat([text_positions(self.attention_mask)[None], self.position_ids], 0)
            elif positions != "none":
                raise ValueError(f"positions must be 'mrope', 'verl' or 'none', got {positions!r}")
            out.update(self.vision_inputs())
        elif positions != "none":
            out["position_ids"] = self.position_ids[0]
        # a batch with no target token (RL prompts) gets no labels: the loss would be NaN
        if labels and self.labels is not None and bool((self.labels != IGNORE_INDEX).any()):
            out["labels"] = self.labels
        return {k: v.to(dev) for k, v in out.items()}

    def vision_inputs(self) -> dict[str, Any]:
        """The pixel kwargs of ``forward``, only those with data: ``pixel_values`` float32
        [N, patch_dim] + ``image_grid_thw`` int64 [I, 3] when the batch holds images, likewise
        ``pixel_values_videos`` / ``video_grid_thw`` (+ ``second_per_grid_ts`` [V] for
        Qwen2.5-VL) for videos. Empty for a text-only batch or family."""
        out: dict[str, Any] = {}
        if not self.fam.is_vision:
            return out
        if self.pixel_values is not None and self.image_grid_thw.shape[0]:
            out["pixel_values"] = self.pixel_values
            out["image_grid_thw"] = self.image_grid_thw
        if self.pixel_values_videos is not None and self.video_grid_thw.shape[0]:
            out["pixel_values_videos"] = self.pixel_values_videos
            out["video_grid_thw"] = self.video_grid_thw
            if self.fam.rope == "mrope_tps":
                out["second_per_grid_ts"] = self.second_per_grid_ts
        return out

    def __repr__(self) -> str:
        return (
            f"BatchedMultiModalInputs(family={self.family!r}, B={self.batch_size}, "
            f"L={int(self.input_ids.shape[1])}, images_per_row={[len(x) for x in self.sample_to_image_indices]}, "
            f"pixels={self.pixel_format}, padding={self.padding_side})"
        )

    def _repr_html_(self) -> str:
        """Jupyter display: per-row table, thumbnails, token strips (`mmpipe.display.batch_html`)."""
        from .display import batch_html

        return batch_html(self)

    def describe(self, *, tokenizer=None) -> str:
        """Plain-text description for terminals (`mmpipe.display.describe`)."""
        from .display import describe

        return describe(self, tokenizer=tokenizer)

    def to_arrow(self) -> pa.Table:
        """This batch as a one-row Arrow table with `arrow_schema` (for logging or shipping)."""

        def val(name):
            if name == "sample_to_image_indices":
                return self.sample_to_image_indices
            v = getattr(self, name)
            if v is None:
                return None
            return v.tolist() if hasattr(v, "tolist") else v

        schema = self.arrow_schema()
        return pa.table({f.name: pa.array([val(f.name)], type=f.type) for f in schema}, schema=schema)

    @staticmethod
    def arrow_schema() -> pa.Schema:
        """A batch as one Arrow record (for logging/shipping batches; dtypes as in torch)."""
        return pa.schema(
            [pa.field(n, t, nullable=n in _NULLABLE_BATCH, metadata={"doc": d}) for n, t, d in BATCH_COLUMNS]
        )

    @staticmethod
    def features():
        import datasets

        return datasets.Features.from_arrow_schema(BatchedMultiModalInputs.arrow_schema())


_I64_2D = pa.list_(pa.list_(pa.int64()))
BATCH_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("input_ids", _I64_2D, "int64 [B, L]"),
    ("attention_mask", _I64_2D, "int64 [B, L]"),
    ("mm_token_type_ids", _I64_2D, "int64 [B, L] 0 text, 1 image, 2 video"),
    ("position_ids", pa.list_(_I64_2D, 3), "int64 [3, B, L] M-RoPE positions, pads 0"),
    ("rope_deltas", pa.list_(pa.list_(pa.int64(), 1)), "int64 [B, 1]"),
    ("labels", _I64_2D, "int64 [B, L], -100 on non-targets and pads"),
    ("pixel_values", pa.list_(pa.list_(pa.float32())), "float32 [N, 3*T*p*p]"),
    ("pixel_values_u8", pa.list_(pa.list_(pa.uint8())), "uint8 [N, 3*p*p] compact image patches"),
    ("image_grid_thw", pa.list_(pa.list_(pa.int64(), 3)), "int64 [I, 3]"),
    ("sample_to_image_indices", pa.list_(pa.list_(pa.int64())), "per row, indices of its images"),
    ("image_offsets", pa.list_(pa.int64()), "int64 [B+1] cumulative image counts"),
    ("patch_offsets", pa.list_(pa.int64()), "int64 [B+1] cumulative image patch rows"),
    ("pixel_values_videos", pa.list_(pa.list_(pa.float32())), "float32 [Nv, 3*T*p*p]"),
    ("pixel_values_videos_u8", pa.list_(pa.list_(pa.uint8())), "uint8 [Nv, 3*T*p*p]"),
    ("video_grid_thw", pa.list_(pa.list_(pa.int64(), 3)), "int64 [V, 3]"),
    ("second_per_grid_ts", pa.list_(pa.float32()), "float32 [V]"),
    ("video_offsets", pa.list_(pa.int64()), "int64 [B+1]"),
    ("video_patch_offsets", pa.list_(pa.int64()), "int64 [B+1]"),
    ("seq_lengths", pa.list_(pa.int64()), "int64 [B] unpadded row lengths"),
    ("row_has_labels", pa.list_(pa.bool_()), "bool [B] rows that carried labels"),
    ("row_pixel_formats", pa.list_(pa.string()), "per row: uint8, float32 or none"),
    ("padding_side", pa.string(), "left or right"),
    ("family", pa.string(), "model family name"),
    ("pixel_format", pa.string(), "uint8, float32 or none"),
]
_NULLABLE_BATCH = {"labels", "pixel_values", "pixel_values_u8", "pixel_values_videos", "pixel_values_videos_u8"}
