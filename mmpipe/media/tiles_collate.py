"""Collate and unbatch for the ``tiles`` kind (`mmpipe.media.tiles`: Gemma 3, InternVL,
LLaVA-OneVision): what `mmpipe.collate` / `mmpipe.unbatch` ask of it.

- `collator_state`: what a picklable collator keeps of a processor: the pixel table float32
  [3, 256] of its image processor as its call uses it, and that image processor (for
  ``pixels="source"`` rows);
- `collate_media`: ``pixels="source"`` rows' files decoded and tiled (`decoded_rows`: in the
  DataLoader worker that builds the batch, bit for bit the tiles a ``"uint8"`` encode stores),
  the compact uint8 tiles expanded to the processor's float32 ``pixel_values``
  (`mmpipe.images.tiles.normalise_tiles`, bit-exact), the per-image layout and the family's extras;
- `unbatch_media`: each row's layout and tiles cut back out by the offsets.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.images.tiles import (
    effective_image_processor, image_tiles, normalise_table, normalise_tiles, with_images_kwargs,
)
from mmpipe.records.columns import offsets, to_numpy


def collator_state(processor, fam) -> dict:
    """``{"table": float32 [3, 256] or None, "image_processor": ... or None}`` (None without a
    processor: rows with pixels then cannot be collated)."""
    if processor is None:
        return {"table": None, "image_processor": None}
    ip = effective_image_processor(processor)
    return {"table": normalise_table(ip), "image_processor": ip}


def decoded_rows(rows: list, image_processor) -> list:
    """``pixels="source"`` rows -> the same rows with uint8 tiles (other rows as they are): each
    image file decoded, turned upright and tiled as the ``"uint8"`` encode does
    (`mmpipe.images.tiles.image_tiles`) with ``image_processor`` (`effective_image_processor` of
    the processor that encoded the rows) and the row's own ``images_kwargs``; each image's size
    and tile count checked against the row's."""
    if not any(r.image_sources is not None for r in rows):
        return rows
    if image_processor is None:
        raise ArgumentError("collating pixels='source' tiled rows needs the processor (their files are tiled here): "
                            "mmpipe.collate(rows, processor=processor) or mmpipe.Collator(processor)")
    own, out = getattr(image_processor, "backend", "pil"), []
    for i, r in enumerate(rows):
        if r.image_sources is None:
            out.append(r)
            continue
        if r.image_backend != own:
            raise InputError(f"the row was encoded for the {r.image_backend} image backend, collated with a {own} "
                             "image processor", row=i, column="image_backend", stage="collate",
                             expected=repr(own), found=repr(r.image_backend),
                             fix="collate with the processor (image backend) the rows were encoded with")
        ip, module = with_images_kwargs(image_processor, r.images_kwargs), r.fam.images()
        blocks = []
        for k, data in enumerate(r.image_sources):
            hw, tiles = image_tiles({"bytes": bytes(data), "path": None}, ip, module, where=f"row {i}, image {k}")
            want = (tuple(int(x) for x in r.image_hw[k]), int(r.tiles_per_image[k]))
            if (hw, len(tiles)) != want:
                raise PixelDataError(f"image {k}'s file decodes to size {hw} in {len(tiles)} tile(s) but the row "
                                     f"stores {want[0]} in {want[1]}", row=i, column="image_sources",
                                     stage="collate", expected=str(want), found=str((hw, len(tiles))),
                                     fix="collate with the processor (and its settings) the rows were encoded with")
            blocks.append(tiles)
        if not blocks:  # no images: an empty block of this processor's tile size
            from PIL import Image

            blocks = [module.tiles_u8(Image.new("RGB", (8, 8)), ip)[:0]]
        out.append(dataclasses.replace(r, image_sources=None, pixel_values_u8=np.concatenate(blocks)))
    return out


def _pixels(rows: list, table: Optional[np.ndarray], fam) -> tuple:
    """(uint8 tiles [N, S, S, 3], float32 pixel_values in the family's layout), or (None, None)
    for layout-only rows."""
    with_pixels = [r.has_pixels for r in rows]
    if not any(with_pixels):
        return None, None
    if not all(with_pixels):
        i = with_pixels.index(False)
        raise InputError("a layout-only row (no pixels) in a batch of rows with pixels", row=i,
                         column="pixel_values_u8", stage="collate", fix="encode every row with the same pixels= option")
    shapes = {r.pixel_values_u8.shape[1:] for r in rows if r.num_images}
    if len(shapes) > 1:
        raise InputError(f"tiles of different sizes in one batch: {sorted(shapes)}", row=0, column="pixel_values_u8",
                         stage="collate", fix="encode every row with the same processor")
    u8 = np.concatenate([r.pixel_values_u8 for r in rows])
    if not len(u8):
        return u8, np.zeros((0, 3, *u8.shape[1:3]), np.float32)
    if table is None:
        raise ArgumentError("collating tiled rows with pixels needs the processor (its normalisation): "
                            "mmpipe.collate(rows, processor=processor) or mmpipe.Collator(processor)")
    pv = normalise_tiles(u8, table)
    reshape = getattr(fam.images(), "batch_pixel_values", None)
    tiles = np.concatenate([r.tiles_per_image for r in rows])
    return u8, (reshape(pv, tiles) if reshape is not None else pv)


def collate_media(rows: list, ctx) -> dict:
    """The media fields of a batch (see `mmpipe.records.batch.BatchedMultiModalInputs`, numpy):
    ``image_hw`` int64 [I, 2], ``tiles_per_image`` int64 [I], ``patch_offsets`` int64 [B+1] (the
    tiles of each row), ``pixel_values_u8`` uint8 [N, S, S, 3] and ``pixel_values`` float32 in
    the family's layout (InternVL [N, 3, S, S]; LLaVA-OneVision [I, max tiles, 3, S, S]) or None
    for layout-only rows, ``pixel_format``, and the family's ``extras`` (LLaVA-OneVision
    ``image_sizes`` int64 [I, 2]). ``ctx.state`` from `collator_state`."""
    fam = ctx.fam
    rows = decoded_rows(rows, ctx.state.get("image_processor"))
    u8, pv = _pixels(rows, ctx.state.get("table"), fam)
    image_hw = np.concatenate([r.image_hw for r in rows]).astype(np.int64).reshape(-1, 2)
    extra = getattr(fam.images(), "extra_inputs", None)
    return dict(pixel_format="uint8" if u8 is not None else "none", image_hw=image_hw,
                tiles_per_image=np.concatenate([r.tiles_per_image for r in rows]).astype(np.int64),
                patch_offsets=offsets([int(r.tiles_per_image.sum()) for r in rows]), pixel_values_u8=u8,
                pixel_values=pv, extras={k: np.asarray(v) for k, v in extra(image_hw).items()}
                if extra is not None and len(image_hw) else {})


def unbatch_media(batch) -> list[dict]:
    """A batch -> each row's ``image_hw``, ``tiles_per_image`` and uint8 tiles (None for
    layout-only rows), exactly as collated."""
    io, to = to_numpy(batch.image_offsets).tolist(), to_numpy(batch.patch_offsets).tolist()
    hw, tiles = to_numpy(batch.image_hw), to_numpy(batch.tiles_per_image)
    u8 = to_numpy(batch.pixel_values_u8) if batch.pixel_values_u8 is not None else None
    return [dict(image_hw=hw[io[b]:io[b + 1]].copy(), tiles_per_image=tiles[io[b]:io[b + 1]].copy(),
                 pixel_values_u8=None if u8 is None else u8[to[b]:to[b + 1]].copy())
            for b in range(batch.batch_size)]
