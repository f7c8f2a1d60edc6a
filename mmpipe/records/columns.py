"""Stored-column codecs shared by every record: the Arrow columns of an encoded row (with
their dtypes and docs), array coercion with located errors, cumulative offsets, and the
compact uint8 pixel bytes (raw bytes + one ``0xFF`` end marker). Stage: records (validate).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyarrow as pa
import xxhash

from mmpipe.errors import ArgumentError, InputError, PixelDataError

PIXEL_FORMATS = ("uint8", "float32", "none")
# What an encoder may store: the formats above, or "source" (layout + each image's encoded file
# bytes in the optional "image_sources" column; collate decodes them: mmpipe.encoding.sources).
ENCODE_PIXEL_FORMATS = PIXEL_FORMATS + ("source",)


IGNORE_INDEX = -100
ERROR_COLUMN = "mmpipe_error"  # encode(on_error="skip"): the JSON record of a failed row, "" on good rows


def to_numpy(value) -> np.ndarray:
    """A torch tensor (any device, no torch import here) or any array-like -> numpy. A float
    tensor in a dtype numpy lacks (a bf16 model's ``bfloat16`` logprobs or values, float8) comes
    back float32, which holds each of its values exactly (as `mmpipe.rollout.results` reads
    logprobs and the encoder a processor's bf16 outputs)."""
    if not hasattr(value, "detach"):
        return np.asarray(value)
    t = value.detach().cpu()
    try:
        return t.numpy()
    except TypeError:  # "Got unsupported ScalarType BFloat16"
        if not t.is_floating_point():
            raise
        return t.float().numpy()
IMAGE_PLACEHOLDER = "<image>"  # one image in verl-style raw text (and in ReMA's question column)
VIDEO_PLACEHOLDER = "<video>"  # one video in verl-style raw text
AUDIO_PLACEHOLDER = "<audio>"  # one audio clip in raw prompt text (LLaMA-Factory / ms-swift style)


def offsets(counts) -> np.ndarray:
    """Counts [B] -> cumulative offsets int64 [B+1] (``offsets[b]:offsets[b+1]`` is row b's range)."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def as_array(value, dtype, ndim: int, name: str, row: Any = None) -> np.ndarray:
    """Any array-like (list, numpy, torch) -> numpy of `dtype` with `ndim` dims, or an
    `InputError` naming the row and column (missing, not numeric, fractional ids, wrong rank)."""
    if value is None:
        raise InputError(f"column {name!r} is missing", row=row, column=name, stage="validate",
                         expected=f"{ndim}-D array", found="None",
                         fix="re-encode the row with mmpipe.encode")
    if hasattr(value, "detach"):  # torch tensor, no torch import needed here; bfloat16 read as float32
        value = to_numpy(value)
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise InputError(f"column {name!r}: not a rectangular array ({e})", row=row, column=name,
                         stage="validate", expected=f"a rectangular {ndim}-D array", found="ragged nested lists",
                         fix="re-encode the row with mmpipe.encode") from None
    if arr.size == 0 and arr.ndim != ndim:
        arr = np.zeros((0,) * ndim, dtype=dtype)
    if arr.ndim != ndim:
        raise InputError(f"column {name!r}", row=row, column=name, stage="validate", expected=f"{ndim}-D array",
                         found=f"shape {arr.shape}", fix="re-encode the row with mmpipe.encode")
    if arr.size and arr.dtype.kind not in "biuf":
        raise InputError(f"column {name!r}", row=row, column=name, stage="validate", expected="numbers",
                         found=f"dtype {arr.dtype}", fix="re-encode the row with mmpipe.encode")
    if np.dtype(dtype).kind in "iu" and arr.dtype.kind == "f" and arr.size and not np.array_equal(arr, np.round(arr)):
        # casting would silently truncate ids/positions/grids: never guess
        raise InputError(f"column {name!r}", row=row, column=name, stage="validate", expected="integers",
                         found=f"fractional {arr.dtype} values", fix="re-encode the row with mmpipe.encode")
    return arr.astype(dtype, copy=False)


def fit_width(arr: np.ndarray, width: int, name: str, row: Any) -> np.ndarray:
    """``arr`` [n, width] (an empty array becomes [0, width]); a wrong width is an error, never a reshape."""
    if arr.size == 0:
        return arr.reshape(0, width)
    if arr.shape[1] != width:
        raise InputError(f"column {name!r}", row=row, column=name, stage="validate",
                         expected=f"rows of {width} values", found=f"shape {arr.shape}",
                         fix="re-encode the row with mmpipe.encode")
    return arr


def empty_rows(width: int, dtype: Any) -> np.ndarray:
    """An empty ``[0, width]`` array of ``dtype`` (a record's default for "no images")."""
    return np.zeros((0, width), dtype=dtype)


END_MARKER = 0xFF


def u8_block(value: Any, n_patches: int, width: int, name: str, row: Any) -> np.ndarray:
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
            raise PixelDataError(
                "the pixel data and the grids disagree or the bytes were altered", row=row, column=name,
                column_in_location=True, stage="validate", found=f"{buf.size} bytes",
                expected=f"{want} pixel bytes ({n_patches} patches x {width}) plus the end marker",
                fix="re-encode the row",
            )
        arr = buf[:-1]
    else:
        arr = as_array(value, np.uint8, np.ndim(value) or 1, name, row)
    if arr.size != want:
        raise PixelDataError(
            "the pixel data and the grids disagree", row=row, column=name, column_in_location=True, stage="validate",
            expected=f"{n_patches} patches x {width} = {want} values", found=f"{arr.size} values",
            fix="re-encode the row",
        )
    return arr.reshape(n_patches, width)


_END = bytes([END_MARKER])


def u8_bytes(arr) -> bytes:
    """uint8 array -> its bytes plus the end marker, in one copy."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    return b"".join((memoryview(arr).cast("B"), _END)) if arr.size else _END


GRID_TYPE = pa.list_(pa.list_(pa.int32()))  # [n, 3]; datasets stores numpy [n, 3] as nested lists


ROW_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("input_ids", pa.list_(pa.int32()), "int [L] token ids, placeholders expanded"),
    ("attention_mask", pa.list_(pa.int8()), "int [L] 1 for real tokens"),
    ("mm_token_type_ids", pa.list_(pa.int8()), "int [L] 0 text, 1 image, 2 video"),
    ("position_ids", pa.list_(pa.list_(pa.int32())), "int [3, L] M-RoPE positions (t, h, w)"),
    ("rope_delta", pa.int32(), "int max(position)+1-L"),
    ("labels", pa.list_(pa.int32()), "int [L] -100 except assistant response tokens"),
    ("image_grid_thw", GRID_TYPE, "int [I, 3] patch grid per image"),
    ("video_grid_thw", GRID_TYPE, "int [V, 3] patch grid per video"),
    ("second_per_grid_ts", pa.list_(pa.float32()), "float32 [V] seconds per temporal grid step"),
    ("pixel_values", pa.list_(pa.list_(pa.float32())), "float32 [N, 3*T*p*p] processor pixel_values"),
    ("pixel_values_videos", pa.list_(pa.list_(pa.float32())), "float32 [Nv, 3*T*p*p]"),
    ("pixel_values_u8", pa.binary(), "uint8 [N, 3*p*p] raw bytes + one 0xFF end marker: resized image in patch order, one temporal copy "
                                     "(kind tiles: list<uint8> [N*S*S*3], the resized tiles, flat)"),
    ("pixel_values_videos_u8", pa.binary(), "uint8 [Nv, 3*T*p*p] raw bytes + one 0xFF end marker: resized video frames in patch order"),
    ("family", pa.string(), "model family name (mmpipe.families.ALL_FAMILIES): qwen2_vl, qwen2_5_vl, qwen3_vl, "
                            "glm4v, text (kind patches); gemma3, internvl, llava_onevision (tiles); generic (processor)"),
    ("image_hw", pa.list_(pa.int64()), "kinds tiles, processor: int64 [2*I] each image's upright (height, width), flat"),
    ("tiles_per_image", pa.list_(pa.int64()), "kind tiles: int64 [I] tiles of each image"),
    ("tile_hw", pa.list_(pa.int64()), "kind tiles with pixels: int64 [2] (S, S), the tile size of pixel_values_u8"),
    ("images_kwargs", pa.string(), "kind tiles: the encoder's images_kwargs as JSON (e.g. pan-and-scan), when given"),
    ("generic_layout", pa.string(), "kind processor: the processor's ProcessorLayout as JSON (its class, its sequence "
                                    "keys, its vision keys with dtype and ndim, its row keys); each key is a column"),
    ("generic_shapes", pa.list_(pa.list_(pa.int64())), "kind processor: each vision key's shape in this row "
                                                       "(layout order; [0] where the row has none)"),
    ("pixel_digest", pa.int64(), "xxh3-64 (as a signed int64) of the stored pixel data (image then video bytes, end markers excluded; "
                                  "float32 values as little-endian bytes; pixels='source': each file's length and bytes); null in rows written without one (older mmpipe)"),
]


NULLABLE_ROW_COLUMNS = {"labels", "pixel_values", "pixel_values_videos", "pixel_values_u8", "pixel_values_videos_u8",
                        "pixel_digest", "image_hw", "tiles_per_image", "tile_hw", "images_kwargs", "generic_layout",
                        "generic_shapes"}


# Columns a stored row carries only when it needs them (not part of every row's schema).
OPTIONAL_ROW_COLUMNS: dict[str, str] = {
    "image_backend": "string 'torchvision': the image-processor backend the pixels reproduce and collate expands "
                     "them with (mmpipe.images.backends); absent for PIL-backend rows",
    "image_sources": "list<binary> [I] pixels='source' rows: each image's encoded file bytes, decoded and resized "
                     "at collate time (mmpipe.encoding.sources)",
    "audio_sources": "list<binary> [A] generic-path rows encoded with audio='source': each audio clip's file bytes "
                     "(a float WAV for clips given as samples); collate runs the processor's audio call on them",
}


# the optional columns holding each item's source file (Python lists of bytes in a stored row's dict)
SOURCE_LIST_COLUMNS, SOURCE_LIST_TYPE = ("image_sources", "audio_sources"), pa.list_(pa.binary())


PIXEL_COLUMNS = {
    "uint8": ("pixel_values_u8", "pixel_values_videos_u8", "pixel_digest"),
    "float32": ("pixel_values", "pixel_values_videos", "pixel_digest"),
    "source": ("pixel_digest",),  # + the optional image_sources column
    "none": (),
}


def pixel_digest(*blocks: Optional[np.ndarray]) -> int:
    """xxh3-64, as a signed 64-bit int (what Arrow and datasets infer for Python ints), of a row's stored pixel data: the blocks' bytes back to back (uint8 pixels, or
    float32 values as little-endian bytes), a None block counting as empty. About 10 GB/s:
    negligible next to decoding an image. The digest of what the writer stored, so a byte
    flipped on disk or in a copy is caught when `validate_dataset` (or
    ``Collator(verify_pixels=True)``) reads the row back."""
    h = xxhash.xxh3_64()
    for block in blocks:
        if block is not None and block.size:
            a = np.ascontiguousarray(block)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            h.update(memoryview(a).cast("B"))
    d = h.intdigest()
    return d - (1 << 64) if d >= 1 << 63 else d


STORED_PIXEL_COLUMN = {"uint8": "pixel_values_u8", "float32": "pixel_values", "source": "image_sources"}


def stored_pixel_format(column_names) -> str:
    """The pixel format of a stored dataset from its column names: "uint8", "float32",
    "source", "none", or "mixed" (pixel columns of several formats)."""
    names = set(column_names)
    found = [fmt for fmt, col in STORED_PIXEL_COLUMN.items() if col in names]
    return found[0] if len(found) == 1 else "mixed" if found else "none"


def sources_digest(sources: list) -> int:
    """`pixel_digest` of a ``pixels="source"`` row: each source's length (int64) then its bytes,
    so bytes moved from one image's file to the next change the digest too."""
    blocks = []
    for b in sources:
        blocks += [np.asarray([len(b)], dtype="<i8"), np.frombuffer(bytes(b), dtype=np.uint8)]
    return pixel_digest(*blocks)


# The family kinds (mmpipe.media) that write each column; a column not named here: every kind.
COLUMN_KINDS: dict[str, frozenset] = {
    **{c: frozenset({"patches"}) for c in ("position_ids", "rope_delta", "image_grid_thw", "video_grid_thw",
                                           "second_per_grid_ts", "pixel_values", "pixel_values_videos",
                                           "pixel_values_videos_u8")},
    "image_hw": frozenset({"tiles", "processor"}),
    **{c: frozenset({"tiles"}) for c in ("tiles_per_image", "tile_hw", "images_kwargs")},
    **{c: frozenset({"processor"}) for c in ("generic_layout", "generic_shapes")},
}
KIND_TYPES = {("tiles", "pixel_values_u8"): pa.list_(pa.uint8()),  # the same column, stored flat per kind
              ("tiles", "mm_token_type_ids"): pa.list_(pa.int8())}


def row_column_wanted(name: str, pixel_format: Optional[str], labels: bool, kind: Optional[str] = "patches") -> bool:
    """Whether stored rows of family ``kind`` (None: any), ``pixel_format`` (None: any) and
    ``labels`` have column ``name``."""
    if kind is not None and kind not in COLUMN_KINDS.get(name, {kind}):
        return False
    if kind == "processor" and name in ("mm_token_type_ids", "pixel_values_u8", "pixel_digest"):
        return False  # the processor's own outputs are its columns (generic_layout names them)
    if name == "labels":
        return labels
    if pixel_format is None:
        return True
    if pixel_format not in PIXEL_COLUMNS:
        raise ArgumentError(f"pixel_format must be one of {tuple(PIXEL_COLUMNS)}, got {pixel_format!r}")
    all_pixel = {c for cols in PIXEL_COLUMNS.values() for c in cols}
    return name not in all_pixel or name in PIXEL_COLUMNS[pixel_format]



def from_arrow_scalar(value):
    """An Arrow scalar (what a map's output holds for the source columns, `SOURCE_LIST_TYPE`) as
    its Python value; anything else as it is."""
    return value.as_py() if isinstance(value, pa.Scalar) else value


def source_list(value, n_images: int, row: Any = None) -> Optional[list]:
    """A stored ``image_sources`` value -> list of ``bytes`` [I], one per image of the row (None: None)."""
    if value is None:
        return None
    value = from_arrow_scalar(value)
    if isinstance(value, (bytes, str)) or not hasattr(value, "__len__"):
        raise InputError("column 'image_sources'", row=row, column="image_sources", stage="validate",
                         expected="a list of bytes", found=type(value).__name__,
                         fix="re-encode the row with pixels='source'")
    out = [bytes(b) for b in value]
    if len(out) != n_images:
        raise InputError(f"column 'image_sources': {len(out)} sources for {n_images} images", row=row,
                         column="image_sources", stage="validate", expected=f"{n_images} sources",
                         found=str(len(out)), fix="re-encode the row with pixels='source'")
    return out
