"""Encode, the other route: rows a transformers processor already built (videos, custom
prompts) -> `MultiModalInputs`, and float32 -> compact uint8 pixel storage.

`rows_from_processor_output` takes a processor's ``BatchFeature`` for B texts::

    input_ids, attention_mask, mm_token_type_ids   int [B, L] (any padding)
    image_grid_thw int [I, 3], video_grid_thw int [V, 3], second_per_grid_ts float [V]
    pixel_values float32 [sum(t*h*w) of images, 3*T*p*p], pixel_values_videos likewise

and splits grids and pixel blocks per row by each row's image/video token counts. `compact`
turns a row's float32 ``pixel_values`` back into exact uint8 ``pixel_values_u8`` [N, 3*p*p].
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from mmpipe.errors import PlaceholderError
from mmpipe.families import family_of
from mmpipe.images.backends import processor_backend
from mmpipe.images.spec import VisionSpec
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import to_numpy

__all__ = ["rows_from_processor_output", "compact"]



def _count_blocks(tokens_per_grid: np.ndarray, n_tokens: int, row: int, kind: str) -> int:
    """How many of the remaining grids (their token counts int [G]) make up ``n_tokens``."""
    csum = np.concatenate([[0], np.cumsum(tokens_per_grid)])
    hit = np.flatnonzero(csum == n_tokens)
    if not len(hit):
        raise PlaceholderError(f"{n_tokens} {kind} tokens do not match a whole number of the remaining {kind} grids",
                               row=row, column="input_ids", expected=f"one of {csum[1:].tolist()} {kind} tokens",
                               found=f"{n_tokens} {kind} tokens", fix=f"pass the {kind}_grid_thw of these very inputs")
    return int(hit[0])


def _token_types(outputs, ids: np.ndarray, fam, processor) -> np.ndarray:
    """int [B, L]: the output's ``mm_token_type_ids``, 1 at the family's image pad and 2 at its video
    pad (``processor``'s tokenizer) where they say text or are absent, as 5.x's processors mark them:
    transformers 4.57's Qwen-VL processors return the types only with ``return_mm_token_type_ids=True``,
    and then mark image pads alone (their video pads 0)."""
    given = "mm_token_type_ids" in outputs and outputs["mm_token_type_ids"] is not None
    mm = to_numpy(outputs["mm_token_type_ids"]).astype(np.int64) if given else np.zeros_like(ids)
    pads = fam.vision_token_ids(getattr(processor, "tokenizer", processor))
    for kind, pad in ((1, pads["image"]), (2, pads["video"])):
        if pad is not None:
            mm[(ids == pad) & (mm == 0)] = kind
    return mm


def _processor_arrays(outputs, fam, processor) -> dict:
    """The processor output as numpy arrays, absent keys filled with empty/neutral values."""
    ids = to_numpy(outputs["input_ids"]).reshape(len(outputs["input_ids"]), -1)
    get = lambda k: to_numpy(outputs[k]) if outputs.get(k) is not None else None  # noqa: E731
    igrid, vgrid = get("image_grid_thw"), get("video_grid_thw")
    vgrid = vgrid.reshape(-1, 3) if vgrid is not None else np.zeros((0, 3), np.int64)
    secs = get("second_per_grid_ts")
    return {
        "ids": ids,
        "att": to_numpy(outputs["attention_mask"]) if "attention_mask" in outputs else np.ones_like(ids),
        "mm": _token_types(outputs, ids, fam, processor),
        "igrid": igrid.reshape(-1, 3) if igrid is not None else np.zeros((0, 3), np.int64),
        "vgrid": vgrid,
        "secs": secs.astype(np.float32) if secs is not None else np.ones(len(vgrid), np.float32),
        "pv": get("pixel_values"),
        "pvv": get("pixel_values_videos"),
    }


def rows_from_processor_output(outputs, processor, *, labels=None) -> list[MultiModalInputs]:
    """Rows of a transformers processor call (a ``BatchFeature`` for B texts, any padding)
    -> `MultiModalInputs`, float32 pixels, positions computed here.

    The route for inputs ``encode`` does not build itself (videos, custom prompts). Pixel
    blocks are split per row by each row's image/video token counts (its ``mm_token_type_ids``, and
    the family's pad tokens in ``input_ids`` where those are absent or 0, as 4.57's processors leave
    them); grids no row claims raise `PlaceholderError`.
    ``labels``: optional int [B, L] aligned with ``input_ids``.
    """
    from mmpipe.rope import get_rope_index

    fam = family_of(processor)
    a = _processor_arrays(outputs, fam, processor)
    ids, att, mm, igrid, vgrid, secs, pv, pvv = (a[k] for k in ("ids", "att", "mm", "igrid", "vgrid", "secs", "pv", "pvv"))
    # Qwen3-VL splits each video into per-frame blocks in the text; count tokens per video
    i_tok = fam.tokens_per_grid(igrid)
    v_tok = fam.tokens_per_grid(vgrid)
    rows, gi, gv, pi, pvi = [], 0, 0, 0, 0
    for b in range(ids.shape[0]):
        keep = att[b].astype(bool)
        r_ids, r_mm = ids[b][keep], mm[b][keep]
        n_img_tok, n_vid_tok = int((r_mm == 1).sum()), int((r_mm == 2).sum())
        ni = _count_blocks(i_tok[gi:], n_img_tok, b, "image")
        nv = _count_blocks(v_tok[gv:], n_vid_tok, b, "video")
        g_i, g_v = igrid[gi:gi + ni], vgrid[gv:gv + nv]
        pos, delta = get_rope_index(r_ids[None], r_mm[None], image_grid_thw=g_i if ni else None,
                                    video_grid_thw=g_v if nv else None,
                                    second_per_grid_ts=secs[gv:gv + nv] if nv else None, family=fam)
        n_ip, n_vp = int(g_i.prod(axis=1).sum()), int(g_v.prod(axis=1).sum())
        row = MultiModalInputs(
            input_ids=r_ids.astype(np.int64), attention_mask=np.ones(len(r_ids), np.int64),
            mm_token_type_ids=r_mm.astype(np.int64), position_ids=pos[:, 0].numpy(),
            rope_delta=int(delta.reshape(-1)[0]), family=fam.name,
            labels=to_numpy(labels)[b][keep].astype(np.int64) if labels is not None else None,
            image_grid_thw=g_i.astype(np.int64), video_grid_thw=g_v.astype(np.int64),
            second_per_grid_ts=secs[gv:gv + nv].astype(np.float32),
            pixel_values=(pv[pi:pi + n_ip] if pv is not None else np.zeros((0, fam.patch_dim), np.float32)),
            pixel_values_videos=pvv[pvi:pvi + n_vp] if (pvv is not None and nv) else None,
            image_backend=processor_backend(processor),  # whose float values these are
        )
        rows.append(row.validate(b))
        gi, gv, pi, pvi = gi + ni, gv + nv, pi + n_ip, pvi + n_vp
    for kind, used, grids in (("image", gi, igrid), ("video", gv, vgrid)):
        if used != len(grids):  # grids no row's tokens claimed: their media would be dropped, silently
            raise PlaceholderError(
                f"the rows' {kind} tokens claim {used} of the output's {len(grids)} {kind} grids",
                row=ids.shape[0] - 1, column="input_ids", expected=f"{len(grids)} {kind} grids' tokens",
                found=f"{used}", fix=f"pass the processor output these {kind}_grid_thw came with, with its "
                                     "mm_token_type_ids (or the family's pad tokens in input_ids)")
    return rows


def compact(row, spec: Optional[VisionSpec] = None):
    """float32 pixel storage -> compact uint8 storage, exactly (raises if the float values
    were not produced from uint8 pixels with these constants).

    ``row``: a `MultiModalInputs` (returned as one), or a stored row dict as a dataset holds it
    (``ds[i]`` in any format, ``row.to_dict()``), returned as a stored dict (`to_dict`), so
    ``ds.map(mmpipe.compact, remove_columns=ds.column_names)`` stores a float32 dataset as uint8.
    A row that is not float32 comes back unchanged (as given)."""
    from mmpipe.images.pixels import pixel_values_to_u8, video_pixel_values_to_u8

    if not isinstance(row, MultiModalInputs):  # a stored row: read, compact, store again
        record = MultiModalInputs.from_dict(row)
        return row if record.pixel_format != "float32" else compact(record, spec).to_dict()
    if row.pixel_format != "float32":
        return row
    spec = spec or VisionSpec.from_family(row.fam, row.image_backend)
    lut = spec.lut()
    fam = row.fam
    u8 = pixel_values_to_u8(row.pixel_values, lut, spec.temporal_patch_size, stage="validate") if row.pixel_values is not None \
        else np.zeros((0, fam.patch_dim_u8), np.uint8)
    vu8 = None if row.pixel_values_videos is None else \
        video_pixel_values_to_u8(row.pixel_values_videos, spec.for_videos().lut(), stage="validate")  # torchvision rule
    return replace(row, pixel_values=None, pixel_values_videos=None, pixel_values_u8=u8, pixel_values_videos_u8=vu8)
