"""The validate stage's part of the ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision),
one of its modules (`mmpipe.media.KINDS`, asked as ``fam.media.<name>``): the columns a
stored tiles row carries (the published schema's types, strict as for every kind; rows of the
previous release stored ``mm_token_type_ids`` as int32, which reads the same and ``fix=True``
casts), and each row's image feature tokens:

- every token marked 1 in ``mm_token_type_ids`` holds the family's feature token and no
  unmarked token does; the marked tokens form one run per image (per tile for Gemma 3, whose
  every tile has its own text);
- with the processor the rows were encoded with (and the ``images_kwargs`` they were encoded
  with, e.g. Gemma 3 pan-and-scan): each image's tile count and feature tokens vs its stored
  (height, width), as the family's image module (`ModelFamily.images`) computes them. Where the
  tiling depends on the row's image count (LLaVA-OneVision's multi-image mode), in the mode
  ``images_kwargs`` names, else in the one the row's layout shows (rows of either mode are
  valid processor outputs).

The same names exist in `mmpipe.media.patches_validate` and `mmpipe.media.processor`; the validate stage
(`mmpipe.data.validate`) calls them as ``fam.media.<name>``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from mmpipe.data.column_rules import ExpectedColumn
from mmpipe.records.codec import stored_row_error

KIND_COLUMN = "tiles_per_image"  # only tiles rows store it (names a table without a family)


def expected_columns(table: pa.Table, *, labels: bool, pixel_format: str) -> list[ExpectedColumn]:
    """The stored tiles columns as `mmpipe.media.tiles.COLUMNS` declare them
    (`mmpipe.data.validate_columns.declared_columns`): the token and layout columns, and
    ``tile_hw`` with stored tiles; the published schema's columns with their exact types."""
    from mmpipe.data.validate_columns import declared_columns
    from mmpipe.media.tiles import COLUMNS

    return declared_columns(table, COLUMNS, "tiles")


def row_checks(table: pa.Table, *, processor=None, images_kwargs: Optional[dict] = None,
               positions: bool = True) -> Optional[Callable]:
    """``check(row, index)`` of each row's feature tokens (module doc), exact counts with
    ``processor``; None when no row of ``table`` marks a feature token (nothing to check)."""
    counts = None if processor is None else _processor_counts(processor, images_kwargs)
    feature_id = counts[0] if counts is not None else _most_marked_id(table)
    if feature_id is None:
        return None
    tile = None if processor is None else _processor_tile(processor, images_kwargs)
    return partial(_check_features, feature_id=feature_id, counts=None if counts is None else counts[1], tile=tile)


def _processor_tile(processor, images_kwargs: Optional[dict]) -> tuple[int, int]:
    """(S_h, S_w) the processor (with ``images_kwargs``) resizes every tile to."""
    from mmpipe.families import resolve_family
    from mmpipe.images.tiles import effective_image_processor
    from mmpipe.media.tiles_collate import tile_size

    fam = resolve_family(processor)
    split = getattr(fam.images(), "split_images_kwargs", None)
    call = split(images_kwargs)[1] if split is not None else dict(images_kwargs or {})
    return tile_size(effective_image_processor(processor, **call), fam)


def _processor_counts(processor, images_kwargs: Optional[dict]) -> tuple[int, Callable]:
    """(feature token id, counts(row) -> (tiles(h, w), feature tokens(h, w), mode note)) of the
    processor the rows were encoded with, its image options ``images_kwargs`` applied
    (`effective_image_processor`; mmpipe's own options, the module's ``split_images_kwargs``,
    apart), for each row as the processor's call for its conversation (`_row_processor`)."""
    from mmpipe.families import resolve_family
    from mmpipe.images.tiles import effective_image_processor

    fam = resolve_family(processor)
    module, split = fam.images(), getattr(fam.images(), "split_images_kwargs", None)
    own, call = split(images_kwargs) if split is not None else ({}, dict(images_kwargs or {}))
    given = own if set(images_kwargs or {}) - set(call) else None  # a mode named by the caller
    ip = effective_image_processor(processor, **call)

    def counts(r) -> tuple[Callable, Callable, str]:
        row_ip, note = _row_processor(module, ip, r, given)
        return (lambda h, w: int(module.tile_count(h, w, row_ip)),
                lambda h, w: int(module.image_tokens(h, w, row_ip, processor)), note)

    return int(fam.token_ids(processor.tokenizer)["feature"]), counts


def _row_processor(module, ip, r, given: Optional[dict]) -> tuple:
    """(the image processor as the processor's call for row ``r``'s conversation uses it, a note
    naming the mode for messages): in the mode ``given`` to validate, else in the mode whose tile
    counts match most of the row's images (the one its layout shows, `stored_mode`, on a tie: a
    damaged tile count is then reported in the mode the rest of the row was encoded in); ``ip``
    for families without modes."""
    hook = getattr(module, "conversation_image_processor", None)
    if hook is None:
        return ip, ""
    if given is not None:
        return hook(ip, r.num_images, **given), f" (in the {given[module.MODE_KEY]!r} multi-image mode)"
    shown = module.stored_mode(r.tiles_per_image) or module.DEFAULT_MODE
    modes = [shown] + [m for m in module.MODES if m != shown]
    candidates = [(m, hook(ip, r.num_images, **{module.MODE_KEY: m})) for m in modes]

    def wrong(row_ip) -> int:
        return sum(int(t) != module.tile_count(h, w, row_ip)
                   for (h, w), t in zip(r.image_hw.tolist(), r.tiles_per_image))

    mode, row_ip = min(candidates, key=lambda c: wrong(c[1]))  # the first (the layout's) on a tie
    return row_ip, f" (in the {mode!r} multi-image mode its layout shows)"


def _most_marked_id(table: pa.Table) -> Optional[int]:
    """The most common id at marked positions (the feature token's, without a processor), over the
    rows whose ``mm_token_type_ids`` is as long as their ``input_ids`` (the others are reported by the
    row check, naming them)."""
    from mmpipe.records.arrow import list_lengths

    n_ids = list_lengths(table.column("input_ids"))
    same = n_ids == list_lengths(table.column("mm_token_type_ids"))
    if not same.all():
        table = table.filter(pa.array(same))
    ids = table.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    types = table.column("mm_token_type_ids").combine_chunks().flatten()
    marked = ids[types.to_numpy(zero_copy_only=False) == 1]
    return int(np.bincount(marked.astype(np.int64)).argmax()) if len(marked) else None


def _check_features(r, i: int, *, feature_id: int, counts: Optional[Callable], tile=None) -> None:
    """The feature tokens of row ``r`` (table row ``i``), see the module doc; ``counts``: the
    processor's per-row counts (`_processor_counts`), or None; ``tile``: the processor's tile
    size (S_h, S_w), which the row's stored tiles must have (`tiles_collate.check_tile_size`)."""
    from mmpipe.media.tiles_collate import check_tile_size
    from mmpipe.view.spans import marked_runs

    check_tile_size([r], tile, stage="validate", index=i)

    token = r.fam.feature_token
    marked = r.mm_token_type_ids == 1
    wrong = np.flatnonzero(marked & (r.input_ids != feature_id))
    if len(wrong):
        raise stored_row_error(f"tokens marked as image features hold another token than {token}", i, "input_ids",
                               f"{token} (id {feature_id}) at every mm_token_type_ids == 1",
                               f"positions {wrong[:5].tolist()}")
    unmarked = np.flatnonzero(~marked & (r.input_ids == feature_id))
    if len(unmarked):
        raise stored_row_error(f"{token} tokens not marked in mm_token_type_ids", i, "mm_token_type_ids",
                               "1 at every feature token", f"0 at positions {unmarked[:5].tolist()}")
    tile_count, token_count, note = counts(r) if counts is not None else (None, None, "")
    for k, (h, w) in enumerate(r.image_hw.tolist() if counts is not None else ()):
        tiles = tile_count(h, w)
        if int(r.tiles_per_image[k]) != tiles:
            raise stored_row_error(f"image {k} ({h}x{w}) has the wrong tile count{note}", i, "tiles_per_image",
                                   str(tiles), str(int(r.tiles_per_image[k])))
    runs, n_tiles = marked_runs(marked), int(r.tiles_per_image.sum())
    if r.fam.token_type_key is not None:  # Gemma 3: each tile its own <start_of_image> text
        want, ok = f"{n_tiles} run(s) (one per tile)", len(runs) == n_tiles
    else:  # one per image; adjacent images' runs touch (LLaVA-OneVision renders <image><image>)
        want = f"1..{r.num_images} run(s) (one per image)"
        ok = (len(runs) > 0) == (r.num_images > 0) and len(runs) <= r.num_images
    if not ok:
        raise stored_row_error("runs of image feature tokens do not match the images", i, "mm_token_type_ids",
                               want, f"{len(runs)} run(s)")
    if counts is None:
        return
    total = sum(token_count(h, w) for h, w in r.image_hw.tolist())
    if int(marked.sum()) != total:
        raise stored_row_error(f"the row holds the wrong number of {token} tokens for its images{note}", i,
                               "input_ids", str(total), str(int(marked.sum())))
