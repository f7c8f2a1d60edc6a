"""Collate and unbatch for the ``patches`` kind (`mmpipe.media.patches`: Qwen2/2.5/3-VL, GLM-4.1V,
the text family): what `mmpipe.collate` / `mmpipe.unbatch` ask of it beyond the layout of its
items (`MEDIA_ITEMS`: grids and offsets, `mmpipe.batching.media_fields`).

- `collator_state`: what a picklable collator keeps of a processor: its `VisionSpec` (resize
  bounds, normalisation, backend) and its vision tokens;
- `collate_media`: the pixel data concatenated, compact uint8 rows expanded to the processor's
  float32 ``pixel_values`` bit for bit (``pixels="source"`` rows decoded and resized first, in
  the worker that builds the batch);
- `unbatch_media`: each row's pixels cut back out by the offsets (its grids: `mmpipe.unbatch`), in
  the storage the row came in, after checking the grids, offsets, pixel rows and media tokens agree.
"""

from __future__ import annotations

import numpy as np

from mmpipe.batching.checks import check_finite, check_slot_ids, check_vision_tokens
from mmpipe.batching.media_fields import MediaItems
from mmpipe.encoding.sources import with_pixels
from mmpipe.errors import InputError, PixelDataError
from mmpipe.images.pixels import (
    pixel_values_to_u8, u8_to_pixel_values, u8_video_to_pixel_values, video_pixel_values_to_u8,
)
from mmpipe.images.spec import VisionSpec
from mmpipe.records.columns import to_numpy
from mmpipe.records.vision_tokens import VisionTokens

# images, then videos: grids int64 [I, 3] (+ seconds per grid step float32 [V]), and patches
# (unbatch checks each pixel field's rows against the patches, and each row's tokens of type 1 / 2
# against its grids' t*h*w / merge**2: `mmpipe.batching.media_checks`)
MEDIA_ITEMS = (
    MediaItems("image_offsets", (("image_grid_thw", "int64", 3),), "patch_offsets", "image_grid_thw",
               rows=(("pixel_values", "patch_dim"), ("pixel_values_u8", "patch_dim_u8")), code=1,
               tokens="tokens_per_grid"),
    MediaItems("video_offsets", (("video_grid_thw", "int64", 3), ("second_per_grid_ts", "float32", None)),
               "video_patch_offsets", "video_grid_thw",
               rows=(("pixel_values_videos", "patch_dim"), ("pixel_values_videos_u8", "patch_dim")), code=2,
               tokens="tokens_per_grid"),
)
# each row's image files (pixels="source"; decoded into the batch's pixels): its own back at unbatch
ROW_FIELDS = (("image_sources", "row_image_sources"),)
# each item's pixel fields (same order): float32 [N, 3*T*p*p] and compact uint8
PIXELS = (("pixel_values", "pixel_values_u8"), ("pixel_values_videos", "pixel_values_videos_u8"))


def collator_state(processor, fam) -> dict:
    """``{"spec": VisionSpec, "vision_tokens": VisionTokens or None}``: the processor's resize
    bounds and normalisation (the family table's defaults without a processor, or for a
    tokenizer of the text family) and the tokens `check_vision_tokens` looks for (None: the
    pads the batch's own image blocks show)."""
    with_processor = processor is not None and fam.is_vision
    spec = VisionSpec.from_processor(processor) if with_processor else VisionSpec.from_family(fam)
    tokens = None if processor is None else VisionTokens.from_processor(processor, family=fam)
    return {"spec": spec, "vision_tokens": tokens, "spec_from_processor": with_processor}


def collate_media(rows: list, ctx) -> dict:
    """The pixel fields of a batch (see `mmpipe.records.batch.BatchedMultiModalInputs`):
    ``pixel_values`` float32 [sum N, 3*T*p*p] (+ ``pixel_values_u8`` uint8 [sum N, 3*p*p] from
    compact rows) and the same for videos, the batch's ``pixel_format``, ``spec`` and
    ``row_pixel_formats``. ``ctx``: the collate context (``ctx.state`` from `collator_state`,
    ``ctx.layout`` the grids and offsets)."""
    check_vision_tokens(rows, ctx.state.get("vision_tokens"))
    check_pad_ids(rows, ctx.state.get("vision_tokens"))
    spec, sources = ctx.state["spec"], [r.image_sources for r in rows]
    rows = [with_pixels(r, spec, i) for i, r in enumerate(rows)]  # pixels="source" rows: decode + resize here
    # the rows' shared storage ("uint8", "float32", "mixed"; "none": no media, or layout-only rows)
    formats = {r.pixel_format for r in rows if r.num_images or r.num_videos} if ctx.pixels else set()
    pixel_format = formats.pop() if len(formats) == 1 else ("mixed" if formats else "none")
    spec = spec.for_rows([r.image_backend if r.has_pixels and r.num_images else None for r in rows])  # images only
    pixels = {} if not ctx.pixels else _assemble_pixels(rows, spec, pixel_format, ctx.layout,
                                                        ctx.state.get("pixels_on_device", False))
    if ctx.pixels and pixel_format in ("float32", "mixed"):  # float32 rows next to the floats this spec makes
        check_normalisation(rows, spec, strict=bool(ctx.state.get("spec_from_processor")) or pixel_format == "mixed")
    return {**pixels, "pixel_format": pixel_format, "spec": spec, "row_pixel_formats": [r.pixel_format for r in rows],
            "row_image_sources": sources if any(s is not None for s in sources) else None}


def check_pad_ids(rows: list, vision_tokens, *, stage: str = "collate", index=None) -> None:
    """Every image / video slot of each row must hold a pad id of the processor's tokenizer
    (``vision_tokens.pad_ids``; None: not checked): `mmpipe.batching.checks.check_slot_ids`."""
    if vision_tokens is None:
        return
    pads = set(vision_tokens.pad_ids)
    names = [n for n, i in zip(vision_tokens.names, vision_tokens.ids) if i in pads]
    check_slot_ids(rows, sorted(pads), names, stage=stage, index=index)


def check_normalisation(rows: list, spec: VisionSpec, *, stage: str = "collate", index=None,
                        strict: bool = True) -> None:
    """Each row's stored float32 ``pixel_values`` / ``pixel_values_videos`` [N, 3*T*p*p] must be
    what ``spec`` makes (its patch width, its uint8 -> float table): compact rows take the
    collator's normalisation, float32 rows keep their encoder's, so a row normalised by another
    processor (image_mean/std, rescale_factor, do_normalize, temporal_patch_size) would be mixed in
    silently. The first patch row of each row is inverted (`pixel_values_to_u8`: exact or
    raise; a changed table moves every value). ``strict=False`` (a spec that is only the family's
    defaults, no processor given): only rows of two tables in one batch, some made with ``spec``
    and some not, are refused. `PixelDataError` naming the row (``index``, else its place in
    ``rows``), the column, the collator's settings and the fix."""
    errors = [_normalisation_error(r, spec, b if index is None else index, stage) for b, r in enumerate(rows)]
    found = [e for e in errors if e is not None]
    if found and (strict or len(found) < sum(r.pixel_values is not None or r.pixel_values_videos is not None
                                             for r in rows)):
        raise found[0]


def _normalisation_error(r, spec: VisionSpec, row, stage: str):
    """The `PixelDataError` of row ``r`` when its float32 pixels are not ``spec``'s, else None."""
    for videos, name in ((False, "pixel_values"), (True, "pixel_values_videos")):
        pv = getattr(r, name)
        if pv is None or not len(pv):
            continue
        width = 3 * spec.temporal_patch_size * spec.patch_size ** 2
        reason = f"rows {pv.shape[1]} wide" if pv.shape[1] != width else None
        if reason is None:
            try:
                _compact(np.ascontiguousarray(pv[:1]), spec, videos)
            except PixelDataError as e:
                reason = e.message_body()
        if reason is not None and _float16_rounded(pv[:1]):  # a cast of the stored column, not a setting
            return PixelDataError(f"{name} were rounded to float16 after encoding (every value of the row's first "
                                  "patch is a float16 one): the processor's float32 values are lost", row=row,
                                  column=name, stage=stage, fix="re-encode the rows (pixels='uint8' stores 1 byte "
                                  "per value, exactly), and keep float pixel columns float32",
                                  expected="float32 values of the processor's normalisation",
                                  found=f"{name} whose first patch holds only float16 values")
        if reason is not None:
            return PixelDataError(
                f"float32 {name} were not made with this processor's image settings ({reason}): "
                "compact rows take the processor's normalisation at collate, float32 rows keep the one "
                "they were encoded with", row=row, column=name, stage=stage,
                expected=f"rows {width} wide from uint8 pixels under image_mean={list(spec.image_mean)}, "
                         f"image_std={list(spec.image_std)}, rescale_factor={spec.rescale_factor}, "
                         f"do_normalize={spec.do_normalize}, temporal_patch_size={spec.temporal_patch_size} "
                         f"({spec.backend} backend)",
                found="values off that table", fix="collate with the processor the rows were encoded with, or "
                "re-encode them with pixels='uint8' (compact rows take the collating processor's "
                "normalisation)")
    return None


def _float16_rounded(pv: np.ndarray) -> bool:
    """Whether float32 patch rows hold float16 values only (more than two distinct ones: a black
    or white patch of unnormalised pixels, 0 and 1, is float16 too)."""
    return bool(pv.size) and np.unique(pv).size > 2 and np.array_equal(pv, pv.astype(np.float16))


def expand_u8(u8: np.ndarray, spec: VisionSpec, videos: bool) -> np.ndarray:
    """Compact uint8 rows -> the processor's float32 rows, bit for bit (videos: the torchvision
    rule, the video processor's, whatever the image backend)."""
    if videos:
        return u8_video_to_pixel_values(u8, spec.for_videos().lut())
    return u8_to_pixel_values(u8, spec.lut(), spec.temporal_patch_size)


def _compact(pv: np.ndarray, spec: VisionSpec, videos: bool) -> np.ndarray:
    """Float32 rows -> compact uint8 rows (the inverse of `expand_u8`)."""
    if videos:
        return video_pixel_values_to_u8(pv, spec.for_videos().lut(), stage="validate")
    return pixel_values_to_u8(pv, spec.lut(), spec.temporal_patch_size)


def _assemble_pixels(rows: list, spec: VisionSpec, pixel_format: str, layout: dict,
                     on_device: bool = False) -> dict[str, np.ndarray]:
    """Pixel data concatenated in row order: pixel_values float32 [sum N, D] (rebuilt from
    compact uint8 rows bit for bit, kept as pixel_values_u8; ``on_device``: left to
    `device_pixels`, pixel_values None), and the same for videos. Float rows are checked for
    NaN/inf in one vectorised pass."""
    out: dict[str, np.ndarray] = {}
    for videos, (items, (name, name_u8)) in enumerate(zip(MEDIA_ITEMS, PIXELS)):
        grids = items.fields[0][0]
        if not layout[grids].shape[0]:
            continue
        if pixel_format == "uint8":
            u8 = out[name_u8] = np.concatenate([getattr(r, name_u8) for r in rows if len(getattr(r, grids))])
            out[name] = None if on_device else expand_u8(u8, spec, bool(videos))
        else:
            pv = out[name] = np.concatenate([_float_pixels(r, spec, bool(videos)) for r in rows])
            check_finite(pv, layout[items.units], name)
    return out


def _float_pixels(r, spec: VisionSpec, videos: bool) -> np.ndarray:
    """A row's float32 image (or video) pixel rows, rebuilt from its compact uint8 rows when
    it stores those (a batch mixing storage formats); [0, D] without any."""
    pv, u8 = (getattr(r, name) for name in PIXELS[videos])
    if pv is not None:
        return pv
    if u8 is not None:
        return expand_u8(u8, spec, videos)
    return np.zeros((0, r.fam.patch_dim), np.float32)


def device_pixels(batch, device) -> dict:
    """The float32 ``pixel_values`` / ``pixel_values_videos`` of a batch collated with
    ``pixels_on_device`` (uint8 kept, float32 None), expanded on ``device`` with the batch's
    `VisionSpec` tables (`u8_to_pixel_values_torch`: bit for bit the CPU expansion); {} when the
    batch holds its float32 pixels already."""
    from mmpipe.images.pixels import u8_to_pixel_values_torch

    out = {}
    for videos, (name, name_u8) in enumerate(PIXELS):
        u8 = getattr(batch, name_u8)
        if getattr(batch, name) is None and u8 is not None and len(u8):
            import torch

            u8 = torch.as_tensor(u8).to(device if device is not None else "cpu", non_blocking=True)
            spec = batch.spec.for_videos() if videos else batch.spec
            out[name] = u8_to_pixel_values_torch(u8, spec.lut(), 1 if videos else spec.temporal_patch_size)
    return out


# ---- unbatch ------------------------------------------------------------------------------
def unbatch_media(batch, rows: list) -> list[dict]:
    """A batch -> each row's media fields: its grids as unbatch cut them (``rows``), and its pixels
    in the storage it came in (compact uint8 rows come back compact; unbatch checked them first,
    `mmpipe.batching.media_checks`)."""
    arrays = {n: None if getattr(batch, n) is None else to_numpy(getattr(batch, n))
              for pair in PIXELS for n in pair}
    units = [to_numpy(getattr(batch, items.units)).tolist() for items in MEDIA_ITEMS]
    formats = batch.row_pixel_formats or [batch.pixel_format] * batch.batch_size
    for b, row in enumerate(rows):
        for videos, (name, name_u8) in enumerate(PIXELS):
            if videos and not len(row["video_grid_thw"]):
                continue  # a row without videos has no video pixels
            cut = slice(units[videos][b], units[videos][b + 1])
            pv, u8 = (None if arrays[n] is None else arrays[n][cut] for n in (name, name_u8))
            row.update(_row_pixels(formats[b], pv, u8, batch, bool(videos)))
        if formats[b] != "none" and batch.spec is not None:
            row["image_backend"] = batch.spec.backend
    return rows


def _row_pixels(fmt: str, pv, u8, batch, videos: bool) -> dict:
    """One row's image (or video) pixels in its storage ``fmt``, from the batch's rows ``pv``
    (float32) and ``u8`` (compact; a batch that mixed storage formats kept only float32): a
    row's images always get a (maybe empty) block, its videos only one the batch holds."""
    name, name_u8 = PIXELS[videos]
    fam = batch.fam
    if fmt == "uint8":
        if u8 is None and pv is not None:
            u8 = _compact(pv, batch.spec, videos)
        if u8 is None and not videos:
            u8 = np.zeros((0, fam.patch_dim_u8), np.uint8)
        return {} if u8 is None else {name_u8: u8.copy()}
    if fmt == "float32":
        if pv is None and not videos:
            pv = np.zeros((0, fam.patch_dim), np.float32)
        return {} if pv is None else {name: pv.copy()}
    return {}
