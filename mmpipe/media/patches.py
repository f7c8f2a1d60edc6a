"""The ``patches`` kind (Qwen2/2.5/3-VL, GLM-4.1V, the text family): each image a patch grid
``image_grid_thw`` (t, h, w), its pixels uint8 patches [N, 3*p*p] (one temporal copy) that
collate expands to the processor's float32 ``pixel_values`` [N, 3*T*p*p] (`mmpipe.images.pixels`),
positions M-RoPE [3, L]. Stored columns: `mmpipe.records.columns.ROW_COLUMNS` (the kind
``patches`` entries); a patch grid tells its token count, ``t*h*w // merge**2``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.errors import InputError, PixelDataError
from mmpipe.records.columns import (
    as_array, f32_or_empty, fit_width, pixel_digest, source_list, sources_digest, u8_block, u8_bytes, u8_or_empty,
)

IMAGE_LAYOUT_COLUMN = "image_grid_thw"  # the stored per-image layout (what error messages name)


def validate(r, row: Optional[int]) -> None:
    """Token shapes ([3, L] positions), media tokens vs grids, pixel shapes vs grids."""
    _check_token_shapes(r, row)
    _check_media_tokens(r, row)
    _check_pixel_shapes(r, row)


def _check_token_shapes(r, row: Optional[int]) -> None:
    L = r.num_tokens
    shapes = [(name, (L,)) for name in ("attention_mask", "mm_token_type_ids")]
    if r.labels is not None:
        shapes.append(("labels", (L,)))
    shapes.append(("position_ids", (3, L)))
    for name, want in shapes:
        if getattr(r, name).shape != want:
            raise InputError(row=row, column=name, column_in_location=True, stage="validate",
                             expected=f"shape {want}", found=getattr(r, name).shape,
                             fix="re-encode the row with mmpipe.encode")
    bad_type = np.flatnonzero((r.mm_token_type_ids < 0) | (r.mm_token_type_ids > 2))
    if len(bad_type):
        raise InputError(
            row=row, column="mm_token_type_ids", column_in_location=True, stage="validate",
            expected="0 (text), 1 (image) or 2 (video)",
            found=f"{int(r.mm_token_type_ids[bad_type[0]])} at token {int(bad_type[0])}", fix="re-encode the row",
        )


def _check_media_tokens(r, row: Optional[int]) -> None:
    fam = r.fam
    for kind, code, grid in (("image", 1, r.image_grid_thw), ("video", 2, r.video_grid_thw)):
        n_tok = int((r.mm_token_type_ids == code).sum())
        expect = fam.num_tokens(grid)
        if n_tok != expect:
            raise PixelDataError(
                f"{n_tok} {kind} tokens in input_ids but {kind}_grid_thw {grid.tolist()} "
                f"needs sum(t*h*w)/{fam.merge_area} = {expect}; the text and the {kind} data disagree "
                f"(truncated or appended without its pixels?)", row=row, stage="validate",
                column=f"{kind}_grid_thw", fix="re-encode the row",
            )


def _check_pixel_shapes(r, row: Optional[int]) -> None:
    fam = r.fam
    checks = (
        ("pixel_values", r.pixel_values, r.num_image_patches, fam.patch_dim),
        ("pixel_values_u8", r.pixel_values_u8, r.num_image_patches, fam.patch_dim_u8),
        ("pixel_values_videos", r.pixel_values_videos, r.num_video_patches, fam.patch_dim),
        ("pixel_values_videos_u8", r.pixel_values_videos_u8, r.num_video_patches, fam.patch_dim),
    )
    for name, arr, n, d in checks:
        if arr is not None and arr.shape != (n, d):
            raise PixelDataError(
                row=row, column=name, column_in_location=True, stage="validate",
                expected=f"shape ({n}, {d}) from the grids and the {fam.name} patch size",
                found=tuple(arr.shape), fix="re-encode the row with mmpipe.encode",
            )


def from_columns(cls, d: Any, fam, row: Any = None, *, verify_pixels: bool = False):
    """A stored patch-kind row -> the record (see `mmpipe.records.row.MultiModalInputs.from_dict`)."""
    from mmpipe.records.row import stored_backend

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


def stored_pixel_digest(r) -> Optional[int]:
    fmt = r.pixel_format
    if fmt == "uint8":
        return pixel_digest(r.pixel_values_u8, r.pixel_values_videos_u8)
    if fmt == "float32":
        return pixel_digest(r.pixel_values, r.pixel_values_videos)
    if fmt == "source":
        return sources_digest(r.image_sources)
    return None


def pixel_columns(r) -> str:
    """The stored pixel column(s) the row's digest covers, for error messages."""
    fmt = r.pixel_format
    if fmt == "source":
        return "image_sources"
    suffix = "_u8" if fmt == "uint8" else ""
    cols = [f"pixel_values{suffix}"] * bool(r.num_images) + [f"pixel_values_videos{suffix}"] * bool(r.num_videos)
    return " / ".join(cols) or f"pixel_values{suffix}"


def to_columns(r) -> dict[str, Any]:
    """The stored row: only the columns of its pixel format (every row of one encode call has
    the same columns, what ``datasets`` needs)."""
    out: dict[str, Any] = {
        "input_ids": r.input_ids.astype(np.int32),
        "attention_mask": r.attention_mask.astype(np.int8),
        "mm_token_type_ids": r.mm_token_type_ids.astype(np.int8),
        "position_ids": r.position_ids.astype(np.int32),
        "rope_delta": np.int32(r.rope_delta),
        "image_grid_thw": r.image_grid_thw.astype(np.int32),
        "video_grid_thw": r.video_grid_thw.astype(np.int32),
        "second_per_grid_ts": r.second_per_grid_ts.astype(np.float32),
        "family": r.family,
    }
    if r.labels is not None:
        out["labels"] = r.labels.astype(np.int32)
    fmt, fam = r.pixel_format, r.fam
    if fmt == "uint8":
        out["pixel_values_u8"] = u8_bytes(u8_or_empty(r.pixel_values_u8, fam.patch_dim_u8))
        out["pixel_values_videos_u8"] = u8_bytes(u8_or_empty(r.pixel_values_videos_u8, fam.patch_dim))
    elif fmt == "float32":
        out["pixel_values"] = f32_or_empty(r.pixel_values, fam.patch_dim)
        out["pixel_values_videos"] = f32_or_empty(r.pixel_values_videos, fam.patch_dim)
    if fmt == "source":
        out["image_sources"] = [bytes(b) for b in r.image_sources]
    if fmt != "none":
        out["pixel_digest"] = np.int64(stored_pixel_digest(r))
        if r.image_backend != "pil":  # PIL rows keep the layout of before (no column)
            out["image_backend"] = r.image_backend
    return out


def has_pixels(r) -> bool:
    """Stored pixels (uint8 or float32): source files are decoded at collate, not stored pixels."""
    return r.pixel_format not in ("none", "source")


def layout_repr(r) -> str:
    return f"grids={r.image_grid_thw.tolist()}, videos={r.num_videos}"


def position_inputs(batch, positions) -> dict:
    """``positions``: "mrope" (default) -> ``position_ids`` [3, B, L] + the token types; "verl" ->
    [4, B, L], the plain text row first; "none" -> the token types only. The text family takes
    its 1-D row [B, L] (any value but "none")."""
    from mmpipe.errors import ArgumentError

    if not batch.fam.is_vision:
        return {} if positions == "none" else {"position_ids": batch.position_ids[0]}
    out = {"mm_token_type_ids": batch.mm_token_type_ids}
    positions = positions or "mrope"
    if positions == "mrope":
        out["position_ids"] = batch.position_ids
    elif positions == "verl":
        import torch

        from mmpipe.rope import text_positions

        out["position_ids"] = torch.cat([text_positions(batch.attention_mask)[None], batch.position_ids], 0)
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
def vision_tokens(fam) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold (`mmpipe.records.vision_tokens`), by kind:
    the image / video pads and the vision block's start / end (None where the family has none:
    the text family)."""
    return {"image": fam.image_token, "video": fam.video_token, "vision_start": fam.vision_start_token,
            "vision_end": fam.vision_end_token}


def rollout_refusal(fam, stage: str) -> Optional[str]:
    """Why rollout ``stage`` (`mmpipe.rollout.support.ROLLOUT_STAGES`) cannot take this kind's
    rows, or None: the patch grids take every stage."""
    return None


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                index: int = 0) -> dict:
    """One row -> its vLLM prompt dict (`mmpipe.rollout.inputs.to_vllm_prompts`):
    ``"prompt_token_ids"`` with ONE pad per image / video (the row's placeholders collapsed),
    and for a row with media ``"multi_modal_data"`` (the stored resized images, PIL RGB; the
    stored video frames) and ``"mm_processor_kwargs"`` under which vLLM's processor gives the
    row's ids and pixels back. ``processor``: the processor, `VisionSpec` or family the row was
    encoded with (None: the family's defaults); ``tokenizer``: for video timestamps (default
    ``processor``)."""
    from mmpipe.encoding.placeholders import collapse_placeholders
    from mmpipe.errors import ArgumentError
    from mmpipe.rollout.images import row_images, vision_spec_for, vllm_processor_kwargs
    from mmpipe.rollout.videos import vllm_video_prompt

    if images is not None:
        raise ArgumentError("images= is for tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision); these rows "
                            "carry their own resized images")
    fam = r.fam
    spec = vision_spec_for(processor, fam) if (r.num_images or r.num_videos) else None
    if r.num_videos:
        tok = tokenizer if tokenizer is not None else processor
        ids, videos, videos_kwargs = vllm_video_prompt(r, spec, tok, index=index)
    else:
        ids = collapse_placeholders(r.input_ids, r.mm_token_type_ids, r.image_grid_thw, family=fam, row=index)
    prompt: dict = {"prompt_token_ids": [int(t) for t in ids]}
    if r.num_images or r.num_videos:
        prompt["multi_modal_data"], prompt["mm_processor_kwargs"] = {}, {}
    if r.num_images:
        prompt["multi_modal_data"]["image"] = row_images(r, spec, index=index)
        prompt["mm_processor_kwargs"].update(vllm_processor_kwargs(r.image_grid_thw, spec, index=index, family=fam))
    if r.num_videos:
        prompt["multi_modal_data"]["video"] = videos
        prompt["mm_processor_kwargs"]["videos_kwargs"] = videos_kwargs
    return prompt


# ---- view ----
# What the view stage (mmpipe.view) and `mmpipe inspect` ask of this kind: token spans, span
# labels, pictures from the stored pixels, counts from the stored columns; the same names in
# every kind. The code is in mmpipe/media/patches_view.py (this module is shared by every stage).
from mmpipe.media.patches_view import (  # noqa: E402  (a section of its own, at the end)
    PIXEL_UNIT, STATS_COLUMNS, table_counts, view_images, view_layout, view_notes, view_size, view_spans,
    view_summary, view_video_frames,
)


# ---- encode ----
# What mmpipe.Encoder asks of this kind: its options, one image's layout and stored payload, a
# parsed row's fields, an empty row, the bytes of one image, the processor layout (none here);
# the same names in every kind. The code is in mmpipe/media/patches_encode.py.
from mmpipe.media.patches_encode import (  # noqa: E402  (a section of its own, at the end)
    ENCODE_OPTIONS, ENCODE_PIXELS, encode_empty, encode_image, encode_image_bytes, encode_layout, encode_row,
    encode_settings,
)


# ---- collate ----
# What mmpipe.collate / unbatch / pack ask of this kind; the same names in every kind. The code is
# in mmpipe/media/patches_collate.py.
from mmpipe.media.patches_collate import collate_media, collator_state, unbatch_media  # noqa: E402,F401

BATCH_ROWS = "patch-grid"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a tiled-family or generic-path row"  # a row of another kind in such a batch
BATCH_ARRAYS = "torch"  # the batch's fields are torch tensors (the 1-D kinds' stay numpy, as always)
POSITION_ROWS = (3,)  # position_ids [3, L] per row, [3, B, L] per batch (M-RoPE)
COLLATOR_NEEDS_PROCESSOR = None  # without a processor: the family table's VisionSpec
CHECK_STORED_DTYPES = True  # a stored dict's float token ids / non-uint8 compact pixels are refused


# ---- validate ----
# the stored columns and each row's positions, as validate_dataset checks them
from mmpipe.media.patches_validate import (  # noqa: E402,F401  (a section of its own, at the end)
    KIND_COLUMN, dataset_checks, expected_columns, row_checks,
)
