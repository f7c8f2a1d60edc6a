"""The ``tiles`` kind's part of `mmpipe.Encoder` (Gemma 3, InternVL, LLaVA-OneVision), with no
processor call per row.

The rendered chat template (one placeholder per image) -> each placeholder replaced by the
family's text (`mmpipe.images.<family>.expand_placeholder`, from the image's (height, width)
alone), each run of K feature tokens written ONCE (`mmpipe.encoding.feature_runs`) -> one
tokenizer call on that short text -> each run's feature id repeated K times -> ids, token types
(1 at the feature tokens), labels, ``image_hw`` int64 [I, 2], ``tiles_per_image`` int64 [I] and
the images as compact uint8 tiles (``pixel_values_u8`` uint8 [n, S, S, 3]; 1/4 of the
processor's float32 bytes), with ``pixels="source"`` each image's encoded file as given (sizes
and tile counts from the headers) or, with ``pixels="none"``, nothing but their sizes ->
`mmpipe.collate` expands the tiles to the processor's float32 ``pixel_values``, bit-exact.

A family whose processor tiles an image by the number of images in its conversation
(LLaVA-OneVision's per-conversation mode: its module has ``conversation_image_processor``)
takes that mode from ``images_kwargs`` (the module's ``split_images_kwargs`` parts mmpipe's
own options from the processor call's); each row is laid out with the image processor as the
processor's call for that conversation uses it (`_row_image_processor`).

The splice, the one tokenizer call, the runs repeated and the labels moved through the splice:
`mmpipe.encoding.text_ids.spliced_ids`.

Reached as ``fam.media.encode_*`` (one of the kind's modules, `mmpipe.media.KINDS`).
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np

from mmpipe.encoding.feature_runs import collapse_is_exact
from mmpipe.encoding.options import kind_options
from mmpipe.encoding.parse import images_only
from mmpipe.encoding.placeholders import check_image_placeholders
from mmpipe.encoding.sources import read_once
from mmpipe.encoding.text_ids import spliced_ids
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.images.load import image_hw
from mmpipe.images.tiles import check_call_kwargs, effective_image_processor, image_tiles

# its stored pixel formats: tiles, source files, layout-only (float32: the same values, 4x the bytes), its
# truncation policies (`mmpipe.encoding.options.kind_options`), and why only those
ENCODE_PIXELS, TRUNCATIONS = ("uint8", "source", "none"), ("raise", "drop")
CHOICE_NOTES = {"pixels": "uint8 tiles expand to the processor's float32 pixel_values at collate, bit-exact",
                "truncation": "cutting a row could cut an image's tokens"}
# the options of mmpipe.Encoder (`mmpipe.encoding.encoder.KIND_OPTIONS`) without a meaning here ->
# what to do instead, and how the kind says so
REFUSAL = "{what} is not available for {cls} ({fam}): {why}"
ENCODE_REFUSED = {
    "min_pixels": "the family resizes to its fixed tile size: set size on the processor's image processor",
    "max_pixels": "the family resizes to its fixed tile size: set size on the processor's image processor",
    "videos_column": "tiled families take images only here",
    "video_options": "tiled families take images only here",
    "log": "it is the generic path's option (mmpipe.Encoder(processor, family='generic'))",
    "audio": "these families take no audio (audio processors take the generic path)",
}


def encode_settings(enc, given: dict) -> None:
    """Check the kind's options and set them on ``enc``: ``pixels``, ``images_kwargs``, the
    effective ``image_processor``, the feature token id and whether runs may be collapsed."""
    fam = enc.family
    kind_options(enc, given)
    ip = enc.processor.image_processor
    own, backend = getattr(ip, "backend", "pil"), given.get("image_backend", "auto")
    if backend not in ("auto", own):
        raise ArgumentError(f"{fam.name} rows are made with the processor's own image backend ({own!r}); got "
                            f"image_backend={backend!r}: load the processor with the backend you want "
                            f"(the family's ...ImageProcessorPil, or the torchvision one)")
    backends = getattr(fam.images(), "BACKENDS", ("pil",))
    if own not in backends:
        raise ArgumentError(f"{fam.name}'s {own} image processor ({type(ip).__name__}) is not "
                            f"reproduced (backends: {backends}); use the family's ...ImageProcessorPil, "
                            "or mmpipe.Encoder(processor, family='generic') (its own float32 outputs)")
    enc.images_kwargs = dict(given.get("images_kwargs") or {})
    try:  # rows keep them (a JSON column): collate of source rows and vLLM prompts re-apply them
        json.dumps(enc.images_kwargs)
    except (TypeError, ValueError) as e:
        raise ArgumentError("images_kwargs must be JSON values (numbers, strings, bools, lists, "
                            f"dicts): {e}") from e
    split = getattr(enc.module, "split_images_kwargs", None)  # mmpipe's own options (OneVision's mode)
    enc.row_options, enc.call_kwargs = split(enc.images_kwargs) if split is not None else ({}, enc.images_kwargs)
    enc.image_processor = effective_image_processor(enc.processor, **enc.call_kwargs)
    check_call_kwargs(enc.call_kwargs, enc.image_processor, enc.module, f"{enc.processor_class} ({fam.name})")
    enc.feature_id = fam.token_ids(enc.tokenizer)["feature"]
    text, runs = enc.module.placeholder_runs(8, 8, enc.processor, enc.image_processor)
    enc.collapse = collapse_is_exact(enc.tokenizer, enc.feature_id, fam.feature_token, text, runs)
    enc.decodes_images = enc.pixels == "uint8"


def encode_image(enc, value, where: str) -> tuple:
    """One image -> ((height, width) upright, its uint8 tiles [n, S, S, 3] / its file bytes
    (headers read, nothing decoded) / None for layout-only)."""
    if enc.pixels == "none":
        return image_hw(value, where=where), None
    if enc.pixels == "source":  # the size from the header of the bytes stored (`read_once`)
        return read_once(value, lambda v: image_hw(v, where=where), where=where)
    if _per_conversation(enc):  # tiled by the row's image count, which is not known here
        return image_tiles(value, None, _BothTilings(enc), where=where)
    return image_tiles(value, enc.image_processor, enc.module, where=where)


def _per_conversation(enc) -> bool:
    """Whether the family tiles an image by its row's image count in the encoder's mode (the
    module's ``images_in_row``: LLaVA-OneVision's per-conversation mode)."""
    rule = getattr(enc.module, "images_in_row", None)
    return rule is not None and rule(2, **enc.row_options) != 1


def _row_image_processor(enc, n_images: int):
    """The image processor as the processor's call for a conversation of ``n_images`` uses it
    (the module's ``conversation_image_processor``; else the encoder's, the same every row)."""
    hook = getattr(enc.module, "conversation_image_processor", None)
    return enc.image_processor if hook is None else hook(enc.image_processor, n_images, **enc.row_options)


class _BothTilings:
    """`image_tiles`' module stand-in where the tiling depends on the row's image count
    (LLaVA-OneVision's per-conversation mode): one decode, the image tiled both as a row's only
    image and as one of several ((tiles, tiles), both uint8 [n, S, S, 3]); `encode_row` keeps
    the one its row needs. So the image threads still tile (the anyres grid is the slow part)."""

    def __init__(self, enc):
        self.module, self.one, self.several = enc.module, _row_image_processor(enc, 1), _row_image_processor(enc, 2)

    def tiles_u8(self, rgb, _image_processor) -> tuple:
        return self.module.tiles_u8(rgb, self.one), self.module.tiles_u8(rgb, self.several)


def encode_row(enc, messages: list, images: list, videos: list, *, where: str, tools, prefetched) -> dict:
    """One parsed row -> the record's fields (module doc); a row over ``max_length`` raises
    `TruncationError` (or is dropped)."""
    images_only(videos, where, what=f"{enc.family.name} ({enc.processor_class})")
    fam, module = enc.family, enc.module
    ip = _row_image_processor(enc, len(images))
    text, replies = enc.text_and_replies(messages, tools, where)
    loaded = enc.load_images(images, where, prefetched)
    sizes, payloads = [hw for hw, _ in loaded], [p for _, p in loaded]
    if payloads and isinstance(payloads[0], tuple):  # `_BothTilings`: the row's own tiling
        payloads = [p[0] if len(images) == 1 else p[1] for p in payloads]
    texts, runs = _image_texts(enc, text, sizes, ip, where)
    ids, labels, found = spliced_ids(enc.tokenizer, text, replies, [fam.image_token] * len(sizes), texts,
                                     labels=enc.labels, feature_id=enc.feature_id, runs=runs)
    want = sum(module.image_tokens(h, w, ip, enc.processor) for h, w in sizes)
    if found != want:
        raise PlaceholderError(f"the expanded prompt holds {found} {fam.feature_token} tokens "
                               f"for {len(sizes)} image(s)", where=where, column="messages",
                               expected=str(want), found=str(found),
                               fix=f"remove literal {fam.feature_token} text from the messages")
    enc.check_length(len(ids), where, "raise max_length, use fewer images, or pass truncation='drop'")
    return _fields(enc, ids, labels, sizes, payloads, ip)


def _fields(enc, ids: np.ndarray, labels, sizes: list, payloads: list, ip=None) -> dict:
    """The record's fields: ids int64 [L], labels int64 [L] or None, the images' (height, width)
    and payloads (`encode_image`), the processor call's ``images_kwargs`` (mmpipe's own options
    are not stored: LLaVA-OneVision's mode is in the layout, its ``stored_mode``; source rows:
    their backend); ``ip``: the row's image processor (`_row_image_processor`; default the encoder's)."""
    ip = enc.image_processor if ip is None else ip
    tiles = payloads if enc.pixels == "uint8" else None
    backend = getattr(enc.image_processor, "backend", "pil") if enc.pixels == "source" else "pil"
    counts = [len(t) for t in tiles] if tiles is not None else \
        [enc.module.tile_count(h, w, ip) for h, w in sizes]
    return dict(input_ids=ids, attention_mask=np.ones(len(ids), np.int64),
                mm_token_type_ids=(ids == enc.feature_id).astype(np.int64),
                image_hw=np.asarray(sizes, np.int64).reshape(-1, 2),
                tiles_per_image=np.asarray(counts, np.int64),
                pixel_values_u8=None if tiles is None else _stacked(enc, tiles),
                image_sources=payloads if enc.pixels == "source" else None,
                images_kwargs=enc.call_kwargs or None, image_backend=backend, labels=labels)


def _stacked(enc, tiles: list) -> np.ndarray:
    if tiles:
        return np.concatenate(tiles)
    th, tw = _tile_hw(enc)
    return np.zeros((0, th, tw, 3), np.uint8)


def _tile_hw(enc) -> tuple[int, int]:
    """(S_h, S_w) of the processor's tiles (one tiny probe image)."""
    from PIL import Image

    return tuple(enc.module.tiles_u8(Image.new("RGB", (8, 8)), enc.image_processor).shape[1:3])


def _image_texts(enc, text: str, sizes: list, ip, where: str) -> tuple[list, Optional[list]]:
    """The text of each image (``sizes``: their (height, width); ``ip``: the row's image
    processor) that replaces its placeholder in the rendered ``text`` (one placeholder per image,
    checked), and the feature-token run lengths in order or None. With ``enc.collapse`` each
    image's text has its runs of feature tokens written once (``placeholder_runs``)."""
    token, module = enc.family.image_token, enc.module
    check_image_placeholders(text.count(token), len(sizes), token, where, unit="placeholder")
    if enc.collapse:
        parts = [module.placeholder_runs(h, w, enc.processor, ip) for h, w in sizes]
        texts, runs = [t for t, _ in parts], [n for _, image_runs in parts for n in image_runs]
    else:
        texts, runs = [module.expand_placeholder(h, w, enc.processor, ip) for h, w in sizes], None
    return texts, runs


def encode_empty(enc) -> dict:
    """The fields of an empty row (0 tokens), with this encoder's columns."""
    z = np.zeros(0, np.int64)
    return _fields(enc, z, z if enc.labels else None, [], [])


def encode_image_bytes(enc) -> int:
    """Most stored pixel bytes of one image: the most tiles an image can have (the module's
    ``max_tiles``, else a 2048x2048 image's) x S x S x 3 (source rows: the same bound; an image
    file is rarely larger than its uint8 tiles)."""
    if enc.pixels == "none":
        return 0
    most = getattr(enc.module, "max_tiles", None)
    ip = enc.image_processor
    n = most(ip) if most is not None else enc.module.tile_count(2048, 2048, ip)
    th, tw = _tile_hw(enc)
    return int(n) * th * tw * 3
