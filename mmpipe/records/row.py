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

from mmpipe.errors import InputError, PixelDataError
from mmpipe.families import ModelFamily, get_family
from mmpipe.records.columns import (
    NULLABLE_ROW_COLUMNS,
    ROW_COLUMNS,
    as_array,
    empty_rows,
    f32_or_empty,
    fit_width,
    pixel_digest,
    row_column_wanted,
    source_list,
    sources_digest,
    u8_block,
    u8_bytes,
    u8_or_empty,
)
from mmpipe.records.display_hooks import render
from mmpipe.images.backends import BACKENDS


def stored_backend(value: Any, row: Any = None) -> str:
    """A stored ``image_backend`` value, checked (`mmpipe.images.backends.BACKENDS`); None
    (rows without the column: PIL rows and rows of older mmpipe) -> ``"pil"``."""
    value = "pil" if value is None else value.decode() if isinstance(value, bytes) else value
    if value not in BACKENDS:
        raise InputError(f"unknown image backend {value!r}", row=row, column="image_backend", stage="validate",
                         expected=" or ".join(map(repr, BACKENDS)), found=repr(value),
                         fix="re-encode the row (Encoder(image_backend=...))")
    return value


def row_family(name: Any, row: Any = None) -> ModelFamily:
    """The family a stored row names in its ``family`` column; an unknown (or non-string) name
    is bad data: an `InputError` naming the row and the column, stage "validate"."""
    try:
        return get_family(name)
    except (ValueError, TypeError) as e:
        raise InputError(str(e), row=row, column="family", stage="validate",
                         fix="re-encode the row with this model's processor") from None


@dataclass(eq=False)
class MultiModalInputs:
    """One encoded row.

    Attributes (L tokens, I images, N image patches, V videos, Nv video patches):
        input_ids:          int64 [L], image/video placeholders already expanded.
        attention_mask:     int64 [L] (all ones for an unpadded row).
        mm_token_type_ids:  int64 [L], 0 text, 1 image, 2 video.
        position_ids:       int64 [3, L], M-RoPE (t, h, w), the row layout of `mmpipe.records`.
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
        image_backend:      ``"pil"`` or ``"torchvision"``: the transformers image-processor
                            backend whose resize and float values the image pixels reproduce
                            (`mmpipe.images.backends`); stored only when not ``"pil"``. Images
                            only; videos always follow the video processor's torchvision rule
                            (`VisionSpec.for_videos`).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    mm_token_type_ids: np.ndarray
    position_ids: np.ndarray
    rope_delta: int
    family: str
    labels: Optional[np.ndarray] = None
    image_grid_thw: np.ndarray = field(default_factory=lambda: empty_rows(3, np.int64))
    pixel_values: Optional[np.ndarray] = None
    pixel_values_u8: Optional[np.ndarray] = None
    video_grid_thw: np.ndarray = field(default_factory=lambda: empty_rows(3, np.int64))
    second_per_grid_ts: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    pixel_values_videos: Optional[np.ndarray] = None
    pixel_values_videos_u8: Optional[np.ndarray] = None
    image_backend: str = "pil"
    image_sources: Optional[list] = None  # pixels="source": encoded file bytes per image [I]

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
        if self.image_sources is not None:
            return "source"
        if self.pixel_values_u8 is not None or self.pixel_values_videos_u8 is not None:
            return "uint8"
        if self.pixel_values is not None or self.pixel_values_videos is not None:
            return "float32"
        return "none"

    @property
    def has_pixels(self) -> bool:
        return self.pixel_format not in ("none", "source")

    # ---- checks --------------------------------------------------------------------
    def validate(self, row: Optional[int] = None) -> "MultiModalInputs":
        """Check every invariant a model relies on; raise `InputError` (`PixelDataError` when
        pixels, grids and media tokens disagree) naming the row and column, stage "validate"
        (`mmpipe.collate` reports them at its own stage, "collate")."""
        self._check_token_shapes(row)
        self._check_media_tokens(row)
        self._check_pixel_shapes(row)
        return self

    def _check_token_shapes(self, row: Optional[int]) -> None:
        L = self.num_tokens
        shapes = [(name, (L,)) for name in ("attention_mask", "mm_token_type_ids")]
        if self.labels is not None:
            shapes.append(("labels", (L,)))
        shapes.append(("position_ids", (3, L)))
        for name, want in shapes:
            if getattr(self, name).shape != want:
                raise InputError(row=row, column=name, column_in_location=True, stage="validate",
                                 expected=f"shape {want}", found=getattr(self, name).shape,
                                 fix="re-encode the row with mmpipe.encode")
        bad_type = np.flatnonzero((self.mm_token_type_ids < 0) | (self.mm_token_type_ids > 2))
        if len(bad_type):
            raise InputError(
                row=row, column="mm_token_type_ids", column_in_location=True, stage="validate",
                expected="0 (text), 1 (image) or 2 (video)",
                found=f"{int(self.mm_token_type_ids[bad_type[0]])} at token {int(bad_type[0])}", fix="re-encode the row",
            )

    def _check_media_tokens(self, row: Optional[int]) -> None:
        fam = self.fam
        for kind, code, grid in (("image", 1, self.image_grid_thw), ("video", 2, self.video_grid_thw)):
            n_tok = int((self.mm_token_type_ids == code).sum())
            expect = fam.num_tokens(grid)
            if n_tok != expect:
                raise PixelDataError(
                    f"{n_tok} {kind} tokens in input_ids but {kind}_grid_thw {grid.tolist()} "
                    f"needs sum(t*h*w)/{fam.merge_area} = {expect}; the text and the {kind} data disagree "
                    f"(truncated or appended without its pixels?)", row=row, stage="validate",
                    column=f"{kind}_grid_thw", fix="re-encode the row",
                )

    def _check_pixel_shapes(self, row: Optional[int]) -> None:
        fam = self.fam
        checks = (
            ("pixel_values", self.pixel_values, self.num_image_patches, fam.patch_dim),
            ("pixel_values_u8", self.pixel_values_u8, self.num_image_patches, fam.patch_dim_u8),
            ("pixel_values_videos", self.pixel_values_videos, self.num_video_patches, fam.patch_dim),
            ("pixel_values_videos_u8", self.pixel_values_videos_u8, self.num_video_patches, fam.patch_dim),
        )
        for name, arr, n, d in checks:
            if arr is not None and arr.shape != (n, d):
                raise PixelDataError(
                    row=row, column=name, column_in_location=True, stage="validate",
                    expected=f"shape ({n}, {d}) from the grids and the {fam.name} patch size",
                    found=tuple(arr.shape), fix="re-encode the row with mmpipe.encode",
                )

    # ---- conversion ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, row: Any = None, *, verify_pixels: bool = False) -> "MultiModalInputs":
        """Build from an encoded row as stored (Arrow/datasets python, numpy or torch format).

        ``verify_pixels``: recompute the digest of the stored pixel data and compare it with the
        row's ``pixel_digest`` column (a `PixelDataError` when a byte changed after encoding;
        rows without a digest are not checked)."""
        if isinstance(d, cls):
            return d
        try:
            family = d["family"]
        except KeyError:
            raise InputError(
                "no 'family' column; this is not a row produced by mmpipe.encode", row=row, column="family",
                stage="validate", fix="encode the raw row with mmpipe.encode",
            ) from None
        fam = row_family(family, row)
        ids = as_array(d.get("input_ids"), np.int64, 1, "input_ids", row)
        L = ids.shape[0]
        pos = as_array(d.get("position_ids"), np.int64, 2, "position_ids", row)
        if d.get("rope_delta") is None:  # older layouts: derive it (0 would shift every image row's generation)
            delta = np.asarray([int(pos.max()) + 1 - L if pos.size else 0])
        else:
            delta = as_array(d["rope_delta"], np.int64, np.ndim(d["rope_delta"]), "rope_delta", row).reshape(-1)
        if delta.size != 1:
            raise InputError(f"column 'rope_delta': expected one integer, found {delta.size} values", row=row,
                             column="rope_delta", stage="validate", fix="re-encode the row with mmpipe.encode")
        kw: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=as_array(d.get("attention_mask", np.ones(L)), np.int64, 1, "attention_mask", row),
            mm_token_type_ids=as_array(d.get("mm_token_type_ids", np.zeros(L)), np.int64, 1, "mm_token_type_ids", row),
            position_ids=pos,
            rope_delta=int(delta[0]),
            family=fam.name, image_backend=stored_backend(d.get("image_backend"), row),
        )
        if d.get("labels") is not None:
            kw["labels"] = as_array(d["labels"], np.int64, 1, "labels", row)
        for name in ("image_grid_thw", "video_grid_thw"):
            if d.get(name) is not None:
                kw[name] = fit_width(as_array(d[name], np.int64, 2, name, row), 3, name, row)
        if d.get("second_per_grid_ts") is not None:
            kw["second_per_grid_ts"] = as_array(d["second_per_grid_ts"], np.float32, 1, "second_per_grid_ts", row)
        if d.get("pixel_values") is not None:
            kw["pixel_values"] = fit_width(as_array(d["pixel_values"], np.float32, 2, "pixel_values", row),
                                        fam.patch_dim, "pixel_values", row)
        if d.get("pixel_values_videos") is not None and len(kw.get("video_grid_thw", ())):
            kw["pixel_values_videos"] = fit_width(as_array(
                d["pixel_values_videos"], np.float32, 2, "pixel_values_videos", row
            ), fam.patch_dim, "pixel_values_videos", row)
        n_img = int(kw["image_grid_thw"].prod(axis=1).sum()) if "image_grid_thw" in kw else 0
        n_vid = int(kw["video_grid_thw"].prod(axis=1).sum()) if "video_grid_thw" in kw else 0
        if d.get("pixel_values_u8") is not None:
            kw["pixel_values_u8"] = u8_block(d["pixel_values_u8"], n_img, fam.patch_dim_u8, "pixel_values_u8", row)
        if d.get("pixel_values_videos_u8") is not None and n_vid:
            kw["pixel_values_videos_u8"] = u8_block(d["pixel_values_videos_u8"], n_vid, fam.patch_dim,
                                                    "pixel_values_videos_u8", row)
        kw["image_sources"] = source_list(d.get("image_sources"), len(kw.get("image_grid_thw", ())), row)
        out = cls(**kw)
        if verify_pixels and d.get("pixel_digest") is not None:
            out.verify_pixel_digest(d["pixel_digest"], row)
        return out

    def stored_pixel_digest(self) -> Optional[int]:
        """The ``pixel_digest`` column `to_dict` writes for this row (None without pixels)."""
        fmt = self.pixel_format
        if fmt == "uint8":
            return pixel_digest(self.pixel_values_u8, self.pixel_values_videos_u8)
        if fmt == "float32":
            return pixel_digest(self.pixel_values, self.pixel_values_videos)
        if fmt == "source":
            return sources_digest(self.image_sources)
        return None

    def verify_pixel_digest(self, stored: Any, row: Any = None) -> None:
        """Raise `PixelDataError` when this row's pixel data no longer hash to ``stored``."""
        found = self.stored_pixel_digest()
        want = int(np.asarray(stored).reshape(-1)[0]) if not isinstance(stored, int) else stored
        if found is not None and found != want:
            col = self._pixel_columns()
            raise PixelDataError(
                f"the stored pixel data hash to {found & (2**64 - 1):#018x} but the row's pixel_digest says {want & (2**64 - 1):#018x}: "
                "bytes changed after encoding (disk or copy damage, or an edit)", row=row, column=col,
                stage="validate", fix="re-encode the row (or restore the file from a good copy)",
            )

    def _pixel_columns(self) -> str:
        """The stored pixel column(s) the row's digest covers, for error messages."""
        fmt = self.pixel_format
        if fmt == "source":
            return "image_sources"
        suffix = "_u8" if fmt == "uint8" else ""
        cols = [f"pixel_values{suffix}"] * bool(self.num_images) + [f"pixel_values_videos{suffix}"] * bool(self.num_videos)
        return " / ".join(cols) or f"pixel_values{suffix}"

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
            out["pixel_values_u8"] = u8_bytes(u8_or_empty(self.pixel_values_u8, fam.patch_dim_u8))
            out["pixel_values_videos_u8"] = u8_bytes(u8_or_empty(self.pixel_values_videos_u8, fam.patch_dim))
        elif fmt == "float32":
            fam = self.fam
            out["pixel_values"] = f32_or_empty(self.pixel_values, fam.patch_dim)
            out["pixel_values_videos"] = f32_or_empty(self.pixel_values_videos, fam.patch_dim)
        if fmt == "source":
            out["image_sources"] = [bytes(b) for b in self.image_sources]
        if fmt != "none":
            out["pixel_digest"] = np.int64(self.stored_pixel_digest())
            if self.image_backend != "pil":  # PIL rows keep the layout of before (no column)
                out["image_backend"] = self.image_backend
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
        """Jupyter display: thumbnails and the token strip (`mmpipe.view.row_html`, found
        through `mmpipe.records.display_hooks`)."""
        return render("row_html", self)

    def describe(self, *, tokenizer: Any = None) -> str:
        """Plain-text description for terminals (`mmpipe.view.describe`)."""
        return render("describe", self, tokenizer=tokenizer)

    # ---- schemas -------------------------------------------------------------------
    @staticmethod
    def arrow_schema(pixel_format: Optional[str] = None, labels: bool = True) -> pa.Schema:
        """Arrow schema of stored rows. ``pixel_format=None`` gives every column (the union)."""
        cols = [c for c in ROW_COLUMNS if row_column_wanted(c[0], pixel_format, labels)]
        return pa.schema(
            [pa.field(name, typ, nullable=name in NULLABLE_ROW_COLUMNS, metadata={"doc": doc}) for name, typ, doc in cols]
        )

    @staticmethod
    def features(pixel_format: Optional[str] = None, labels: bool = True):
        """`datasets.Features` of stored rows (same columns as `arrow_schema`)."""
        import datasets

        return datasets.Features.from_arrow_schema(MultiModalInputs.arrow_schema(pixel_format, labels))


