"""The batch and the packed record as ONE Arrow row each, whatever the family's kind (for
logging or shipping batches; what ``schemas/batched_multimodal_inputs.json`` and
``schemas/packed_multimodal_inputs.json`` publish). Dtypes are those of the torch tensors.

Every kind fits one schema: positions are ``[P, B, L]`` (P = 3 M-RoPE rows, 1 for the 1-D
families, whose ``[B, L]`` becomes ``[1, B, L]``); pixel blocks are one flat list per patch or
tile (``[N, D]``, axis 0 kept and the rest flat, with the full shape beside); per-image
layouts that a kind does not have are empty or null; and the named model inputs a family adds
(``extras``; the generic path's ``sequence`` and ``vision``) are typed tensors: name, dtype,
shape and the values' little-endian bytes in C order.
"""

from __future__ import annotations

import json

from typing import Any

import numpy as np
import pyarrow as pa

from mmpipe.records.columns import to_numpy

_I64_1D = pa.list_(pa.int64())
_I64_2D = pa.list_(_I64_1D)
_I64_3D = pa.list_(_I64_2D)
# A named tensor: how the per-family model inputs travel without an untyped bag.
TENSOR = pa.struct([("name", pa.string()), ("dtype", pa.string()), ("shape", _I64_1D), ("data", pa.binary())])
TENSORS = pa.list_(TENSOR)
ROW_SHAPES = pa.list_(pa.struct([("name", pa.string()), ("shapes", _I64_2D)]))

_F32_2D = pa.list_(pa.list_(pa.float32()))
_U8_2D = pa.list_(pa.list_(pa.uint8()))
_GRID = pa.list_(pa.list_(pa.int64(), 3))

BATCH_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("input_ids", _I64_2D, "int64 [B, L]"),
    ("attention_mask", _I64_2D, "int64 [B, L]"),
    ("mm_token_type_ids", _I64_2D, "int64 [B, L] 0 text, 1 image, 2 video (tiles: 1 at feature tokens)"),
    ("position_ids", _I64_3D, "int64 [P, B, L], pads 0: P = 3 M-RoPE rows (t, h, w) for the patch-grid "
                              "families, P = 1 (the [B, L] positions 0..n-1 per row) for the others"),
    ("rope_deltas", pa.list_(pa.list_(pa.int64(), 1)), "int64 [B, 1] (0 for the 1-D families)"),
    ("labels", _I64_2D, "int64 [B, L], -100 on non-targets and pads"),
    ("pixel_values", _F32_2D, "float32 [N, D]: the model's pixel_values, axis 0 kept, the rest flat "
                              "(shape in pixel_values_shape)"),
    ("pixel_values_shape", _I64_1D, "int64: pixel_values' own shape (patches [N, 3*T*p*p], Gemma 3 / "
                                    "InternVL [N, 3, S, S], LLaVA-OneVision [I, tiles, 3, S, S])"),
    ("pixel_values_u8", _U8_2D, "uint8 [N, D] compact pixels, axis 0 kept, the rest flat (shape in "
                                "pixel_values_u8_shape)"),
    ("pixel_values_u8_shape", _I64_1D, "int64: pixel_values_u8's own shape (patches [N, 3*p*p], "
                                       "tiles [N, S, S, 3])"),
    ("image_grid_thw", _GRID, "int64 [I, 3] patch grid per image (kind patches; empty otherwise)"),
    ("image_hw", pa.list_(pa.list_(pa.int64(), 2)), "int64 [I, 2] upright (height, width) per image "
                                                    "(kinds tiles, processor; null otherwise)"),
    ("tiles_per_image", _I64_1D, "int64 [I] tiles of each image (kind tiles; null otherwise)"),
    ("sample_to_image_indices", _I64_2D, "per row, the indices of its images (every kind)"),
    ("image_offsets", _I64_1D, "int64 [B+1] cumulative image counts"),
    ("patch_offsets", _I64_1D, "int64 [B+1] cumulative pixel rows (patches or tiles)"),
    ("pixel_values_videos", _F32_2D, "float32 [Nv, 3*T*p*p]"),
    ("pixel_values_videos_u8", _U8_2D, "uint8 [Nv, 3*T*p*p]"),
    ("video_grid_thw", _GRID, "int64 [V, 3]"),
    ("second_per_grid_ts", pa.list_(pa.float32()), "float32 [V]"),
    ("video_offsets", _I64_1D, "int64 [B+1]"),
    ("video_patch_offsets", _I64_1D, "int64 [B+1]"),
    ("seq_lengths", _I64_1D, "int64 [B] unpadded row lengths"),
    ("row_has_labels", pa.list_(pa.bool_()), "bool [B] rows that carried labels"),
    ("row_pixel_formats", pa.list_(pa.string()), "per row: uint8, float32 or none"),
    ("row_images_kwargs", pa.list_(pa.string()), "kind tiles: per row, the encoder's images_kwargs as JSON "
                                                 "(Gemma 3 pan-and-scan; null entries: none); null otherwise"),
    ("row_audio_sources", pa.list_(pa.list_(pa.binary())), "kind processor: per row, its clips' audio file bytes "
                                                            "(audio='source'; null entries: none); null otherwise"),
    ("row_image_sources", pa.list_(pa.list_(pa.binary())), "kinds patches, tiles: per row, its images' file "
                                                            "bytes (pixels='source'; null entries: none); "
                                                            "null otherwise"),
    ("extras", TENSORS, "the family's further model inputs by name (LLaVA-OneVision image_sizes "
                        "int64 [I, 2]); each: name, dtype, shape, little-endian C-order bytes"),
    ("sequence", TENSORS, "kind processor: the processor's other [B, L] outputs (token_type_ids, "
                          "...), as extras"),
    ("vision", TENSORS, "kind processor: the processor's vision outputs (pixel_values, "
                        "pixel_attention_mask, ...), as extras"),
    ("vision_shapes", ROW_SHAPES, "kind processor: per vision key, each row's own shape ([] where the "
                                  "row has none): what unbatch cuts back to"),
    ("processor_layout", pa.string(), "kind processor: the rows' ProcessorLayout as JSON (the stored "
                                      "generic_layout); null otherwise"),
    ("padding_side", pa.string(), "left or right"),
    ("family", pa.string(), "model family name (mmpipe.families.ALL_FAMILIES)"),
    ("pixel_format", pa.string(), "uint8, float32 or none"),
]
_NULLABLE_BATCH = {"labels", "pixel_values", "pixel_values_u8", "pixel_values_videos",
                   "pixel_values_videos_u8", "pixel_values_shape", "pixel_values_u8_shape", "image_hw",
                   "tiles_per_image", "processor_layout", "row_images_kwargs", "row_audio_sources",
                   "row_image_sources"}

# The packed record: its own [1, T] token columns, then its rows' batch (``meta``) without the
# batch's zero-width token columns.
_META_TOKEN_COLUMNS = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "labels",
                       "padding_side")
PACKED_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("input_ids", _I64_2D, "int64 [1, T], T = the n packed rows' lengths summed"),
    ("mm_token_type_ids", _I64_2D, "int64 [1, T] 0 text, 1 image, 2 video"),
    ("position_ids", _I64_3D, "int64 [P, 1, T]: P = 4 for the M-RoPE families (the text positions "
                              "restarting at 0 per row, then t, h, w), P = 1 for the 1-D families and "
                              "text (restarting at 0 per row)"),
    ("cu_seqlens", pa.list_(pa.int32()), "int32 [n+1] row k owns tokens cu_seqlens[k]:cu_seqlens[k+1]"),
    ("labels", _I64_2D, "int64 [1, T] or null; -100 on every row's first token"),
    ("first_labels", _I64_1D, "int64 [n] or null: each row's own label at its first token (for unpack)"),
] + [(n, t, f"the packed rows' batch: {d}") for n, t, d in BATCH_COLUMNS if n not in _META_TOKEN_COLUMNS]
_NULLABLE_PACKED = _NULLABLE_BATCH | {"first_labels"}


def _schema(columns, nullable) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=n in nullable, metadata={"doc": d}) for n, t, d in columns])


def batch_arrow_schema() -> pa.Schema:
    """`BatchedMultiModalInputs` as one Arrow record, every kind of family."""
    return _schema(BATCH_COLUMNS, _NULLABLE_BATCH)


def packed_arrow_schema() -> pa.Schema:
    """`PackedMultiModalInputs` as one Arrow record, every kind of family."""
    return _schema(PACKED_COLUMNS, _NULLABLE_PACKED)


def _tensors(named: dict) -> list[dict]:
    out = []
    for name in sorted(named):
        a = np.ascontiguousarray(to_numpy(named[name]))
        a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        out.append({"name": name, "dtype": str(a.dtype), "shape": list(a.shape), "data": a.tobytes()})
    return out


def _batch_values(batch) -> dict[str, Any]:
    """Field name -> value (numpy, python or None) for every `BATCH_COLUMNS` name."""
    out: dict[str, Any] = {}
    for name, _, _ in BATCH_COLUMNS:
        if name in ("extras", "sequence", "vision"):
            out[name] = _tensors(getattr(batch, name))
        elif name == "vision_shapes":
            out[name] = [{"name": k, "shapes": [list(s) if s is not None else [] for s in v]}
                         for k, v in sorted(batch.shapes.items())]
        elif name == "processor_layout":
            out[name] = None if batch.layout is None else batch.layout.to_json()
        elif name == "row_images_kwargs":
            kw = batch.row_images_kwargs
            out[name] = None if kw is None else [None if k is None else json.dumps(k, sort_keys=True) for k in kw]
        elif name == "sample_to_image_indices":
            out[name] = batch.sample_to_image_indices
        elif name.endswith("_shape"):
            continue  # set with their pixel blocks below
        else:
            v = getattr(batch, name)
            out[name] = v if v is None or isinstance(v, (str, list)) else to_numpy(v)
    pos = out["position_ids"]
    out["position_ids"] = pos[None] if pos.ndim == 2 else pos  # 1-D families: [B, L] -> [1, B, L]
    for name in ("pixel_values", "pixel_values_u8"):  # one flat list per block, the shape beside
        v = out[name]
        out[name + "_shape"] = None if v is None else list(v.shape)
        out[name] = None if v is None else v.reshape(v.shape[0], -1)
    return out


def _table(values: dict[str, Any], schema: pa.Schema) -> pa.Table:
    def cell(v):
        return v.tolist() if isinstance(v, np.ndarray) else v

    return pa.table({f.name: pa.array([cell(values[f.name])], type=f.type) for f in schema}, schema=schema)


def batch_to_arrow(batch) -> pa.Table:
    """A `BatchedMultiModalInputs` (torch or numpy fields) as a one-row table of `batch_arrow_schema`."""
    return _table(_batch_values(batch), batch_arrow_schema())


def packed_to_arrow(packed) -> pa.Table:
    """A `PackedMultiModalInputs` as a one-row table of `packed_arrow_schema`."""
    values = _batch_values(packed.meta)
    for name in ("input_ids", "mm_token_type_ids", "position_ids", "cu_seqlens", "labels", "first_labels"):
        v = getattr(packed, name)
        values[name] = None if v is None else to_numpy(v)
    pos = values["position_ids"]
    values["position_ids"] = pos[None] if pos.ndim == 2 else pos  # [1, T] -> [1, 1, T]
    return _table(values, packed_arrow_schema())
