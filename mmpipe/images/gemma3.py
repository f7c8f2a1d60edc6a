"""Gemma 3's image rules (`mmpipe.families.GEMMA3`), reproduced from transformers'
``Gemma3ImageProcessorPil`` and ``Gemma3Processor`` without calling them.

Each image is resized (bilinear, PIL) to one ``size`` tile (896x896 in real checkpoints) and
written as ``"\\n\\n<start_of_image>" + image_seq_length x "<image_soft_token>" +
"<end_of_image>\\n\\n"``. With pan-and-scan (``do_pan_and_scan=True`` in the processor call)
an image whose aspect ratio reaches ``pan_and_scan_min_ratio_to_activate`` is also cut into
2..``pan_and_scan_max_num_crops`` crops along its long side, each resized to its own tile;
the text then reads ``"Here is the original image {seq} and here are some crops to help you
see better {seq} {seq} ..."``. Tiles come in the processor's order: the image, then its crops.

The normalisation is per pixel of the resized uint8 tile (rescale 1/255, then mean/std 0.5),
so `mmpipe.images.tiles.normalise_table` reproduces ``pixel_values`` bit for bit. Every
function here needs only the image's (height, width), except `tiles_u8`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from PIL import Image

from mmpipe.images.settings import size_field
from mmpipe.images.tiles import effective_image_processor, resize_tile

BACKENDS = ("pil", "torchvision")  # image-processor backends tiles_u8 reproduces (mmpipe.images.tiles.resize_tile)
RESIZES_ALWAYS = True  # do_resize=False keeps images at their own size: refused (mmpipe.images.tiles.check_call_kwargs)

__all__ = ["BACKENDS", "tile_count", "image_tokens", "tiles_u8", "expand_placeholder", "placeholder_runs", "crop_boxes",
           "tile_size", "max_tiles", "vllm_prompt_ids"]


def tile_size(image_processor) -> tuple[int, int]:
    """(height, width) of every tile: the image processor's ``size``."""
    size = image_processor.size
    return int(size_field(size, "height")), int(size_field(size, "width"))


def crop_boxes(height: int, width: int, image_processor) -> list[tuple[int, int, int, int]]:
    """Pan-and-scan crops of an image of this size as PIL boxes (left, top, right, bottom),
    clipped to the image as numpy slicing clips them; [] when pan-and-scan is off or does not
    apply (the processor's ``pan_and_scan`` rule, crops in row-major order)."""
    ip = image_processor
    if not getattr(ip, "do_pan_and_scan", False):
        return []
    min_crop, max_crops = ip.pan_and_scan_min_crop_size, ip.pan_and_scan_max_num_crops
    ratio = ip.pan_and_scan_min_ratio_to_activate
    if width >= height:
        if width / height < ratio:
            return []
        n_w = min(int(math.floor(width / min_crop)), int(math.floor(width / height + 0.5)))
        n_w, n_h = min(max_crops, max(2, n_w)), 1
    else:
        if height / width < ratio:
            return []
        n_h = min(int(math.floor(height / min_crop)), int(math.floor(height / width + 0.5)))
        n_h, n_w = min(max_crops, max(2, n_h)), 1
    crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
    if min(crop_w, crop_h) < min_crop:
        return []
    return [(x, y, min(width, x + crop_w), min(height, y + crop_h))
            for y, x in itertools.product([crop_h * i for i in range(n_h)], [crop_w * i for i in range(n_w)])]


def tile_count(height: int, width: int, image_processor) -> int:
    """Tiles of one image: 1, plus its pan-and-scan crops."""
    return 1 + len(crop_boxes(height, width, image_processor))


def max_tiles(image_processor) -> int:
    """The most tiles one image can have: 1, plus ``pan_and_scan_max_num_crops`` with pan-and-scan."""
    return 1 + (int(image_processor.pan_and_scan_max_num_crops) if getattr(image_processor, "do_pan_and_scan", False)
                else 0)


def image_tokens(height: int, width: int, image_processor, processor) -> int:
    """``<image_soft_token>`` count of one image's text: ``image_seq_length`` per tile."""
    return int(processor.image_seq_length) * tile_count(height, width, image_processor)


def tiles_u8(image: Image.Image, image_processor) -> np.ndarray:
    """uint8 [n, S_h, S_w, 3]: the image (RGB PIL) and its crops, each resized as the processor
    resizes it (`mmpipe.images.tiles.resize_tile`: bilinear by default; PIL or torchvision backend)."""
    th, tw = tile_size(image_processor)
    parts = [image] + [image.crop(box) for box in crop_boxes(image.height, image.width, image_processor)]
    out = np.empty((len(parts), th, tw, 3), np.uint8)
    for i, part in enumerate(parts):
        out[i] = resize_tile(part, th, tw, image_processor)
    return out


def placeholder_text(height: int, width: int, processor, image_processor=None) -> str:
    """The text one ``<start_of_image>`` of the rendered prompt becomes (``image_processor``:
    default `effective_image_processor` of ``processor``, whose pan-and-scan settings decide
    the crops)."""
    ip = image_processor if image_processor is not None else effective_image_processor(processor)
    tok = processor.tokenizer
    seq = f"\n\n{tok.boi_token}{tok.image_token * int(processor.image_seq_length)}{tok.eoi_token}\n\n"
    crops = tile_count(height, width, ip) - 1
    if not crops:
        return seq
    return f"Here is the original image {seq} and here are some crops to help you see better " + " ".join([seq] * crops)


def placeholder_runs(height: int, width: int, processor, image_processor=None) -> tuple[str, list[int]]:
    """`placeholder_text` with each run of ``<image_soft_token>`` written once, and the run
    lengths (``image_seq_length`` per tile): writing token ``i`` of the text ``runs[i]`` times
    gives `placeholder_text` (`mmpipe.media.tiles_encode` tokenizes this short text)."""
    ip = image_processor if image_processor is not None else effective_image_processor(processor)
    tok, n = processor.tokenizer, int(processor.image_seq_length)
    seq = f"\n\n{tok.boi_token}{tok.image_token if n else ''}{tok.eoi_token}\n\n"
    tiles = tile_count(height, width, ip)
    crops = " ".join([seq] * (tiles - 1))
    text = seq if tiles == 1 else \
        f"Here is the original image {seq} and here are some crops to help you see better {crops}"
    return text, [n] * tiles if n else []


# The interface name (`mmpipe.images.tiles`); the placeholder mechanics themselves (finding the
# placeholders, splicing the text) are written once, in mmpipe.media.tiles_encode.
expand_placeholder = placeholder_text


# ---- vLLM ----
def _replace_runs(ids: list, old: list, new: list) -> list:
    """``ids`` with each occurrence of ``old`` replaced by ``new``, left to right, not overlapping."""
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + len(old)] == old:
            out += new
            i += len(old)
        else:
            out.append(ids[i])
            i += 1
    return out


def vllm_prompt_ids(prompt: list, image_ids: list, image_token: int, tok) -> tuple[list, bool]:
    """What vLLM 0.32's ``gemma3_mm`` makes of ``prompt`` (int ids, one ``image_token`` per image;
    `mmpipe.rollout.vllm_prompts` compares it with the row): each ``<start_of_image>`` replaced by its
    image text tokenized ALONE (``image_ids``), then the newline runs it joins ("\\n"+"\\n\\n",
    "\\n\\n"+"\\n" -> "\\n\\n\\n", "\\n\\n"+"\\n\\n" -> "\\n\\n\\n\\n"; no others); and whether it finds
    each image's tokens again (it reads "\\n\\n\\n" back as "\\n"+"\\n\\n" only). ``([], True)``
    for a vocabulary without the newline-run tokens (vLLM refuses it itself)."""
    vocab = tok.get_vocab()
    nl = [vocab.get("\n" * k) for k in range(5)]
    if any(t is None for t in nl[1:]):
        return [], True
    it = iter(image_ids)
    ids = [t for x in prompt for t in (next(it) if x == image_token else [x])]
    for a, b, c in ((1, 2, 3), (2, 1, 3), (2, 2, 4)):
        ids = _replace_runs(ids, [nl[a], nl[b]], [nl[c]])
    split = {nl[3]: [nl[1], nl[2]], nl[4]: [nl[2], nl[2]]}
    flat, at = [t for x in ids for t in split.get(x, [x])], 0
    for want in image_ids:  # vLLM's placeholder search, in order
        at = next((k for k in range(at, len(flat) - len(want) + 1) if flat[k:k + len(want)] == want), -1)
        if at < 0:
            return ids, False
        at += len(want)
    return ids, True
