"""`BatchedMultiModalInputs` -> per-row `MultiModalInputs`: the exact inverse of collate.

Padding is stripped by each row's recorded length and padding side; each row's images
are sliced back out by the batch's offsets (never by batch index), in the pixel storage
each row came in (compact uint8 rows come back compact).

Before splitting, `check_batch` checks the batch's internal consistency in a few vectorised
passes (a batch edited by hand, or assembled by another tool, would otherwise give rows that
disagree with themselves): ``seq_lengths`` within the padded length and no real token
(attention, media type, label) in the padding; image/video offsets starting at 0,
non-decreasing and covering the grids; patch offsets equal to the grids' patch counts;
pixel rows equal to the patches; each row's image/video tokens equal to its grids' tokens.
A failure raises `InputError` (lengths) or `PixelDataError` (media) at stage "validate" -
the batch's stored fields are being validated, as `validate_dataset` does for stored rows -
naming the batch row and the field.
"""

from __future__ import annotations

import numpy as np

from mmpipe.batching.generic import unbatch_generic
from mmpipe.batching.tiled import unbatch_tiled
from mmpipe.errors import InputError, PixelDataError
from mmpipe.images.pixels import pixel_values_to_u8, video_pixel_values_to_u8
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import to_numpy

def _arrays(batch: BatchedMultiModalInputs) -> dict:
    """The batch's fields as numpy arrays (None where absent)."""
    def opt(v):
        return to_numpy(v) if v is not None else None

    return {"ids": to_numpy(batch.input_ids), "att": to_numpy(batch.attention_mask),
            "mm": to_numpy(batch.mm_token_type_ids), "pos": to_numpy(batch.position_ids),
            "deltas": to_numpy(batch.rope_deltas), "lengths": to_numpy(batch.seq_lengths), "labels": opt(batch.labels),
            "grids": to_numpy(batch.image_grid_thw), "vgrids": to_numpy(batch.video_grid_thw),
            "secs": to_numpy(batch.second_per_grid_ts), "io": to_numpy(batch.image_offsets),
            "po": to_numpy(batch.patch_offsets), "vo": to_numpy(batch.video_offsets),
            "vpo": to_numpy(batch.video_patch_offsets), "pv": opt(batch.pixel_values),
            "pv_u8": opt(batch.pixel_values_u8), "pvv": opt(batch.pixel_values_videos),
            "pvv_u8": opt(batch.pixel_values_videos_u8)}


def unbatch(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """Split a batch of any family back into its rows: ``unbatch(collate(rows)) == rows`` (the
    tiles and processor kinds: `mmpipe.batching.tiled.unbatch_tiled`,
    `mmpipe.batching.generic.unbatch_generic`)."""
    kind = batch.fam.kind
    if kind == "processor":
        return unbatch_generic(batch)
    if kind == "tiles":
        return unbatch_tiled(batch)
    a = _arrays(batch)
    check_batch(batch, a)
    ids, att, mm, pos, deltas, lengths = a["ids"], a["att"], a["mm"], a["pos"], a["deltas"], a["lengths"]
    B, L = ids.shape
    labels = a["labels"]
    has_labels = to_numpy(batch.row_has_labels) if batch.row_has_labels is not None else np.ones(B, bool)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    grids, vgrids, secs, io, po, vo, vpo = (a[k] for k in ("grids", "vgrids", "secs", "io", "po", "vo", "vpo"))
    pv, pv_u8, pvv, pvv_u8 = a["pv"], a["pv_u8"], a["pvv"], a["pvv_u8"]
    # python ints for the per-row slicing (faster than numpy scalars in the loop)
    lengths, deltas, has_labels = lengths.tolist(), deltas[:, 0].tolist(), has_labels.tolist()
    io, po, vo, vpo = io.tolist(), po.tolist(), vo.tolist(), vpo.tolist()
    rows = []
    fam, family, left = batch.fam, batch.family, batch.padding_side == "left"
    for b in range(B):
        n = lengths[b]
        sl = slice(L - n, L) if left else slice(0, n)
        row = MultiModalInputs(
            input_ids=ids[b, sl].copy(),
            attention_mask=att[b, sl].copy(),
            mm_token_type_ids=mm[b, sl].copy(),
            position_ids=pos[:, b, sl].copy(),
            rope_delta=int(deltas[b]),
            family=family,
            labels=labels[b, sl].copy() if (labels is not None and has_labels[b]) else None,
            image_grid_thw=grids[io[b]:io[b + 1]].copy(),
            video_grid_thw=vgrids[vo[b]:vo[b + 1]].copy(),
            second_per_grid_ts=secs[vo[b]:vo[b + 1]].copy(),
        )
        videos = vo[b + 1] > vo[b]
        ip, vp = slice(po[b], po[b + 1]), slice(vpo[b], vpo[b + 1])
        if formats[b] == "uint8":
            if pv_u8 is not None:
                row.pixel_values_u8 = pv_u8[ip].copy()
            elif pv is not None:  # a batch that mixed storage formats kept only float32
                spec = batch.spec
                row.pixel_values_u8 = pixel_values_to_u8(pv[ip], spec.lut(), spec.temporal_patch_size)
            else:
                row.pixel_values_u8 = np.zeros((0, fam.patch_dim_u8), np.uint8)
            if pvv_u8 is not None and videos:
                row.pixel_values_videos_u8 = pvv_u8[vp].copy()
            elif pvv is not None and videos:  # a mixed-storage batch kept only float32 videos too
                row.pixel_values_videos_u8 = video_pixel_values_to_u8(pvv[vp], batch.spec.for_videos().lut(), stage="validate")
        elif formats[b] == "float32":
            row.pixel_values = pv[ip].copy() if pv is not None else np.zeros((0, fam.patch_dim), np.float32)
            if pvv is not None and videos:
                row.pixel_values_videos = pvv[vp].copy()
        if formats[b] != "none" and batch.spec is not None:
            row.image_backend = batch.spec.backend
        rows.append(row)
    return rows


FIX = "build the batch with mmpipe.collate(rows) and do not edit its fields in place"


def check_batch(batch: BatchedMultiModalInputs, a: dict) -> None:
    """The batch's internal consistency, vectorised (a few numpy passes over [B, L]): lengths in
    range with no real token (attention, media type, label) in the padding; image/video offsets
    monotonic and covering the grids; patch offsets equal to the grids' patch counts; pixel rows
    equal to the patches; each row's image/video tokens equal to its grids' tokens. Raises
    `InputError` / `PixelDataError` at stage "validate", naming the row and the field."""
    att, mm, lengths = a["att"], a["mm"], a["lengths"]
    B, L = a["ids"].shape
    for name, arr, want in (("attention_mask", att, (B, L)), ("mm_token_type_ids", mm, (B, L)),
                            ("position_ids", a["pos"], (3, B, L)), ("rope_deltas", a["deltas"], (B, 1)),
                            ("seq_lengths", lengths, (B,)), ("labels", a["labels"], (B, L))):
        if arr is not None and arr.shape != want:
            raise InputError(where="", column=name, stage="validate", expected=f"shape {want} (input_ids is {(B, L)})",
                             found=tuple(arr.shape), fix=FIX)
    if B and (lengths.min() < 0 or lengths.max() > L):
        b = int(np.flatnonzero((lengths < 0) | (lengths > L))[0])
        raise InputError(row=b, column="seq_lengths", stage="validate", expected=f"0..{L} (the padded length)",
                         found=int(lengths[b]), fix=FIX)
    _check_lengths(batch, a, B, L)
    fam = batch.fam
    for kind, code, grids, off, poff, pixels in (
            ("image", 1, a["grids"], a["io"], a["po"], (("pixel_values", a["pv"], fam.patch_dim),
                                                       ("pixel_values_u8", a["pv_u8"], fam.patch_dim_u8))),
            ("video", 2, a["vgrids"], a["vo"], a["vpo"], (("pixel_values_videos", a["pvv"], fam.patch_dim),
                                                         ("pixel_values_videos_u8", a["pvv_u8"], fam.patch_dim)))):
        _check_media(batch, kind, code, mm, grids, off, poff, pixels, B, len(a["vgrids"]) > 0)
    if len(a["secs"]) != len(a["vgrids"]):
        raise PixelDataError(where="", column="second_per_grid_ts", stage="validate",
                             expected=f"{len(a['vgrids'])} values (one per video)", found=len(a["secs"]), fix=FIX)


def _check_lengths(batch, a: dict, B: int, L: int) -> None:
    """No real token cut off by ``seq_lengths``: at most ``seq_lengths`` attended tokens per row,
    and the token just outside each row's slice (padding side) is padding (attention 0, media
    type 0, label -100). O(B) apart from one sum over [B, L]."""
    att, mm, lengths, labels = a["att"], a["mm"], a["lengths"], a["labels"]
    over = att.sum(1) > lengths  # 0/1 masks: a sum counts (confirmed by a count before raising)
    if over.any() and (np.count_nonzero(att, axis=1) > lengths).any():
        b = int(np.flatnonzero(np.count_nonzero(att, axis=1) > lengths)[0])
        raise InputError(f"{int(np.count_nonzero(att[b]))} attended tokens but seq_lengths {int(lengths[b])}: "
                         f"seq_lengths and attention_mask disagree", row=b, column="seq_lengths", stage="validate",
                         fix=FIX)
    rows = np.flatnonzero(lengths < L)
    flat = rows * L + ((L - 1 - lengths[rows]) if batch.padding_side == "left" else lengths[rows])
    for name, arr, empty in (("attention_mask", att, 0), ("mm_token_type_ids", mm, 0), ("labels", labels, -100)):
        if arr is not None and (arr.take(flat) != empty).any():
            b = int(rows[np.flatnonzero(arr.take(flat) != empty)[0]])
            raise InputError(f"{name} marks the token next to the row's seq_lengths {int(lengths[b])} "
                             f"({batch.padding_side} padding) as real: seq_lengths and the tokens disagree",
                             row=b, column="seq_lengths", stage="validate", fix=FIX)


def _check_media(batch, kind, code, mm, grids, off, poff, pixels, B, videos) -> None:
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
