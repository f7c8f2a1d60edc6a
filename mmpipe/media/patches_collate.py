"""Collate and unbatch for the ``patches`` kind (`mmpipe.media.patches`: Qwen2/2.5/3-VL, GLM-4.1V,
the text family): what `mmpipe.collate` / `mmpipe.unbatch` ask of it.

- `collator_state`: what a picklable collator keeps of a processor: its `VisionSpec` (resize
  bounds, normalisation, backend) and its vision tokens;
- `collate_media`: grids and offsets in row order, and the pixel data concatenated, compact
  uint8 rows expanded to the processor's float32 ``pixel_values`` bit for bit
  (``pixels="source"`` rows decoded and resized first, in the worker that builds the batch);
- `unbatch_media`: each row's grids and pixels cut back out by the offsets, in the storage the
  row came in, after checking the grids, offsets, pixel rows and media tokens agree.
"""

from __future__ import annotations

import logging
import numpy as np

from mmpipe.batching.checks import check_finite, check_vision_tokens
from mmpipe.encoding.sources import with_pixels
from mmpipe.errors import PixelDataError
from mmpipe.images.pixels import (
    pixel_values_to_u8, u8_to_pixel_values, u8_video_to_pixel_values, video_pixel_values_to_u8,
)
from mmpipe.images.spec import VisionSpec
from mmpipe.records.columns import offsets, to_numpy
from mmpipe.records.vision_tokens import VisionTokens

logger = logging.getLogger("mmpipe")

FIX = "build the batch with mmpipe.collate(rows) and do not edit its fields in place"


def collator_state(processor, fam) -> dict:
    """``{"spec": VisionSpec, "vision_tokens": VisionTokens or None}``: the processor's resize
    bounds and normalisation (the family table's defaults without a processor, or for a
    tokenizer of the text family) and the tokens `check_vision_tokens` looks for (None: the
    pads the batch's own image blocks show)."""
    with_processor = processor is not None and fam.is_vision
    spec = VisionSpec.from_processor(processor) if with_processor else VisionSpec.from_family(fam)
    tokens = None if processor is None else VisionTokens.from_processor(processor, family=fam)
    return {"spec": spec, "vision_tokens": tokens}


def collate_media(rows: list, ctx) -> dict:
    """The media fields of a batch (see `mmpipe.records.batch.BatchedMultiModalInputs`):
    ``image_grid_thw`` / ``video_grid_thw`` int64 [sum I, 3], ``second_per_grid_ts`` float32
    [sum V], the offsets int64 [B+1], ``pixel_values`` float32 [sum N, 3*T*p*p] (+
    ``pixel_values_u8`` uint8 [sum N, 3*p*p] from compact rows) and the same for videos, the
    batch's ``pixel_format``, ``spec`` and ``row_pixel_formats``. ``ctx``: the collate context
    (``ctx.state`` from `collator_state`)."""
    check_vision_tokens(rows, ctx.state.get("vision_tokens"))
    spec = ctx.state["spec"]
    rows = [with_pixels(r, spec, i) for i, r in enumerate(rows)]  # pixels="source" rows: decode + resize here
    media = _media_layout(rows)
    pixel_format, layout_only = _pixel_format(rows)
    spec = spec.for_rows([r.image_backend if r.has_pixels and r.num_images else None for r in rows])  # images only
    pixels = {} if layout_only else _assemble_pixels(rows, spec, pixel_format, media)
    return {**media, **pixels, "pixel_format": pixel_format, "spec": spec,
            "row_pixel_formats": [r.pixel_format for r in rows]}


def _media_layout(rows: list) -> dict[str, np.ndarray]:
    """Grids in row order and the offsets int64 [B+1] that slice each row's images, image
    patches, videos and video patches back out."""
    return {
        "image_grid_thw": np.concatenate([r.image_grid_thw for r in rows]).reshape(-1, 3).astype(np.int64),
        "video_grid_thw": np.concatenate([r.video_grid_thw for r in rows]).reshape(-1, 3).astype(np.int64),
        "second_per_grid_ts": np.concatenate([r.second_per_grid_ts for r in rows]).astype(np.float32),
        "image_offsets": offsets([r.num_images for r in rows]),
        "patch_offsets": offsets([r.num_image_patches for r in rows]),
        "video_offsets": offsets([r.num_videos for r in rows]),
        "video_patch_offsets": offsets([r.num_video_patches for r in rows]),
    }


def _pixel_format(rows: list) -> tuple[str, bool]:
    """``(pixel_format, layout_only)``: the rows' shared pixel storage ("uint8", "float32",
    "mixed", or "none" without media) and whether the batch is text-only because its rows
    with images carry no pixel data (layout-only encoding; logged). Rows with and rows
    without pixel data cannot share a batch."""
    formats = {r.pixel_format for r in rows if r.num_images or r.num_videos}
    missing = [i for i, r in enumerate(rows) if (r.num_images or r.num_videos) and not r.has_pixels]
    pixel_format = formats.pop() if len(formats) == 1 else ("mixed" if formats else "none")
    with_pixels_ = [i for i, r in enumerate(rows) if (r.num_images or r.num_videos) and r.has_pixels]
    if missing and with_pixels_:
        # a text-only batch would silently drop the pixels of the other rows (found by fuzzing)
        raise PixelDataError(
            f"rows {missing} hold images but no pixel data (layout-only encoding) while rows {with_pixels_} "
            "carry pixels; one batch cannot mix them", row=missing[0], column="pixel_values_u8",
            stage="collate", fix="encode every row with pixels='uint8' (or filter layout-only rows out)",
        )
    if missing:
        logger.warning(
            "rows %s hold images but no pixel data (layout-only encoding?); the batch is text-only: "
            "the model will not see any image. Encode with pixels='uint8' to train on images.",
            missing,
        )
        return "none", True
    return pixel_format, False


def _assemble_pixels(rows: list, spec: VisionSpec, pixel_format: str, media: dict) -> dict[str, np.ndarray]:
    """Pixel data concatenated in row order: pixel_values float32 [sum N, D] (rebuilt from
    compact uint8 rows bit for bit, kept as pixel_values_u8), and the same for videos. Float
    rows are checked for NaN/inf in one vectorised pass."""
    out: dict[str, np.ndarray] = {}
    if media["image_grid_thw"].shape[0]:
        if pixel_format == "uint8":
            pv_u8 = out["pixel_values_u8"] = np.concatenate([r.pixel_values_u8 for r in rows if r.num_images])
            out["pixel_values"] = u8_to_pixel_values(pv_u8, spec.lut(), spec.temporal_patch_size)
        else:
            pv = out["pixel_values"] = np.concatenate([_float_pixels(r, spec, False) for r in rows])
            check_finite(pv, media["patch_offsets"], "pixel_values")
    if media["video_grid_thw"].shape[0]:
        if pixel_format == "uint8":
            pvv_u8 = out["pixel_values_videos_u8"] = np.concatenate(
                [r.pixel_values_videos_u8 for r in rows if r.num_videos])
            # videos: the torchvision rule (the video processor's), whatever the image backend
            out["pixel_values_videos"] = u8_video_to_pixel_values(pvv_u8, spec.for_videos().lut())
        else:
            pvv = out["pixel_values_videos"] = np.concatenate([_float_pixels(r, spec, True) for r in rows])
            check_finite(pvv, media["video_patch_offsets"], "pixel_values_videos")
    return out


def _float_pixels(r, spec: VisionSpec, videos: bool) -> np.ndarray:
    """A row's float32 image (or video) pixel rows, rebuilt from its compact uint8 rows when
    it stores those (a batch mixing storage formats); [0, D] without any."""
    if videos:
        if r.pixel_values_videos is not None:
            return r.pixel_values_videos
        if r.pixel_values_videos_u8 is not None:
            return u8_video_to_pixel_values(r.pixel_values_videos_u8, spec.for_videos().lut())
    else:
        if r.pixel_values is not None:
            return r.pixel_values
        if r.pixel_values_u8 is not None:
            return u8_to_pixel_values(r.pixel_values_u8, spec.lut(), spec.temporal_patch_size)
    return np.zeros((0, r.fam.patch_dim), np.float32)


# ---- unbatch ------------------------------------------------------------------------------
def unbatch_media(batch) -> list[dict]:
    """A batch -> each row's media fields (grids, and its pixels in the storage it came in:
    compact uint8 rows come back compact), after `check_media`."""
    fam, B = batch.fam, batch.batch_size

    def opt(v):
        return to_numpy(v) if v is not None else None

    grids, vgrids = to_numpy(batch.image_grid_thw), to_numpy(batch.video_grid_thw)
    secs, mm = to_numpy(batch.second_per_grid_ts), to_numpy(batch.mm_token_type_ids)
    io, po = to_numpy(batch.image_offsets), to_numpy(batch.patch_offsets)
    vo, vpo = to_numpy(batch.video_offsets), to_numpy(batch.video_patch_offsets)
    pv, pv_u8 = opt(batch.pixel_values), opt(batch.pixel_values_u8)
    pvv, pvv_u8 = opt(batch.pixel_values_videos), opt(batch.pixel_values_videos_u8)
    check_media(batch, mm, (grids, io, po, pv, pv_u8), (vgrids, vo, vpo, pvv, pvv_u8), secs)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    io, po, vo, vpo = io.tolist(), po.tolist(), vo.tolist(), vpo.tolist()  # python ints: faster slicing
    spec, out = batch.spec, []
    for b in range(B):
        row: dict = dict(image_grid_thw=grids[io[b]:io[b + 1]].copy(), video_grid_thw=vgrids[vo[b]:vo[b + 1]].copy(),
                         second_per_grid_ts=secs[vo[b]:vo[b + 1]].copy())
        videos = vo[b + 1] > vo[b]
        ip, vp = slice(po[b], po[b + 1]), slice(vpo[b], vpo[b + 1])
        if formats[b] == "uint8":
            if pv_u8 is not None:
                row["pixel_values_u8"] = pv_u8[ip].copy()
            elif pv is not None:  # a batch that mixed storage formats kept only float32
                row["pixel_values_u8"] = pixel_values_to_u8(pv[ip], spec.lut(), spec.temporal_patch_size)
            else:
                row["pixel_values_u8"] = np.zeros((0, fam.patch_dim_u8), np.uint8)
            if pvv_u8 is not None and videos:
                row["pixel_values_videos_u8"] = pvv_u8[vp].copy()
            elif pvv is not None and videos:  # a mixed-storage batch kept only float32 videos too
                row["pixel_values_videos_u8"] = video_pixel_values_to_u8(pvv[vp], spec.for_videos().lut(),
                                                                         stage="validate")
        elif formats[b] == "float32":
            row["pixel_values"] = pv[ip].copy() if pv is not None else np.zeros((0, fam.patch_dim), np.float32)
            if pvv is not None and videos:
                row["pixel_values_videos"] = pvv[vp].copy()
        if formats[b] != "none" and spec is not None:
            row["image_backend"] = spec.backend
        out.append(row)
    return out


def check_media(batch, mm: np.ndarray, images: tuple, videos: tuple, secs: np.ndarray) -> None:
    """Offsets, patch offsets, pixel rows and per-row media tokens of the images and videos
    (``images`` / ``videos``: grids [n, 3], offsets [B+1], patch offsets [B+1], float32 and
    uint8 pixels or None) agree with each other and with ``mm`` (the token types [B, L]).
    Raises `PixelDataError` at stage "validate" naming the batch row and the field."""
    fam, B, has_videos = batch.fam, batch.batch_size, len(videos[0]) > 0
    for kind, code, (grids, off, poff, pv, pv_u8), dims in (
            ("image", 1, images, (fam.patch_dim, fam.patch_dim_u8)),
            ("video", 2, videos, (fam.patch_dim, fam.patch_dim))):
        names = ("pixel_values", "pixel_values_u8") if kind == "image" else \
            ("pixel_values_videos", "pixel_values_videos_u8")
        pixels = tuple(zip(names, (pv, pv_u8), dims))
        _check_kind(batch, kind, code, mm, grids, off, poff, pixels, B, has_videos)
    if len(secs) != len(videos[0]):
        raise PixelDataError(where="", column="second_per_grid_ts", stage="validate",
                             expected=f"{len(videos[0])} values (one per video)", found=len(secs), fix=FIX)


def _check_kind(batch, kind, code, mm, grids, off, poff, pixels, B, videos) -> None:
    """Offsets, patch offsets, pixel rows and per-row media tokens of one kind (image / video)."""
    oname = "image_offsets" if kind == "image" else "video_offsets"
    pname = "patch_offsets" if kind == "image" else "video_patch_offsets"
    if not len(grids) and off.shape == poff.shape == (B + 1,) and not off.any() and not poff.any():
        # no images: no media token at all (no videos either) or no image token; no videos: the
        # image count below (a sum of the 0/1 types) sees any other type
        bad = ((mm == 1) if videos else (mm != 0)) if code == 1 else None
        if bad is not None and bad.any():
            b = int(np.flatnonzero(bad.any(1))[0])
            raise PixelDataError(f"media tokens in mm_token_type_ids but the batch holds no {kind}", row=b,
                                 column=f"{kind}_grid_thw", stage="validate", fix=FIX)
        for name, arr, _ in pixels:
            if arr is not None and len(arr):
                raise PixelDataError(where="", column=name, stage="validate", expected=f"no rows (no {kind})",
                                     found=tuple(arr.shape), fix=FIX)
        return
    for name, o in ((oname, off), (pname, poff)):
        if o.shape != (B + 1,) or o[0] != 0 or (o[1:] < o[:-1]).any():
            b = int(np.flatnonzero(o[1:] < o[:-1])[0]) if o.shape == (B + 1,) and o[0] == 0 else None
            raise PixelDataError(row=b, where=None if b is not None else "", column=name, stage="validate",
                                 expected=f"shape ({B + 1},), starting at 0, non-decreasing",
                                 found=o.tolist()[:8], fix=FIX)
    if off[-1] != len(grids):
        raise PixelDataError(row=B - 1, column=oname, stage="validate",
                             expected=f"{oname}[-1] = {len(grids)} ({kind}_grid_thw rows)", found=int(off[-1]), fix=FIX)
    patches = np.zeros(len(grids) + 1, np.int64)
    np.cumsum(grids.prod(-1), out=patches[1:])
    if (poff != patches[off]).any():
        b = max(int(np.flatnonzero(poff != patches[off])[0]) - 1, 0)
        raise PixelDataError(f"{pname} {int(poff[b])}:{int(poff[b + 1])} disagree with the row's {kind}_grid_thw "
                             f"({int(patches[off[b + 1]] - patches[off[b]])} patches)", row=b, column=pname,
                             stage="validate", fix=FIX)
    for name, arr, dim in pixels:
        if arr is not None and arr.shape != (int(patches[-1]), dim):
            raise PixelDataError(row=None, where="", column=name, stage="validate",
                                 expected=f"shape ({int(patches[-1])}, {dim}) from {kind}_grid_thw",
                                 found=tuple(arr.shape), fix=FIX)
    tokens = np.zeros(len(grids) + 1, np.int64)
    np.cumsum(batch.fam.tokens_per_grid(grids), out=tokens[1:])
    have = np.count_nonzero(mm == code, axis=1) if videos else mm.sum(1)  # no videos: 0/1 types, a sum counts
    want = tokens[off[1:]] - tokens[off[:-1]]
    if (have != want).any():
        b = int(np.flatnonzero(have != want)[0])
        raise PixelDataError(f"{int(have[b])} {kind} tokens (type {code}) in mm_token_type_ids but its {kind}_grid_thw "
                             f"need {int(want[b])}", row=b, column=f"{kind}_grid_thw", stage="validate", fix=FIX)
