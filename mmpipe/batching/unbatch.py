"""`BatchedMultiModalInputs` -> per-row `MultiModalInputs`: the exact inverse of collate.

Padding is stripped by each row's recorded length and padding side; each row's images
are sliced back out by the batch's offsets (never by batch index), in the pixel storage
each row came in (compact uint8 rows come back compact).
"""

from __future__ import annotations

import numpy as np

from mmpipe.images.pixels import pixel_values_to_u8
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import to_numpy



def unbatch(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """Split a batch back into its rows: ``unbatch(collate(rows)) == rows``."""
    ids, att, mm = to_numpy(batch.input_ids), to_numpy(batch.attention_mask), to_numpy(batch.mm_token_type_ids)
    pos, deltas, lengths = to_numpy(batch.position_ids), to_numpy(batch.rope_deltas), to_numpy(batch.seq_lengths)
    B, L = ids.shape
    labels = to_numpy(batch.labels) if batch.labels is not None else None
    has_labels = to_numpy(batch.row_has_labels) if batch.row_has_labels is not None else np.ones(B, bool)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    grids, vgrids, secs = to_numpy(batch.image_grid_thw), to_numpy(batch.video_grid_thw), to_numpy(batch.second_per_grid_ts)
    io, po = to_numpy(batch.image_offsets), to_numpy(batch.patch_offsets)
    vo, vpo = to_numpy(batch.video_offsets), to_numpy(batch.video_patch_offsets)
    pv = to_numpy(batch.pixel_values) if batch.pixel_values is not None else None
    pv_u8 = to_numpy(batch.pixel_values_u8) if batch.pixel_values_u8 is not None else None
    pvv = to_numpy(batch.pixel_values_videos) if batch.pixel_values_videos is not None else None
    pvv_u8 = to_numpy(batch.pixel_values_videos_u8) if batch.pixel_values_videos_u8 is not None else None
    rows = []
    for b in range(B):
        n = int(lengths[b])
        sl = slice(L - n, L) if batch.padding_side == "left" else slice(0, n)
        row = MultiModalInputs(
            input_ids=ids[b, sl].copy(),
            attention_mask=att[b, sl].copy(),
            mm_token_type_ids=mm[b, sl].copy(),
            position_ids=pos[:, b, sl].copy(),
            rope_delta=int(deltas[b, 0]),
            family=batch.family,
            labels=labels[b, sl].copy() if (labels is not None and has_labels[b]) else None,
            image_grid_thw=grids[io[b]:io[b + 1]].copy(),
            video_grid_thw=vgrids[vo[b]:vo[b + 1]].copy(),
            second_per_grid_ts=secs[vo[b]:vo[b + 1]].copy(),
        )
        fam = row.fam
        ip, vp = slice(int(po[b]), int(po[b + 1])), slice(int(vpo[b]), int(vpo[b + 1]))
        if formats[b] == "uint8":
            if pv_u8 is not None:
                row.pixel_values_u8 = pv_u8[ip].copy()
            elif pv is not None:  # a batch that mixed storage formats kept only float32
                spec = batch.spec
                row.pixel_values_u8 = pixel_values_to_u8(pv[ip], spec.lut(), spec.temporal_patch_size)
            else:
                row.pixel_values_u8 = np.zeros((0, fam.patch_dim_u8), np.uint8)
            if pvv_u8 is not None and row.num_videos:
                row.pixel_values_videos_u8 = pvv_u8[vp].copy()
        elif formats[b] == "float32":
            row.pixel_values = pv[ip].copy() if pv is not None else np.zeros((0, fam.patch_dim), np.float32)
            if pvv is not None and row.num_videos:
                row.pixel_values_videos = pvv[vp].copy()
        rows.append(row)
    return rows
