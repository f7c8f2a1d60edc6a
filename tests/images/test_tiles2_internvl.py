"""InternVL's image module (mmpipe/images/internvl.py) against the real InternVLProcessor +
GotOcr2ImageProcessorPil, offline: tile counts and token counts from the size alone, the uint8
tiles (normalised per value and channel == the processor's pixel_values, bit for bit), and the
placeholder text (== the processor's expansion: same input_ids), on real photos, noise and odd
sizes, with crop_to_patches on (the processor's default) and off, and other min/max_patches."""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from packaging.version import Version
from hypothesis import given, settings, strategies as st
from PIL import Image

from mmpipe import testing
from mmpipe.images.tiles import effective_image_processor, normalise_table, normalise_tiles
from mmpipe.images import internvl
from mmpipe.offline.tile_builders import build_tiled2_processor
from mmpipe.offline.tiny_towers import TILE

# what the processor's own count (`_get_num_multimodal_tokens`) adds to the <IMG_CONTEXT> tokens:
# <img> and </img> up to transformers 5.24, nothing from 5.25 (its count is the context tokens)
COUNT_EXTRA = 2 if Version(transformers.__version__) < Version("5.25") else 0

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
# odd sizes: 1x1, very wide / tall, exactly at grid multiples, one pixel off them, primes
ODD_SIZES = [(1, 1), (1, 700), (700, 1), (3, 2), (TILE, TILE), (TILE, 2 * TILE), (2 * TILE, TILE),
             (2 * TILE, 3 * TILE), (TILE * 6, TILE), (TILE + 1, 2 * TILE - 1), (37, 101), (333, 29)]
SETTINGS = {  # name -> (image processor kwargs, processor images_kwargs or None for the class default)
    "default": ({}, None),
    "no_crop": ({}, {"crop_to_patches": False}),
    "min2_max12": ({"min_patches": 2, "max_patches": 12}, None),
    "max1": ({"max_patches": 1}, None),
}


def _processor(name: str):
    image_kwargs, images_kwargs = SETTINGS[name]
    proc = build_tiled2_processor("internvl", **image_kwargs)
    if images_kwargs is not None:
        proc.images_kwargs = images_kwargs  # what the processor passes its image processor
    return proc


def _images():
    rng = np.random.default_rng(0)
    photos = [img for _, img in testing.sample_photos()]
    odd = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ODD_SIZES]
    return photos + odd


IMAGES = _images()


def _check_one(proc, img):
    text = proc.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[img], return_tensors="np")
    h, w = img.height, img.width
    ip = effective_image_processor(proc)  # what the framework passes; the processor itself works too
    tiles = internvl.tiles_u8(img, ip)
    n = internvl.tile_count(h, w, ip)
    assert n == internvl.tile_count(h, w, proc) and np.array_equal(tiles, internvl.tiles_u8(img, proc))
    assert tiles.dtype == np.uint8 and tiles.shape == (n, TILE, TILE, 3)
    assert out["pixel_values"].shape[0] == n
    assert np.array_equal(normalise_tiles(tiles, normalise_table(ip)), out["pixel_values"])  # bit for bit
    expanded = text.replace(proc.image_token, internvl.placeholder_text(h, w, proc))
    assert out["input_ids"][0].tolist() == proc.tokenizer(expanded)["input_ids"]
    ids = out["input_ids"][0]
    first = int(np.flatnonzero(ids == proc.start_image_token_id)[0])
    last = int(np.flatnonzero(ids == proc.end_image_token_id)[0])
    n_features = internvl.image_tokens(h, w, effective_image_processor(proc), proc)
    assert int((ids == proc.image_token_id).sum()) == last - first - 1 == n_features
    # the processor's own count (with <img> and </img> before transformers 5.25)
    assert n_features + COUNT_EXTRA == proc._get_num_multimodal_tokens(image_sizes=[(h, w)]).num_image_tokens[0]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_tiles_tokens_and_text_match_the_processor(setting):
    proc = _processor(setting)
    for img in IMAGES:
        _check_one(proc, img)


def test_settings_follow_the_processor_not_the_image_processor():
    proc = _processor("default")
    assert proc.image_processor.crop_to_patches is False  # the image processor's own default ...
    assert internvl.settings(proc)["crop"] is True  # ... which InternVLProcessor overrides
    assert internvl.settings(proc.image_processor)["crop"] is False
    img = IMAGES[1]  # grace_hopper, 600x512: several crops with the processor, 1 tile alone
    assert internvl.tile_count(img.height, img.width, proc) > 1
    assert internvl.settings(effective_image_processor(proc))["crop"] is True
    alone = proc.image_processor(images=[img], return_tensors="np")["pixel_values"]
    tiles = internvl.tiles_u8(img, proc.image_processor)
    assert tiles.shape[0] == internvl.tile_count(img.height, img.width, proc.image_processor) == 1
    assert np.array_equal(normalise_tiles(tiles, normalise_table(proc.image_processor)), alone)


def test_several_images_in_one_prompt():
    proc = _processor("default")
    imgs = [IMAGES[0], IMAGES[2], IMAGES[4]]
    msgs = [{"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "and"}, {"type": "image"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=imgs, return_tensors="np")
    table = normalise_table(effective_image_processor(proc))
    expected = np.concatenate([normalise_tiles(internvl.tiles_u8(im, proc), table) for im in imgs])
    assert np.array_equal(expected, out["pixel_values"])
    parts = text.split(proc.image_token)
    expanded = parts[0] + "".join(internvl.placeholder_text(im.height, im.width, proc) + p
                                  for im, p in zip(imgs, parts[1:]))
    assert out["input_ids"][0].tolist() == proc.tokenizer(expanded)["input_ids"]


def test_real_checkpoint_settings():
    """The module docstring's figures: InternVL3's 448x448 tiles, max_patches 12, 256 tokens per
    tile: a 300x400 image -> 4x3 crops + the thumbnail = 13 tiles, 3328 feature tokens."""
    proc = build_tiled2_processor("internvl")
    proc.image_processor = transformers.GotOcr2ImageProcessorPil(size={"height": 448, "width": 448})
    proc.image_seq_length = 256
    assert internvl.grid(300, 400, proc) == (4, 3) and internvl.tile_count(300, 400, proc) == 13
    assert internvl.image_tokens(300, 400, proc, proc) == 3328
    assert proc._get_num_multimodal_tokens(image_sizes=[(300, 400)]).num_image_tokens == [3328 + COUNT_EXTRA]


@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 4000), w=st.integers(1, 4000), lo=st.integers(1, 4), hi=st.integers(1, 16),
       crop=st.booleans())
def test_tile_count_matches_the_image_processor_rule(h, w, lo, hi, crop):
    """From the size alone, over many sizes and settings: == the image processor's own count."""
    ip = _IP
    ip.min_patches, ip.max_patches, ip.crop_to_patches = lo, max(lo, hi), crop
    assert internvl.tile_count(h, w, ip) == ip.get_number_of_image_patches(h, w, {})


_IP = build_tiled2_processor("internvl").image_processor


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 400), w=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_tiles_match_the_processor_at_any_size(h, w, seed):
    """Random noise (the worst case for resampling) at random sizes: tiles == the processor's."""
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))
    _check_one(_PROC, img)


_PROC = _processor("default")


def test_max_tiles_bounds_every_image():
    proc = _processor("default")
    ip = effective_image_processor(proc)
    assert internvl.max_tiles(ip) == 6 + 1
    assert max(internvl.tile_count(h, w, ip) for h in range(1, 300, 7) for w in range(1, 300, 7)) == 7
    assert internvl.max_tiles(proc.image_processor) == 1  # crop_to_patches off: one tile
