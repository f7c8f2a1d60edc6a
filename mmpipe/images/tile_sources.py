"""``pixels="source"`` rows of the tiled families (Gemma 3, InternVL, LLaVA-OneVision) -> their
uint8 tiles, at collate time (in the DataLoader worker that builds the batch): each stored image
file decoded, turned upright and tiled as the ``"uint8"`` encode does (`mmpipe.images.tiles`), bit
for bit the tiles that encode stores. `mmpipe.media.tiles` collates the rows this gives.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.images.tiles import image_tiles, with_images_kwargs


def decoded_rows(rows: list, image_processor) -> list:
    """``pixels="source"`` rows -> the same rows with uint8 tiles [N, S, S, 3] (other rows as
    they are): each image file decoded, turned upright and tiled as the ``"uint8"`` encode does
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
