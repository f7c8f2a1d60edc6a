"""Collate and unbatch for the ``tiles`` kind (`mmpipe.media.tiles`: Gemma 3, InternVL,
LLaVA-OneVision): what `mmpipe.collate` / `mmpipe.unbatch` ask of it beyond the layout of its
images (`MEDIA_ITEMS`, `mmpipe.batching.media_fields`).

- `collator_state`: what a picklable collator keeps of a processor: the pixel table float32
  [3, 256] of its image processor as its call uses it, and that image processor (for
  ``pixels="source"`` rows, `mmpipe.images.tile_sources.decoded_rows`);
- `collate_media`: the compact uint8 tiles expanded to the processor's float32 ``pixel_values``
  (`mmpipe.images.tiles.normalise_tiles`, bit-exact) and the family's extras (LLaVA-OneVision:
  ``image_sizes`` and ``batch_num_images``, which tells the model each row's multi-image mode);
- `unbatch_media`: each row's tiles as `mmpipe.batching.unbatch` cut them out by the offsets
  (`MEDIA_ITEMS`; its ``images_kwargs``: `ROW_FIELDS`), in the storage the row came in: a
  layout-only text row (``pixels="none"``) batched with uint8 rows gets no tiles back, not an
  empty block (``row_pixel_formats``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import numpy as np

from mmpipe.batching.checks import check_slot_ids
from mmpipe.batching.media_fields import MediaItems
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.images.tile_sources import decoded_rows
from mmpipe.images.tiles import effective_image_processor, normalise_table, normalise_tiles

# each image's upright (height, width) int64 [I, 2] and tile count int64 [I]; its tiles [N, S, S, 3]
# (unbatch: each row's, None for layout-only rows)
MEDIA_ITEMS = (MediaItems("image_offsets", (("image_hw", "int64", 2), ("tiles_per_image", "int64", None)),
                          "patch_offsets", "tiles_per_image", ("pixel_values_u8",), rows=(("pixel_values_u8", None),)),)
# each row's encoder images_kwargs (Gemma 3 pan-and-scan), and its image files (pixels="source": decoded at collate)
ROW_FIELDS = (("images_kwargs", "row_images_kwargs"), ("image_sources", "row_image_sources"))


def collator_state(processor, fam) -> dict:
    """``{"table": float32 [3, 256], "image_processor": ..., "tile": (S_h, S_w) its tile size
    (`tile_size`), "feature_id": its tokenizer's feature token id or None}``; every value None
    without a processor (rows with pixels then cannot be collated, nothing is checked)."""
    if processor is None:
        return {"table": None, "image_processor": None, "tile": None, "feature_id": None}
    ip = effective_image_processor(processor)
    tok = getattr(processor, "tokenizer", None)
    feature = None if tok is None else fam.token_ids(tok)["feature"]
    return {"table": normalise_table(ip), "image_processor": ip, "tile": tile_size(ip, fam),
            "feature_id": None if feature is None else int(feature)}


def tile_size(image_processor, fam) -> tuple[int, int]:
    """(S_h, S_w): the size the image processor resizes every tile to (its family's image module's
    rule: Gemma 3's ``tile_size``, else ``settings(...)["tile"]``)."""
    module = fam.images()
    own = getattr(module, "tile_size", None)
    tile = own(image_processor) if own is not None else module.settings(image_processor)["tile"]
    return tuple(int(x) for x in tile)


def check_tile_size(rows: list, tile: Optional[tuple], stage: str = "collate", index=None,
                    fix: str = "collate with the processor the rows were encoded with, or re-encode them with "
                               "this one") -> None:
    """Each row's stored tiles uint8 [n, S, S, 3] must be of the processor's tile size ``tile``
    (None: not checked): collate would normalise tiles of another processor's size (a checkpoint of
    another image size) as they are, and the model's vision tower takes its own size.
    `PixelDataError` naming the row (``index``, else its place in ``rows``), ``tile_hw``, both sizes
    and the fix."""
    if tile is None:
        return
    for b, r in enumerate(rows):
        u8 = r.pixel_values_u8
        if u8 is None or not len(u8) or tuple(u8.shape[1:3]) == tuple(tile):
            continue
        raise PixelDataError(f"the row's tiles are {u8.shape[1]}x{u8.shape[2]} but the processor resizes every "
                             f"tile to {tile[0]}x{tile[1]} (its image processor's size): rows encoded by a "
                             "processor of another image size", row=b if index is None else index,
                             column="tile_hw", stage=stage, expected=str(list(tile)),
                             found=str(list(u8.shape[1:3])), fix=fix)


def _pixels(rows: list, table: Optional[np.ndarray], fam, tiles: np.ndarray) -> tuple:
    """(uint8 tiles [N, S, S, 3], float32 pixel_values in the family's layout) of the rows' stored
    tiles ((None, None) for rows without images that store none: layout-only text rows; ``tiles``:
    the batch's ``tiles_per_image`` int64 [I])."""
    stored = [r.pixel_values_u8 for r in rows if r.pixel_values_u8 is not None]
    shapes = {u.shape[1:] for u in stored if len(u)}
    if len(shapes) > 1:
        raise InputError(f"tiles of different sizes in one batch: {sorted(shapes)}", row=0, column="pixel_values_u8",
                         stage="collate", expected="one tile size",
                         found=str(sorted(shapes)), fix="encode every row with the same processor")
    if not stored:
        return None, None
    u8 = np.concatenate(stored)
    if not len(u8):
        return u8, np.zeros((0, 3, *u8.shape[1:3]), np.float32)
    if table is None:
        raise ArgumentError("collating tiled rows with pixels needs the processor (its normalisation): "
                            "mmpipe.collate(rows, processor=processor) or mmpipe.Collator(processor)")
    pv = normalise_tiles(u8, table)
    reshape = getattr(fam.images(), "batch_pixel_values", None)
    return u8, (reshape(pv, tiles) if reshape is not None else pv)


def collate_media(rows: list, ctx) -> dict:
    """The pixel fields of a batch (see `mmpipe.records.batch.BatchedMultiModalInputs`, numpy):
    ``pixel_values_u8`` uint8 [N, S, S, 3] and ``pixel_values`` float32 in the family's layout
    (InternVL [N, 3, S, S]; LLaVA-OneVision [I, max tiles, 3, S, S]) or None for layout-only
    rows, ``pixel_format``, and the family's ``extras`` (LLaVA-OneVision ``image_sizes`` int64
    [I, 2] and ``batch_num_images`` int64 [K], `mmpipe.images.onevision.extra_inputs`), and, for
    a batch mixing rows with and without stored tiles, each row's ``row_pixel_formats`` (for an
    exact unbatch; None otherwise). ``ctx.state`` from `collator_state`;
    ``ctx.layout``: ``image_hw`` int64 [I, 2], ``tiles_per_image`` int64 [I], ``image_offsets``
    int64 [B+1] (the images of each row),
    ``patch_offsets`` int64 [B+1] (the tiles of each row)."""
    sources = [r.image_sources for r in rows]
    # what each row holds in the batch (source rows: their decoded tiles), for an exact unbatch
    formats = ["none" if r.pixel_format == "none" else "uint8" for r in rows]
    if ctx.state.get("feature_id") is not None:  # rows of this processor's tokenizer?
        check_slot_ids(rows, [ctx.state["feature_id"]], [ctx.fam.feature_token], kinds=(1,))
    rows = decoded_source_rows(rows, ctx.state.get("image_processor"), ctx.fam.images())
    if ctx.pixels:
        check_tile_size(rows, ctx.state.get("tile"))
    u8, pv = _pixels(rows, ctx.state.get("table"), ctx.fam, ctx.layout["tiles_per_image"]) if ctx.pixels else (None, None)
    image_hw, extra, extras = ctx.layout["image_hw"], getattr(ctx.fam.images(), "extra_inputs", None), {}
    if extra is not None and len(image_hw):
        extras = extra(image_hw, tiles_per_image=ctx.layout["tiles_per_image"],
                       image_offsets=ctx.layout["image_offsets"])
    kwargs = [r.images_kwargs for r in rows]
    mixed = u8 is not None and "none" in formats  # else every row's tiles cut back as it came
    return dict(pixel_format="uint8" if u8 is not None else "none", pixel_values_u8=u8, pixel_values=pv,
                row_pixel_formats=formats if mixed else None, extras={k: np.asarray(v) for k, v in extras.items()},
                row_images_kwargs=kwargs if any(k is not None for k in kwargs) else None,
                row_image_sources=sources if any(s is not None for s in sources) else None)


def unbatch_media(batch, rows: list) -> list[dict]:
    """Each row's media fields as unbatch cut them out (``rows``), its tiles in the storage it came
    in (``batch.row_pixel_formats``): a row stored without pixels (a layout-only text row next to
    uint8 rows) gets ``pixel_values_u8`` None, not the empty block its offsets cut."""
    for row, fmt in zip(rows, batch.row_pixel_formats or ()):
        if fmt == "none":
            row["pixel_values_u8"] = None
    return rows


def decoded_source_rows(rows: list, image_processor, module) -> list:
    """`decoded_rows`, each ``pixels="source"`` row re-tiled with the image processor as the
    processor's call for its conversation used it where the family's tiling depends on that
    (the module's ``row_image_processor``: LLaVA-OneVision's mode, read from the row's layout)."""
    hook = getattr(module, "row_image_processor", None)
    if hook is None or image_processor is None or all(r.image_sources is None for r in rows):
        return decoded_rows(rows, image_processor)
    # one call per source row, with the rows before it as no-source fillers: decoded_rows names a
    # failing row by its place in the list it is given
    return [decoded_rows([_NO_SOURCE] * i + [r], hook(image_processor, r.tiles_per_image))[i]
            if r.image_sources is not None else r for i, r in enumerate(rows)]


_NO_SOURCE = SimpleNamespace(image_sources=None)  # a row decoded_rows passes through as it is
