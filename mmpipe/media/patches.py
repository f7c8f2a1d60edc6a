"""The ``patches`` kind (Qwen2/2.5/3-VL, GLM-4.1V, the text family): each image a patch grid
``image_grid_thw`` (t, h, w), its pixels uint8 patches [N, 3*p*p] (one temporal copy) that
collate expands to the processor's float32 ``pixel_values`` [N, 3*T*p*p] (`mmpipe.images.pixels`),
positions M-RoPE [3, L]. Stored columns: `COLUMNS` (each documented in
`mmpipe.records.columns.ROW_COLUMNS`); a patch grid tells its token count, ``t*h*w // merge**2``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, PixelDataError
from mmpipe.records.codec import (
    DIGEST, FAMILY, SOURCES, Column, backend_column, check_token_shapes, pixel_rows, stored_row_error,
)
from mmpipe.records.columns import as_array

IMAGE_LAYOUT_COLUMN = "image_grid_thw"  # the stored per-image layout (what error messages name)


_U8, _F32, _VIDEO = ("uint8",), ("float32",), "no rows"  # a video pixel column is read for rows with videos
COLUMNS = (  # the stored columns, in order (`mmpipe.records.codec.Column`): those of the row's pixel format
    Column("input_ids", "int32"), Column("attention_mask", "int8", missing="ones"),
    Column("mm_token_type_ids", "int8", missing="zeros"), Column("position_ids", "int32", ndim=2),
    Column("rope_delta", "int32", read=None, ndim=0),  # read by read_media
    Column("image_grid_thw", "int32", ndim=2, width=3, missing="none"),
    Column("video_grid_thw", "int32", ndim=2, width=3, missing="none"),
    Column("second_per_grid_ts", "float32", "float32", missing="none"), FAMILY,
    Column("labels", "int32", missing="none"),
    # the pixels (name, store, read, ndim, width, rows, missing, pixels): [patches of the grids, width];
    # uint8: raw bytes + end marker, one temporal copy
    Column("pixel_values_u8", "bytes", "uint8", 2, "patch_dim_u8", "image_grid_thw", "none", _U8),
    Column("pixel_values_videos_u8", "bytes", "uint8", 2, "patch_dim", "video_grid_thw", _VIDEO, _U8),
    Column("pixel_values", "float32", "float32", 2, "patch_dim", "image_grid_thw", "none", _F32),
    Column("pixel_values_videos", "float32", "float32", 2, "patch_dim", "video_grid_thw", _VIDEO, _F32),
    SOURCES, DIGEST, backend_column(("uint8", "float32", "source")),
)
HAS_PIXELS = ("uint8", "float32", "source")  # the images' pixels are there: stored, or the files collate decodes
CHECK_ON_READ = False  # collate and validate_dataset validate the rows they read; the digest on request


def read_media(d, kw: dict, fam, row) -> dict:
    """What `COLUMNS` leave to this kind: ``rope_delta`` (derived from the positions in older
    layouts: 0 would shift every image row's generation)."""
    if d.get("rope_delta") is None:
        pos, L = kw["position_ids"], len(kw["input_ids"])
        delta = np.asarray([int(pos.max()) + 1 - L if pos.size else 0])
    else:
        delta = as_array(d["rope_delta"], np.int64, np.ndim(d["rope_delta"]), "rope_delta", row).reshape(-1)
    if delta.size != 1:
        raise stored_row_error(f"column 'rope_delta': expected one integer, found {delta.size} values", row,
                               "rope_delta")
    return dict(rope_delta=int(delta[0]))


def validate(r, row: Optional[int]) -> None:
    """Token shapes ([3, L] positions), token types, media tokens vs grids, pixels vs grids."""
    check_token_shapes(r, row)
    bad_type = np.flatnonzero((r.mm_token_type_ids < 0) | (r.mm_token_type_ids > 2))
    if len(bad_type):
        raise stored_row_error("", row, "mm_token_type_ids", "0 (text), 1 (image) or 2 (video)",
                               f"{int(r.mm_token_type_ids[bad_type[0]])} at token {int(bad_type[0])}",
                               fix="re-encode the row", column_in_location=True)
    fam = r.fam
    for kind, code, grid in (("image", 1, r.image_grid_thw), ("video", 2, r.video_grid_thw)):
        n_tok, expect = int((r.mm_token_type_ids == code).sum()), fam.num_tokens(grid)
        if n_tok != expect:
            lost = ", or its mm_token_type_ids column, which marks them, was dropped" if not n_tok else ""
            raise stored_row_error(f"{n_tok} {kind} tokens in input_ids but {kind}_grid_thw {grid.tolist()} needs "
                                   f"sum(t*h*w)/{fam.merge_area} = {expect} (counted where mm_token_type_ids == "
                                   f"{code}); the text and the {kind} data disagree (truncated or appended without "
                                   f"its pixels{lost}?)", row, f"{kind}_grid_thw",
                                   fix="re-encode the row, keeping every column encode wrote", error=PixelDataError)
    n_sec, n_vid = len(r.second_per_grid_ts), len(r.video_grid_thw)
    if fam.takes_second_per_grid_ts and n_sec != n_vid:  # the model's video time scale (positions="none")
        raise stored_row_error("", row, "second_per_grid_ts", f"{n_vid} (one value per video)", f"{n_sec}",
                               fix="re-encode the row, keeping every column encode wrote (the dataset's "
                                   "second_per_grid_ts column was dropped or cut?)", error=PixelDataError,
                               column_in_location=True)
    for c in [c for c in COLUMNS if c.rows]:  # the pixels: a row per patch of the grids, of the patch width
        arr, want = getattr(r, c.name), (pixel_rows(getattr(r, c.rows)), getattr(fam, c.width))
        if arr is not None and arr.shape != want:
            raise stored_row_error("", row, c.name, f"shape {want} from the grids and the {fam.name} patch size",
                                   tuple(arr.shape), error=PixelDataError, column_in_location=True)


def layout_repr(r) -> str:
    return f"grids={r.image_grid_thw.tolist()}, videos={r.num_videos}"


def position_inputs(batch, positions) -> dict:
    """``positions``: "mrope" (default) -> ``position_ids`` [3, B, L] + the token types; "verl" ->
    [4, B, L], the plain text row first; "none" -> the token types only. The text family takes
    its 1-D row [B, L] (any value but "none")."""
    if not batch.fam.is_vision:
        return {} if positions == "none" else {"position_ids": batch.position_ids[0]}
    out = {"mm_token_type_ids": batch.mm_token_type_ids}
    positions = positions or "mrope"
    if positions == "mrope":
        out["position_ids"] = batch.position_ids
    elif positions == "verl":
        from mmpipe.rope import to_verl_positions

        out["position_ids"] = to_verl_positions(batch.position_ids, batch.attention_mask)
    elif positions != "none":
        raise ArgumentError(f"positions must be 'mrope', 'verl' or 'none', got {positions!r}")
    return out


def pack_token_types(fam, token_types) -> dict:
    """A pack's token types as the model takes them (the M-RoPE families: ``mm_token_type_ids``)."""
    return {"mm_token_type_ids": token_types} if fam.is_vision else {}


def model_inputs(batch, token_types=None) -> dict:
    """The media kwargs of a patch-grid family's ``forward``, only those with data:
    ``pixel_values`` float32 [N, patch_dim] + ``image_grid_thw`` int64 [I, 3] when the
    batch holds images, likewise ``pixel_values_videos`` / ``video_grid_thw`` (+
    ``second_per_grid_ts`` [V] for Qwen2.5-VL). Empty for the text family."""
    fam = batch.fam
    out: dict = {}
    if not fam.is_vision:
        return out
    if batch.pixel_values is not None and batch.image_grid_thw.shape[0]:
        out["pixel_values"] = batch.pixel_values
        out["image_grid_thw"] = batch.image_grid_thw
    if batch.pixel_values_videos is not None and batch.video_grid_thw.shape[0]:
        out["pixel_values_videos"] = batch.pixel_values_videos
        out["video_grid_thw"] = batch.video_grid_thw
        if fam.takes_second_per_grid_ts:
            out["second_per_grid_ts"] = batch.second_per_grid_ts
    return out


# ---- rollout ----
def vision_tokens(fam, processor: Any = None) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold (`mmpipe.records.vision_tokens`), by kind:
    the image / video pads and the vision block's start / end (None where the family has none:
    the text family)."""
    return {"image": fam.image_token, "video": fam.video_token, "vision_start": fam.vision_start_token,
            "vision_end": fam.vision_end_token}


# ---- what the stages ask beyond these functions (the rest: mmpipe/media/patches_{encode,collate,validate,view}.py)
VLLM_PROMPT = "collapse"  # one pad per image / video, expanded by vLLM (`mmpipe.rollout.vllm_prompts`)
BATCH_ROWS = "patch-grid"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a tiled-family or generic-path row"  # a row of another kind in such a batch
BATCH_ARRAYS = "torch"  # the batch's fields are torch tensors (the 1-D kinds' stay numpy, as always)
POSITION_ROWS = (3,)  # position_ids [3, L] per row, [3, B, L] per batch (M-RoPE)
DEVICE_PIXELS = True  # collate(pixels_on_device=True): uint8 in the batch, expanded by device_pixels
CHECK_STORED_DTYPES = True  # a stored dict's float token ids / non-uint8 compact pixels are refused
