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
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pyarrow as pa

from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.families import GENERIC_FAMILY, ModelFamily, get_family
from mmpipe.records.codec import (
    digest_matches, digest_value, digested_columns, pixel_rows, read_row, stored_pixel_digest, write_columns,
)
from mmpipe.records.columns import KIND_TYPES, NULLABLE_ROW_COLUMNS, ROW_COLUMNS, empty_rows, row_column_wanted
from mmpipe.records.display_hooks import Displayed
from mmpipe.records.media_layout import MediaLayout

if TYPE_CHECKING:  # the processor kind's layout type; records import no strategy at load time
    from mmpipe.records.processor_layout import ProcessorLayout


def row_family(name: Any, row: Any = None) -> ModelFamily:
    """The family a stored row names in its ``family`` column; an unknown (or non-string) name
    is bad data: an `InputError` naming the row and the column, stage "validate"."""
    try:
        return get_family(name)
    except (ValueError, TypeError) as e:
        raise InputError(str(e), row=row, column="family", stage="validate", expected="a known family name",
                         found=f"{name!r:.80}",
                         fix="re-encode the row with this model's processor") from None


class FamilyRecord:
    """A record that names its family in ``family`` (a `mmpipe.families` name): its table, shared
    by the row and the batch."""

    @property
    def fam(self) -> ModelFamily:
        """The `ModelFamily` table of ``family``."""
        return get_family(self.family)

    @property
    def family_table(self) -> ModelFamily:
        """`fam`, by its longer name."""
        return self.fam


class ProcessorOutputs:
    """What a record of the processor kind derives from its ``layout`` (`ProcessorLayout`) and its
    ``vision`` outputs; None / () for the other kinds (shared by the row and the batch)."""

    @property
    def processor_class(self) -> Optional[str]:
        """Kind ``processor``: the transformers class of the processor that encoded the rows."""
        return None if self.layout is None else self.layout.processor_class

    @property
    def row_keys(self) -> tuple:
        """Kind ``processor``: the ``vision`` keys whose axis 0 is the row."""
        return () if self.layout is None else tuple(k for k in self.layout.row_keys if k in self.vision)


@dataclass(eq=False)
class MultiModalInputs(FamilyRecord, ProcessorOutputs, Displayed):
    """One encoded row, of any family (`mmpipe.families.ModelFamily`; its ``kind`` picks the
    media strategy, `mmpipe.media`, that stores and checks the media fields).

    The text part every family has (L tokens):
        input_ids:          int64 [L], image/video placeholders already expanded.
        attention_mask:     int64 [L] (all ones for an unpadded row).
        mm_token_type_ids:  int64 [L], 0 text, 1 image, 2 video (tiles: 1 at feature tokens).
        position_ids:       int64 [3, L]: M-RoPE (t, h, w) for the patch-grid families (the text
                            family repeats its 1-D positions on the 3 rows); int64 [L]
                            ``0..L-1`` for the 1-D families (tiles, processor kinds).
        rope_delta:         int, ``max(position_ids) + 1 - L``.
        labels:             int64 [L] or None, -100 except assistant response tokens.
        family:             model family name (``mmpipe.families.ALL_FAMILIES``).

    Per image (I images), its layout in the family's form:
        image_grid_thw:     int64 [I, 3] patch grid (t, h, w) (kind ``patches``).
        image_hw:           int64 [I, 2] upright (height, width) (kinds ``tiles``, ``processor``).
        tiles_per_image:    int64 [I] (kind ``tiles``).
    Pixel storage (``pixel_format``: "uint8", "float32", "source" or "none"):
        pixel_values_u8:    uint8 [N, 3*p*p] patches (one temporal copy), or [N, S, S, 3] tiles.
        pixel_values:       float32 [N, 3*T*p*p] as the processor returns it (kind ``patches``).
        image_sources:      pixels="source": each image's encoded file (bytes [I]).
        image_backend:      ``"pil"`` or ``"torchvision"``: the image-processor backend whose resize
                            and float values the pixels reproduce (`mmpipe.images.backends`).
        images_kwargs:      tiles: the encoder's ``images_kwargs`` (e.g. pan-and-scan), or None.
    Videos (kind ``patches``; V videos, Nv patches):
        video_grid_thw int64 [V, 3], second_per_grid_ts float32 [V],
        pixel_values_videos float32 [Nv, 3*T*p*p], pixel_values_videos_u8 uint8 [Nv, 3*T*p*p].
    Processor-defined outputs (kind ``processor``), typed by ``layout`` (`ProcessorLayout`):
        sequence:           other int64 [L] outputs by name (``token_type_ids``, ...).
        vision:             the other outputs by name (processor dtypes and shapes: float32
                            ``pixel_values``, ``pixel_attention_mask``, ``cross_attention_mask``...).
        layout:             the processor's `ProcessorLayout` (its class, keys, dtypes, roles).
        audio_sources:      ``audio="source"``: each audio clip's file bytes [A] (its audio outputs,
                            ``layout.audio``, are computed at collate by the processor's own call).
    """

    _html_kind = "row_html"  # a class attribute, not a field: the `Displayed` renderer

    input_ids: np.ndarray
    attention_mask: Optional[np.ndarray] = None
    mm_token_type_ids: Optional[np.ndarray] = None
    position_ids: Optional[np.ndarray] = None
    rope_delta: int = 0
    family: str = ""
    labels: Optional[np.ndarray] = None
    image_grid_thw: np.ndarray = field(default_factory=lambda: empty_rows(3, np.int64))
    image_hw: Optional[np.ndarray] = None
    tiles_per_image: Optional[np.ndarray] = None
    pixel_values: Optional[np.ndarray] = None
    pixel_values_u8: Optional[np.ndarray] = None
    video_grid_thw: np.ndarray = field(default_factory=lambda: empty_rows(3, np.int64))
    second_per_grid_ts: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    pixel_values_videos: Optional[np.ndarray] = None
    pixel_values_videos_u8: Optional[np.ndarray] = None
    image_backend: str = "pil"
    image_sources: Optional[list] = None  # pixels="source": encoded file bytes per image [I]
    images_kwargs: Optional[dict] = None
    sequence: dict = field(default_factory=dict)
    vision: dict = field(default_factory=dict)
    layout: Optional["ProcessorLayout"] = None  # kind "processor": the processor's outputs, typed
    audio_sources: Optional[list] = None  # kind "processor", audio="source": audio file bytes per clip [A]

    def __post_init__(self) -> None:
        if not self.family and self.layout is not None:
            self.family = GENERIC_FAMILY
        if not self.family:
            raise ArgumentError("MultiModalInputs needs family= (a mmpipe.families name)")
        L = len(self.input_ids)
        if self.attention_mask is None:
            self.attention_mask = np.ones(L, np.int64)
        if self.mm_token_type_ids is None:
            self.mm_token_type_ids = np.zeros(L, np.int64)
        if self.position_ids is None:
            self.position_ids = np.arange(L, dtype=np.int64)

    # ---- derived facts -------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_images(self) -> int:
        """Images of the row (from the family's per-image layout)."""
        if self.image_hw is not None:
            return int(self.image_hw.shape[0])
        if self.tiles_per_image is not None:
            return int(self.tiles_per_image.shape[0])
        return int(self.image_grid_thw.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.video_grid_thw.shape[0])

    def media_layout(self, modality: str = "image") -> "MediaLayout":
        """Each image's (``modality="video"``: video's) layout in one typed form for every kind
        of family (`mmpipe.records.media_layout.MediaLayout`: grid, size, tiles, tokens)."""
        return MediaLayout.of(self, modality)

    @property
    def num_image_patches(self) -> int:
        return pixel_rows(self.image_grid_thw)

    @property
    def num_video_patches(self) -> int:
        return pixel_rows(self.video_grid_thw)

    @property
    def pixel_format(self) -> str:
        if self.image_sources is not None:
            return "source"
        if self.pixel_values_u8 is not None or self.pixel_values_videos_u8 is not None:
            return "uint8"
        if self.pixel_values is not None or self.pixel_values_videos is not None or self.vision:
            return "float32"
        return "none"

    @property
    def has_pixels(self) -> bool:
        """Stored pixels (uint8 or float32) or, for the tiles kind, stored source files (the
        pixel formats of the kind's ``HAS_PIXELS``)."""
        return self.pixel_format in self.fam.media.HAS_PIXELS

    # ---- checks --------------------------------------------------------------------
    def validate(self, row: Optional[int] = None) -> "MultiModalInputs":
        """Check every invariant a model relies on; raise `InputError` (`PixelDataError` when
        pixels, layouts and media tokens disagree) naming the row and column, stage "validate"
        (`mmpipe.collate` reports them at its own stage, "collate")."""
        self.fam.media.validate(self, row)
        return self

    # ---- conversion ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, row: Any = None, *, verify_pixels: bool = False) -> "MultiModalInputs":
        """Build from an encoded row as stored (Arrow/datasets python, numpy or torch format),
        of any family (the ``family`` column picks the media strategy).

        ``verify_pixels``: recompute the digest of the stored pixel data and compare it with the
        row's ``pixel_digest`` column (a `PixelDataError` when a byte changed after encoding;
        rows without a digest are not checked; the tiles and processor kinds always check)."""
        if isinstance(d, cls):
            return d
        try:
            family = d["family"]
        except (KeyError, TypeError, IndexError):
            raise InputError(
                "no 'family' column; this is not a row produced by mmpipe.encode", row=row, column="family",
                stage="validate", expected="a 'family' column", found=f"no 'family' in a {type(d).__name__}",
                fix="encode the raw row with mmpipe.encode",
            ) from None
        return read_row(cls, d, row_family(family, row), row, verify_pixels=verify_pixels)

    def stored_pixel_digest(self) -> Optional[int]:
        """The ``pixel_digest`` column `to_dict` writes for this row (None without pixels)."""
        return stored_pixel_digest(self)

    def verify_pixel_digest(self, stored: Any, row: Any = None) -> None:
        """Raise `PixelDataError` when this row's pixel data no longer hash to ``stored``."""
        found, want = self.stored_pixel_digest(), digest_value(stored)
        if found is not None and want is not None and not digest_matches(found, want):
            raise PixelDataError(
                f"the stored pixel data hash to {found & (2**64 - 1):#018x} but the row's pixel_digest says "
                f"{int(want) & (2**64 - 1):#018x}: bytes changed after encoding (disk or copy damage, or an edit)",
                row=row, column=digested_columns(self), stage="validate",
                expected=f"pixel data hashing to {int(want) & (2**64 - 1):#018x}", found=f"{found & (2**64 - 1):#018x}",
                fix="re-encode the row (or restore the file from a good copy)",
            )

    def to_dict(self) -> dict[str, Any]:
        """The row as stored: numpy arrays in the Arrow storage dtypes (see `arrow_schema`).

        Only the columns of this row's family kind and pixel format are present, so every row
        that one ``encode`` call produces has the same columns (what ``datasets`` needs): the
        kind's ``COLUMNS`` (`mmpipe.records.codec.write_columns`)."""
        return write_columns(self, self.fam.media.COLUMNS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiModalInputs):
            return NotImplemented
        return not self.diff(other)

    def equals(self, other: "MultiModalInputs") -> bool:
        """Same fields, shapes and values (`diff` is empty)."""
        return not self.diff(other)

    def diff(self, other: "MultiModalInputs") -> list[str]:
        """Names of the fields (and ``sequence`` / ``vision`` keys) that differ (exact values,
        dtype-insensitive). The ``layout`` is compared through ``processor_class`` and
        ``row_keys``; a family compares equal to the families it `accepts`."""
        out = [] if self.fam.accepts(other.family) else ["family"]
        for f in fields(self):
            if f.name in ("family", "layout"):
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, dict) or isinstance(b, dict):
                a, b = a or {}, b or {}
                if f.name in ("sequence", "vision"):
                    out += sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not _same(a[k], b[k]))
                elif a != b:
                    out.append(f.name)
            elif a is None or b is None:
                if a is not b:
                    out.append(f.name)
            elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not _same(np.asarray(a), np.asarray(b)):
                    out.append(f.name)
            elif a != b:
                out.append(f.name)
        if self.processor_class != other.processor_class:
            out.append("processor_class")
        if set(self.row_keys) != set(other.row_keys):
            out.append("row_keys")
        # the per-row settings and sources first, then the arrays (the order stays stable)
        first = ("family", "processor_class", "row_keys", "image_sources", "audio_sources", "images_kwargs",
                 "image_backend")
        return sorted(out, key=lambda n: (n not in first, first.index(n) if n in first else 0))

    def __repr__(self) -> str:
        layout = self.fam.media.layout_repr(self)
        return (f"MultiModalInputs(family={self.family!r}, tokens={self.num_tokens}, images={self.num_images} "
                f"{layout}, pixels={self.pixel_format}, labels={'yes' if self.labels is not None else 'no'}, "
                f"rope_delta={self.rope_delta})")

    # ---- schemas -------------------------------------------------------------------
    @staticmethod
    def arrow_schema(pixel_format: Optional[str] = None, labels: bool = True,
                     kind: Optional[str] = "patches") -> pa.Schema:
        """Arrow schema of stored rows of one family kind (`mmpipe.media`; default the patch-grid
        families'), ``kind=None``: the union of every kind's columns (each column's doc says
        which kinds write it; what ``schemas/multimodal_inputs.json`` publishes).
        ``pixel_format=None`` gives every pixel column. The processor kind's own output columns
        (named by its ``generic_layout``) are not listed."""
        cols = [c for c in ROW_COLUMNS if row_column_wanted(c[0], pixel_format, labels, kind)]
        return pa.schema([pa.field(name, KIND_TYPES.get((kind, name), typ), nullable=name in NULLABLE_ROW_COLUMNS,
                                   metadata={"doc": doc}) for name, typ, doc in cols])

    @staticmethod
    def features(pixel_format: Optional[str] = None, labels: bool = True, kind: Optional[str] = "patches"):
        """`datasets.Features` of stored rows (same columns as `arrow_schema`)."""
        import datasets

        return datasets.Features.from_arrow_schema(MultiModalInputs.arrow_schema(pixel_format, labels, kind))


def _same(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
    return (a is None) == (b is None) and (a is None or (a.shape == b.shape and np.array_equal(a, b)))
