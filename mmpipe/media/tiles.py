"""The ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision): each image resized to fixed-size
tiles, stored as uint8 [N, S, S, 3] (the resized tiles before the processor's per-pixel
normalisation; 1/4 of the float32 bytes) or, ``pixels="source"``, as its encoded file; the
family's image module (`ModelFamily.images`) gives tile counts and placeholder texts from the
image size, collate expands the tiles (`mmpipe.images.tiles.normalise_tiles`, bit-exact).
Positions are 1-D ([L], ``0..L-1``). Stored columns: `COLUMNS`; rows written before the
one-record change stored ``mm_token_type_ids`` as int32: they read back the same.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from mmpipe.records.codec import (
    DIGEST, FAMILY, SOURCES, Column, backend_column, check_token_shapes, stored_row_error,
)
from mmpipe.records.columns import as_array

IMAGE_LAYOUT_COLUMN = "tiles_per_image"  # the stored per-image layout (what error messages name)
COLUMNS = (  # the stored columns of a tiles-kind row, in order (`mmpipe.records.codec.Column`)
    Column("input_ids", "int32"), Column("attention_mask", "int8"), Column("labels", "int32", missing="none"),
    Column("mm_token_type_ids", "int8"),  # 1 at the family's feature tokens
    Column("image_hw", "int64", ndim=2, width=2, flat=True),  # [2*I]: each image's upright (height, width)
    Column("tiles_per_image", "int64"), FAMILY,
    # pixels="uint8": the tiles flat [N*S*S*3] and their size (S, S); read back by read_media
    Column("pixel_values_u8", "uint8", read=None, ndim=4, flat=True, pixels=("uint8",), missing="none"),
    Column("tile_hw", "int64", read=None, pixels=("uint8",),
           value=lambda r: np.asarray(r.pixel_values_u8.shape[1:3])),
    SOURCES, DIGEST, backend_column(("source",)),  # a torchvision-backend processor's source rows say so
    Column("images_kwargs", "object", read=None, missing="none",  # the processor call's images_kwargs, JSON
           value=lambda r: json.dumps(r.images_kwargs, sort_keys=True) if r.images_kwargs else None),
)
HAS_PIXELS = ("uint8", "source")  # stored tiles, or stored source files (collate decodes and tiles those)
CHECK_ON_READ = True  # every row read is validated, its stored digest checked (a tile byte changed)


def read_media(d, kw: dict, fam, row) -> dict:
    """What `COLUMNS` leave to this kind: the flat tiles back to [N, S, S, 3] (N tiles of
    ``tile_hw`` (S, S), a wrong byte count is an `InputError`), ``images_kwargs``."""
    u8, tiles = d.get("pixel_values_u8"), kw["tiles_per_image"]
    if u8 is not None:
        hw = as_array(d.get("tile_hw"), np.int64, 1, "tile_hw", row)
        flat = np.frombuffer(u8, np.uint8) if isinstance(u8, (bytes, bytearray)) else \
            as_array(u8, np.uint8, 1, "pixel_values_u8", row)
        want = int(tiles.sum()) * int(np.prod(hw)) * 3
        if flat.size != want:
            raise stored_row_error(f"pixel_values_u8 holds {flat.size} bytes", row, "pixel_values_u8",
                                   f"{want} ({int(tiles.sum())} tiles of {hw.tolist()} x 3)", str(flat.size))
        u8 = flat.reshape(int(tiles.sum()), int(hw[0]), int(hw[1]), 3)
    kwargs = d.get("images_kwargs")
    return dict(pixel_values_u8=u8, images_kwargs=json.loads(kwargs) if isinstance(kwargs, str) and kwargs else None)


def validate(r, row: Any = None) -> None:
    """Lengths line up, the tiles match ``tiles_per_image``, sources one per image."""
    def bad(column, expected, found):
        return stored_row_error(f"{column} does not match the row", row, column, expected, found)

    check_token_shapes(r, row)
    if r.tiles_per_image is None or r.image_hw is None:
        raise bad("tiles_per_image", "the per-image layout (image_hw, tiles_per_image)", "none")
    if r.image_hw.shape != (len(r.tiles_per_image), 2):
        raise bad("image_hw", f"shape ({len(r.tiles_per_image)}, 2)", f"shape {r.image_hw.shape}")
    u8, n = r.pixel_values_u8, int(r.tiles_per_image.sum())
    if u8 is not None and (u8.ndim != 4 or u8.shape[0] != n or u8.shape[3] != 3):
        raise bad("pixel_values_u8", f"[{n}, S, S, 3]", f"shape {u8.shape}")
    if r.image_sources is not None and len(r.image_sources) != r.num_images:
        raise bad("image_sources", f"{r.num_images} sources", str(len(r.image_sources)))


def layout_repr(r) -> str:
    return f"tiles={r.tiles_per_image.tolist()}"


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
ROLLOUT_REFUSED = {  # the stages that refuse tiled rows (multi-turn appends, verl rows), and why
    "multiturn": "encode each turn's whole conversation with mmpipe.encode and generate with TransformersEngine",
    "verl": "verl's actor reads the patch grids' multi_modal_inputs (pixel_values [N, D] + image_grid_thw) and "
            "its vLLM server their prompts, so these rows have no verl row layout here: batch them with "
            "mmpipe.Collator(processor) (BatchedMultiModalInputs.model_inputs() for the actor's forward), make "
            "rollout prompts with mmpipe.rollout.to_vllm_prompts(rows, processor)",
}


def vision_tokens(fam, processor: Any = None) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold (`mmpipe.records.vision_tokens`), by kind: the
    feature token the model fills with image features (the image's slots) and, where the chat
    template renders another token per image (Gemma 3's ``<start_of_image>``), that one: it
    opens the image's block. A stray one breaks the row's image-token count."""
    out = {"image": fam.feature_token}
    if fam.image_token != fam.feature_token:
        out["vision_start"] = fam.image_token
    return out


# ---- what the stages ask beyond these functions (the rest: mmpipe/media/tiles_{encode,collate,validate,view}.py;
# 1-D positions, no device pixels, no audio: `mmpipe.media.defaults`)
# vLLM prompts: each image's text put back to the image token, vLLM writes it again (`mmpipe.rollout.vllm_prompts`)
VLLM_PROMPT = "splice"
BATCH_ROWS = "tiled-family"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a row of another family"  # a row of another kind in such a batch
COLLATOR_NEEDS_PROCESSOR = "its pixel normalisation"  # what a Collator cannot do without the processor
