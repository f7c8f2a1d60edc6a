"""The ``patches`` kind's part of `mmpipe.Encoder` (Qwen2/2.5/3-VL, GLM-4.1V, the text family):
the rendered prompt tokenized with one pad per image (labels from the assistant spans) -> the
videos, then the images, each pad expanded to its patch grid's ``t*h*w/merge^2`` pads
(`mmpipe.encoding.placeholders`, `mmpipe.encoding.videos`) -> truncation -> M-RoPE positions.
A row holds::

    input_ids, attention_mask, mm_token_type_ids, labels   int64 [L]
    position_ids                                           int64 [3, L], rope_delta int
    image_grid_thw, video_grid_thw                         int64 [I, 3], [V, 3]
    second_per_grid_ts                                     float32 [V]
    pixel_values_u8  uint8 [N, 3*p*p]  (or pixel_values float32 [N, 3*T*p*p], source files, or none)
    pixel_values_videos_u8  uint8 [Nv, 3*T*p*p]  (or pixel_values_videos float32, or none)

Reached as ``fam.media.encode_*`` (one of the kind's modules, `mmpipe.media.KINDS`).
"""

from __future__ import annotations

import numpy as np

from mmpipe.encoding.options import TRUNCATION_POLICIES, generation_tail, kind_options, truncate_row
from mmpipe.encoding.placeholders import check_image_placeholders, expand_image_pads
from mmpipe.encoding.sources import read_once
from mmpipe.encoding.text_ids import rendered_ids
from mmpipe.encoding.videos import add_videos, check_processor_seconds, keeps_video_wrapper, \
    video_options as check_video_options
from mmpipe.images.video_processor_plan import with_processor
from mmpipe.errors import PlaceholderError
from mmpipe.images.pixels import encode_image as image_patches, image_grid
from mmpipe.images.spec import VisionSpec
from mmpipe.records.columns import ENCODE_PIXEL_FORMATS, IGNORE_INDEX

# the options of mmpipe.Encoder (`mmpipe.encoding.encoder.KIND_OPTIONS`) this kind refuses (those
# of the other kinds) -> why, how it says so; its stored pixel formats and truncation policies: all
# (`mmpipe.encoding.options.kind_options`)
ENCODE_REFUSED = {"images_kwargs": "it is the tiled families' processor call option",
                  "log": "it is the generic path's option",
                  "audio": "these families take no audio (audio processors take the generic path)"}
REFUSAL = "{what} is not available for {fam} processors: {why}; leave it out"
ENCODE_PIXELS, TRUNCATIONS = ENCODE_PIXEL_FORMATS, TRUNCATION_POLICIES
_PIXEL_BYTES = {"uint8": 1, "float32": 4, "none": 0, "source": 1}  # per pixel ("source": a PNG <= raw)


def encode_settings(enc, given: dict) -> None:
    """Check the kind's options and set them on ``enc``: ``pixels``, the `VisionSpec` (resize
    bounds, backend), the video options and the vision token ids."""
    fam = enc.family
    kind_options(enc, given)
    if fam.is_vision:
        enc.spec = VisionSpec.from_processor(enc.processor, given.get("min_pixels"), given.get("max_pixels"),
                                             given.get("image_backend", "auto"))
    enc.video_opts = check_video_options(given.get("video_options"))
    if enc.video_opts.sampling == "processor":  # its values left at their defaults: the processor's
        enc.video_opts = with_processor(enc.video_opts, enc.processor)
        check_processor_seconds(enc.processor, fam)
    token_ids = fam.vision_token_ids(enc.tokenizer)  # None each for a text family
    enc.image_token_id, enc.video_token_id = token_ids["image"], token_ids["video"]
    enc.vision_start_id, enc.vision_end_id = token_ids["vision_start"], token_ids["vision_end"]
    enc.video_wrapper = keeps_video_wrapper(enc.processor, fam)
    enc.decodes_images = fam.is_vision and enc.pixels in ("uint8", "float32")
    enc.batched_layout = fam.is_vision and enc.pixels == "none"  # `mmpipe.encoding.layout_batch`


def encode_image(enc, value, where: str) -> tuple:
    """One image -> (its grid (t, h, w), uint8 patches [n, 3*p*p] / its file bytes / None)."""
    if enc.pixels == "source":  # the grid from the header of the bytes stored (`read_once`)
        return read_once(value, lambda v: image_grid(v, enc.spec, where=where), where=where)
    if enc.pixels == "none":  # the grid from the image header
        return image_grid(value, enc.spec, where=where), None
    u8, grid = image_patches(value, enc.spec, where=where)
    return grid, u8


def encode_row(enc, messages: list, images: list, videos: list, *, where: str, tools, prefetched) -> dict:
    """One parsed row -> the record's fields (module doc)."""
    fam = enc.family
    if (images or videos) and not fam.is_vision:
        kind, column = ("image", enc.images_column) if images else ("video", enc.videos_column)
        raise PlaceholderError(f"holds {len(images or videos)} {kind}(s) but the processor is a text-only "
                               "tokenizer", where=where, column=column, expected="a vision-language processor",
                               found=f"a text-only tokenizer and {len(images or videos)} {kind}(s)",
                               fix=f"encode with a vision-language processor, or drop the {kind}s")
    ids, labels = rendered_ids(enc, messages, where, tools)
    grids = np.zeros((0, 3), dtype=np.int64)
    blocks: list[np.ndarray] = []
    vid = None
    if fam.is_vision:  # videos first: their pads are found in the unexpanded ids
        ids, labels, *vid = add_videos(enc, ids, labels, videos, where)
        ids, labels, grids, blocks = _add_images(enc, ids, labels, images, where, prefetched)
    mm = enc.token_types(ids)
    if labels is not None:
        labels[mm > 0] = IGNORE_INDEX  # image / video pads are inputs, never targets
    ids, labels, mm = truncate_row(enc, ids, labels, mm, where,
                                   tail=lambda: generation_tail(enc, messages, tools, where, ids))
    return _fields(enc, ids, labels, mm, grids, blocks, vid)


def _image_pads(enc, ids: np.ndarray, n_images: int, where: str) -> np.ndarray:
    """Positions int [I] of the one ``<|image_pad|>`` per image the template rendered."""
    pad_pos = np.flatnonzero(enc.token_types(ids) == 1)  # GLM-4.1V's videos hold <|image|> too
    # a template that drops images was refused with their turns named (`check_rendered_images`)
    check_image_placeholders(len(pad_pos), n_images, enc.family.image_token, where)
    return pad_pos


def _add_images(enc, ids, labels, images: list, where: str, prefetched) -> tuple:
    """Encode the images and expand their pads -> (ids, labels, grids int64 [I, 3], payloads)."""
    pad_pos = _image_pads(enc, ids, len(images), where)
    loaded = enc.load_images(images, where, prefetched)
    payloads = [p for _, p in loaded if p is not None]
    if not loaded:
        return ids, labels, np.zeros((0, 3), dtype=np.int64), payloads
    grids = np.asarray([g for g, _ in loaded], dtype=np.int64)
    ids, labels = expand_image_pads(ids, pad_pos, grids, enc.family, labels)
    return ids, labels, grids, payloads


def _fields(enc, ids, labels, mm, grids, blocks, vid=None) -> dict:
    """The record's fields; ``vid``: (video grids int64 [V, 3], second_per_grid_ts float32 [V],
    uint8 blocks)."""
    fam = enc.family
    vgrids, seconds, vblocks = vid if vid else (np.zeros((0, 3), np.int64), np.zeros(0, np.float32), [])
    pos, delta = row_positions(fam, ids, mm, grids, vgrids, seconds)
    row = dict(input_ids=ids, attention_mask=np.ones(ids.shape, dtype=np.int64), mm_token_type_ids=mm,
               position_ids=pos, rope_delta=delta, labels=labels,
               image_grid_thw=grids, video_grid_thw=vgrids, second_per_grid_ts=seconds)
    if enc.pixels == "source":
        row["image_sources"] = list(blocks)
    elif enc.pixels == "uint8":
        row["pixel_values_u8"] = (np.concatenate(blocks) if blocks
                                  else np.zeros((0, fam.patch_dim_u8), np.uint8))
        # None as from_dict reads it
        row["pixel_values_videos_u8"] = np.concatenate(vblocks) if vblocks else None
    elif enc.pixels == "float32":
        from mmpipe.media.patches_collate import expand_u8  # as collate expands them

        if vblocks:
            row["pixel_values_videos"] = expand_u8(np.concatenate(vblocks), enc.spec, videos=True)
        # one expansion into one output array (expanding per image and concatenating would
        # write the 8x larger float32 data twice)
        u8 = np.concatenate(blocks) if blocks else None
        row["pixel_values"] = (np.zeros((0, fam.patch_dim), np.float32) if u8 is None
                               else expand_u8(u8, enc.spec, videos=False))
    if enc.spec is not None and enc.pixels != "none":
        row["image_backend"] = enc.spec.backend  # collate expands the pixels with this backend's table
    return row


def row_positions(fam, ids: np.ndarray, mm: np.ndarray, grids: np.ndarray, vgrids: np.ndarray,
                  seconds: np.ndarray) -> tuple[np.ndarray, int]:
    """One row's M-RoPE ``position_ids`` int64 [3, L] and ``rope_delta`` (`mmpipe.rope.get_rope_index`)
    from its ids and token types [L], image grids [I, 3], video grids [V, 3] and seconds per grid [V]."""
    from mmpipe.rope import get_rope_index

    videos = len(vgrids) > 0
    if not videos and not len(grids) and not mm.any():  # a text row: the rule's one text run, 0..L-1 on each row
        return np.repeat(np.arange(len(ids), dtype=np.int64)[None], 3, 0), 0
    pos, delta = get_rope_index(ids[None], mm[None], image_grid_thw=grids if len(grids) else None,
                                video_grid_thw=vgrids if videos else None,
                                second_per_grid_ts=seconds if videos else None, family=fam)
    return pos[:, 0, :].numpy(), int(delta.reshape(-1)[0])


def encode_empty(enc) -> dict:
    """The fields of an empty row (0 tokens) in the encoder's pixel format and labels."""
    z = np.zeros(0, np.int64)
    return _fields(enc, z, z if enc.labels else None, z, np.zeros((0, 3), np.int64), [])


def encode_image_bytes(enc) -> int:
    """Most stored bytes of one image: at ``max_pixels``, in the stored pixel format."""
    if enc.spec is None:  # the text family
        return 0
    temporal = enc.spec.temporal_patch_size if enc.pixels == "float32" else 1
    return 3 * enc.spec.max_pixels * _PIXEL_BYTES[enc.pixels] * temporal
