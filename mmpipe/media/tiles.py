"""The ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision): each image resized to fixed-size
tiles, stored as uint8 [N, S, S, 3] (the resized tiles before the processor's per-pixel
normalisation; 1/4 of the float32 bytes) or, ``pixels="source"``, as its encoded file; the
family's image module (`ModelFamily.images`) gives tile counts and placeholder texts from the
image size, collate expands the tiles (`mmpipe.images.tiles.normalise_tiles`, bit-exact).
Positions are 1-D ([L], ``0..L-1``).

Stored columns: ``input_ids`` int32 [L], ``attention_mask`` int8 [L], ``labels`` int32 [L] (with
labels), ``mm_token_type_ids`` int8 [L] (1 at the family's feature tokens), ``image_hw`` int64
[2*I] (each image's upright (height, width), flat), ``tiles_per_image`` int64 [I], ``family``;
with pixels also ``pixel_values_u8`` uint8 [N*S*S*3] (flat), ``tile_hw`` int64 [2] (S, S) and
``pixel_digest``; with ``pixels="source"`` instead ``image_sources`` list<binary> [I],
``pixel_digest`` and, for a torchvision-backend processor, ``image_backend``; rows encoded with
``images_kwargs`` (e.g. Gemma 3 pan-and-scan) also ``images_kwargs`` (JSON string). Rows written
before the one-record change stored ``mm_token_type_ids`` as int32: they read back the same.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from mmpipe.errors import InputError, PixelDataError
from mmpipe.records.columns import as_array, pixel_digest, source_list, sources_digest

# the stored columns of a tiles-kind row
COLUMNS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "image_hw", "tiles_per_image",
           "family", "pixel_values_u8", "tile_hw", "image_sources", "pixel_digest", "image_backend",
           "images_kwargs")

IMAGE_LAYOUT_COLUMN = "tiles_per_image"  # the stored per-image layout (what error messages name)


def validate(r, row: Any = None) -> None:
    """Lengths line up, the tiles match ``tiles_per_image``, sources one per image."""
    def bad(column, expected, found, fix="re-encode the row with mmpipe.encode"):
        return InputError(f"{column} does not match the row", row=row, column=column, stage="validate",
                          expected=expected, found=found, fix=fix)

    n = len(r.input_ids)
    for name in ("attention_mask", "mm_token_type_ids", "labels"):
        arr = getattr(r, name)
        if arr is not None and arr.shape != (n,):
            raise bad(name, f"shape ({n},)", f"shape {arr.shape}")
    if r.position_ids.shape != (n,):
        raise bad("position_ids", f"shape ({n},)", f"shape {r.position_ids.shape}")
    if r.tiles_per_image is None or r.image_hw is None:
        raise bad("tiles_per_image", "the per-image layout (image_hw, tiles_per_image)", "none")
    if r.image_hw.shape != (len(r.tiles_per_image), 2):
        raise bad("image_hw", f"shape ({len(r.tiles_per_image)}, 2)", f"shape {r.image_hw.shape}")
    u8 = r.pixel_values_u8
    if u8 is not None and (u8.ndim != 4 or u8.shape[0] != int(r.tiles_per_image.sum()) or u8.shape[3] != 3):
        raise bad("pixel_values_u8", f"[{int(r.tiles_per_image.sum())}, S, S, 3]", f"shape {u8.shape}")
    if r.image_sources is not None and len(r.image_sources) != r.num_images:
        raise bad("image_sources", f"{r.num_images} sources", str(len(r.image_sources)))


def stored_pixel_digest(r) -> Optional[int]:
    if r.pixel_values_u8 is not None:
        return pixel_digest(r.pixel_values_u8)
    if r.image_sources is not None:
        return sources_digest(r.image_sources)
    return None


def pixel_columns(r) -> str:
    return "image_sources" if r.image_sources is not None else "pixel_values_u8"


def to_columns(r) -> dict:
    """The stored row (see the module doc)."""
    out = {"input_ids": r.input_ids.astype(np.int32), "attention_mask": r.attention_mask.astype(np.int8)}
    if r.labels is not None:
        out["labels"] = r.labels.astype(np.int32)
    out["mm_token_type_ids"] = r.mm_token_type_ids.astype(np.int8)
    out["image_hw"] = r.image_hw.astype(np.int64).reshape(-1)
    out["tiles_per_image"] = r.tiles_per_image.astype(np.int64)
    out["family"] = r.family
    if r.pixel_values_u8 is not None:
        out["pixel_values_u8"] = r.pixel_values_u8.reshape(-1)
        out["tile_hw"] = np.asarray(r.pixel_values_u8.shape[1:3], np.int64)
        out["pixel_digest"] = np.int64(pixel_digest(r.pixel_values_u8))
    if r.image_sources is not None:
        out["image_sources"] = [bytes(b) for b in r.image_sources]
        out["pixel_digest"] = np.int64(sources_digest(r.image_sources))
        if r.image_backend != "pil":
            out["image_backend"] = r.image_backend
    if r.images_kwargs:
        out["images_kwargs"] = json.dumps(r.images_kwargs, sort_keys=True)
    return out


def from_columns(cls, d: Any, fam, row: Any = None, *, verify_pixels: bool = True):
    """A stored tiles-kind row (python lists, numpy or torch formatted) -> the record. The
    stored digest is always checked (a tile byte changed after encoding is a `PixelDataError`)."""
    tiles = as_array(d.get("tiles_per_image"), np.int64, 1, "tiles_per_image", row)
    u8 = d.get("pixel_values_u8")
    if u8 is not None:
        hw = as_array(d.get("tile_hw"), np.int64, 1, "tile_hw", row)
        flat = as_array(u8, np.uint8, 1, "pixel_values_u8", row) if not isinstance(u8, (bytes, bytearray)) \
            else np.frombuffer(u8, np.uint8)
        want = int(tiles.sum()) * int(np.prod(hw)) * 3
        if flat.size != want:
            raise InputError(f"pixel_values_u8 holds {flat.size} bytes", row=row, column="pixel_values_u8",
                             stage="validate", expected=f"{want} ({int(tiles.sum())} tiles of {hw.tolist()} x 3)",
                             found=str(flat.size), fix="re-encode the row with mmpipe.encode")
        u8 = flat.reshape(int(tiles.sum()), int(hw[0]), int(hw[1]), 3)
        if d.get("pixel_digest") is not None and int(d["pixel_digest"]) != int(np.int64(pixel_digest(u8))):
            raise PixelDataError("the stored tiles do not hash to the row's pixel_digest: a byte changed after "
                                 "encoding", row=row, column="pixel_values_u8", stage="validate",
                                 fix="re-encode the row with mmpipe.encode")
    labels, sources = d.get("labels"), source_list(d.get("image_sources"), len(tiles), row)
    if sources is not None and d.get("pixel_digest") is not None and \
            int(d["pixel_digest"]) != int(np.int64(sources_digest(sources))):
        raise PixelDataError("the stored image files do not hash to the row's pixel_digest: a byte changed "
                             "after encoding", row=row, column="image_sources", stage="validate",
                             fix="re-encode the row with pixels='source'")
    kwargs = d.get("images_kwargs")
    return cls(family=fam.name, input_ids=as_array(d.get("input_ids"), np.int64, 1, "input_ids", row),
               attention_mask=as_array(d.get("attention_mask"), np.int64, 1, "attention_mask", row),
               mm_token_type_ids=as_array(d.get("mm_token_type_ids"), np.int64, 1, "mm_token_type_ids", row),
               image_hw=as_array(d.get("image_hw"), np.int64, 1, "image_hw", row).reshape(-1, 2),
               tiles_per_image=tiles, pixel_values_u8=u8, image_sources=sources,
               images_kwargs=json.loads(kwargs) if isinstance(kwargs, str) and kwargs else None,
               image_backend=str(d.get("image_backend") or "pil"),
               labels=None if labels is None else as_array(labels, np.int64, 1, "labels", row)).validate(row)


def _list_column(table, name: str, dtype) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A list column -> (values numpy of ``dtype``, offsets int64 [rows + 1]); None when absent."""
    import pyarrow as pa

    if name not in table.column_names:
        return None
    col = table.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ChunkedArray):  # zero chunks
        arr = pa.array([], type=col.type)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, offsets - offsets[0] if len(offsets) else offsets


def rows_from_arrow(cls, table) -> list:
    """Stored tiles-kind rows as one Arrow table -> records, read from the column buffers (the
    pixel bytes are numpy views, no python lists)."""
    from mmpipe.records.row import row_family

    cols = {name: _list_column(table, name, dtype) for name, dtype in (
        ("input_ids", np.int64), ("attention_mask", np.int64), ("labels", np.int64),
        ("mm_token_type_ids", np.int64), ("image_hw", np.int64), ("tiles_per_image", np.int64),
        ("pixel_values_u8", np.uint8), ("tile_hw", np.int64))}
    for name in ("input_ids", "attention_mask", "mm_token_type_ids", "image_hw", "tiles_per_image"):
        if cols[name] is None:
            raise InputError(f"column {name!r} is missing", row=0, column=name, stage="validate",
                             fix="re-encode the rows with mmpipe.encode")
    families = table.column("family").to_pylist()
    scalars = {n: table.column(n).to_pylist() for n in ("image_sources", "pixel_digest", "image_backend", "images_kwargs")
               if n in table.column_names}  # pixels="source" and images_kwargs rows
    rows = []
    for i, fam in enumerate(families):
        cell = {name: (None if c is None else c[0][c[1][i]:c[1][i + 1]]) for name, c in cols.items()}
        cell.update({n: v[i] for n, v in scalars.items()})
        rows.append(from_columns(cls, cell, row_family(fam, i), i))
    return rows


def has_pixels(r) -> bool:
    """Stored tiles, or stored source files (collate decodes and tiles those)."""
    return r.pixel_values_u8 is not None or r.image_sources is not None


def layout_repr(r) -> str:
    return f"tiles={r.tiles_per_image.tolist()}"


def position_inputs(batch, positions) -> dict:
    from mmpipe.media import one_d_position_inputs

    return one_d_position_inputs(batch, positions)


def pack_token_types(fam, token_types) -> dict:
    return {}  # handed over under the family's token_type_key by model_inputs


def model_inputs(batch, token_types) -> dict:
    """The media kwargs of a tiles family's ``forward``: the token types under the family's
    ``token_type_key`` (Gemma 3: ``token_type_ids``), ``pixel_values`` and the family's extras
    (LLaVA-OneVision ``image_sizes``) when the batch holds images with pixels."""
    fam, out = batch.fam, {}
    if fam.token_type_key is not None:
        out[fam.token_type_key] = token_types
    if batch.pixel_values is not None and batch.tiles_per_image is not None and len(batch.tiles_per_image):
        out["pixel_values"] = batch.pixel_values
        out.update(batch.extras)
    return out


# ---- rollout ----
_NO_ROLLOUT = {
    "multiturn": "encode each turn's whole conversation with mmpipe.encode and generate with TransformersEngine",
    "verl": "verl's actor reads the patch grids' multi_modal_inputs (pixel_values [N, D] + image_grid_thw) and "
            "its vLLM server their prompts, so these rows have no verl row layout here: batch them with "
            "mmpipe.Collator(processor) (BatchedMultiModalInputs.model_inputs() for the actor's forward), make "
            "rollout prompts with mmpipe.rollout.to_vllm_prompts(rows, processor)",
}


def vision_tokens(fam) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold (`mmpipe.records.vision_tokens`), by kind: the
    feature token the model fills with image features (the image's slots) and, where the chat
    template renders another token per image (Gemma 3's ``<start_of_image>``), that one: it
    opens the image's block. A stray one breaks the row's image-token count."""
    out = {"image": fam.feature_token}
    if fam.image_token != fam.feature_token:
        out["vision_start"] = fam.image_token
    return out


def rollout_refusal(fam, stage: str) -> Optional[str]:
    """Why rollout ``stage`` (`mmpipe.rollout.support.ROLLOUT_STAGES`) cannot take tiled rows
    (multi-turn appends, verl rows), or None."""
    return _NO_ROLLOUT.get(stage)


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                index: int = 0) -> dict:
    """One row -> its vLLM prompt dict: one image token per image and the row's ORIGINAL images
    (vLLM tiles them again), `mmpipe.media.tiles_rollout`. ``processor``: the one the row was
    encoded with (required); ``images``: the images the row was encoded from, or None (the
    row's stored files, or its one stored tile where that re-creates the prompt)."""
    from mmpipe.media.tiles_rollout import vllm_prompt as tiles_prompt

    return tiles_prompt(r, processor, images=images, index=index)


# ---- view ----
# What the view stage (mmpipe.view) and `mmpipe inspect` ask of this kind: token spans, span
# labels, pictures from the stored pixels, counts from the stored columns; the same names in
# every kind. The code is in mmpipe/media/tiles_view.py (this module is shared by every stage).
from mmpipe.media.tiles_view import (  # noqa: E402  (a section of its own, at the end)
    PIXEL_UNIT, STATS_COLUMNS, table_counts, view_images, view_layout, view_notes, view_size, view_spans,
    view_summary, view_video_frames,
)


# ---- encode ----
# What mmpipe.Encoder asks of this kind: its options, one image's layout and stored payload, a
# parsed row's fields, an empty row, the bytes of one image, the processor layout (none here);
# the same names in every kind. The code is in mmpipe/media/tiles_encode.py.
from mmpipe.media.tiles_encode import (  # noqa: E402  (a section of its own, at the end)
    ENCODE_OPTIONS, ENCODE_PIXELS, encode_empty, encode_image, encode_image_bytes, encode_layout, encode_row,
    encode_settings,
)


# ---- collate ----
# What mmpipe.collate / unbatch / pack ask of this kind; the same names in every kind. The code is
# in mmpipe/media/tiles_collate.py.
from mmpipe.media.tiles_collate import collate_media, collator_state, unbatch_media  # noqa: E402,F401

BATCH_ROWS = "tiled-family"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a row of another family"  # a row of another kind in such a batch
BATCH_ARRAYS = "numpy"  # the batch's fields stay numpy (as always; as_torch / model_inputs convert)
POSITION_ROWS = ()  # position_ids [L] per row, [B, L] per batch
COLLATOR_NEEDS_PROCESSOR = "its pixel normalisation"  # what a Collator cannot do without the processor
CHECK_STORED_DTYPES = False  # list<uint8> tiles come back int64 from torch-formatted datasets: cast on read


# ---- validate ----
# the stored columns and each row's feature tokens, as validate_dataset checks them
from mmpipe.media.tiles_validate import (  # noqa: E402,F401  (a section of its own, at the end)
    KIND_COLUMN, dataset_checks, expected_columns, row_checks,
)
