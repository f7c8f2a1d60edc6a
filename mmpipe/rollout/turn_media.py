"""The media of one appended turn (`mmpipe.rollout.multiturn`): its images and videos encoded
as `mmpipe.encode` encodes them, and their pads expanded in the turn's ids."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.encoding.placeholders import expand_image_pads
from mmpipe.encoding.videos import add_videos
from mmpipe.errors import PlaceholderError
from mmpipe.images.pixels import encode_image, image_grid, u8_to_pixel_values, u8_video_to_pixel_values
from mmpipe.records.conversation import Conversation

__all__ = ["add_turn_images", "add_turn_videos"]


def add_turn_videos(conv: Conversation, ids: np.ndarray, videos: Sequence):
    """Encode the new turn's videos as `mmpipe.encode` does (`mmpipe.encoding.videos.add_videos`:
    sampling, sizing, pads expanded, Qwen3-VL timestamps) -> (ids, None or (grids int64 [k, 3],
    second_per_grid_ts float32 [k], pixel blocks in the row's pixel format))."""
    enc = conv.encoder
    if not enc.family.is_vision:
        return ids, None
    first = conv.row.num_videos
    if not videos and not (ids == enc.video_token_id).any():
        return ids, None
    ids, _, grids, seconds, blocks = add_videos(enc, ids, None, list(videos), f"{conv.where}, new turn (videos from "
                                                f"{first})")
    if enc.pixels == "float32":
        blocks = [u8_video_to_pixel_values(b, enc.spec.for_videos().lut()) for b in blocks]
    return ids, (grids, seconds, blocks)


def add_turn_images(conv: Conversation, ids: np.ndarray, images: Sequence):
    """Encode the new turn's images (the row's pixel format) and expand each one's pad id to
    its t*h*w/merge^2 ids (`mmpipe.encoding.placeholders`) -> (ids int64 [n], grids, pixel blocks)."""
    enc, fam = conv.encoder, conv.encoder.family
    if not fam.is_vision:
        return ids, [], []
    pad_pos = np.flatnonzero(ids == enc.image_token_id)
    if len(pad_pos) != len(images):
        raise PlaceholderError(
            f"the new turn renders {len(pad_pos)} {fam.image_token} token(s) for {len(images)} image(s)",
            where=conv.where, row=conv.index, stage="rollout", column="messages",
            expected=f"{len(images)} {fam.image_token} token(s)", found=f"{len(pad_pos)}",
            fix=f"give one image per placeholder (does the text hold a literal {fam.image_token}?)",
        )
    grids, blocks = [], []
    first = conv.row.num_images
    for k, img in enumerate(images):
        w = f"{conv.where}, image {first + k}"
        if enc.pixels == "none":
            grids.append(image_grid(img, enc.spec, where=w))
        else:
            u8, g = encode_image(img, enc.spec, where=w)
            grids.append(g)
            blocks.append(u8 if enc.pixels == "uint8" else
                          u8_to_pixel_values(u8, enc.lut(), enc.spec.temporal_patch_size))
    if grids:
        ids, = expand_image_pads(ids, pad_pos, grids, fam)
    return ids, grids, blocks

