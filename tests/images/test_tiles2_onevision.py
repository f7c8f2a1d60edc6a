"""LLaVA-OneVision's image module (mmpipe/images/onevision.py) against the real
LlavaOnevisionProcessor + LlavaOnevisionImageProcessorPil, offline: tile and token counts from
the size alone (anyres grid, unpadding, the anyres_max_9 shrink, multi-image rows), the uint8
tiles (normalised per value and channel == the processor's pixel_values, bit for bit), the
placeholder text (== the processor's expansion: same input_ids) and image_sizes, on real
photos, noise and odd sizes incl. images exactly at grid pinpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from mmpipe import testing
from mmpipe.images.tiles import effective_image_processor, normalise_table, normalise_tiles
from mmpipe.images import onevision
from mmpipe.offline.onevision import ONEVISION_PINPOINTS
from mmpipe.offline.tile_builders import build_tiled2_processor
from mmpipe.offline.tiny_towers import TILE

# odd sizes: 1x1, very wide / tall, exactly at pinpoints (and one pixel off), primes
ODD_SIZES = [(1, 1), (1, 700), (700, 1), (3, 2), (TILE, TILE), (TILE, 2 * TILE), (2 * TILE, TILE),
             (4 * TILE, 4 * TILE), (3 * TILE, TILE), (TILE + 1, 2 * TILE - 1), (37, 101), (333, 29), (1000, 999)]


def _messages(n: int) -> list:
    return [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": "What is it?"}]}]


def _images():
    rng = np.random.default_rng(1)
    photos = [img for _, img in testing.sample_photos()]
    return photos + [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ODD_SIZES]


IMAGES = _images()
PROCESSORS = {
    "full": build_tiled2_processor("llava_onevision"),
    # CLS-dropping strategy (one token fewer per image) and the stock 384-multiple pinpoints scaled to 32
    "default_strategy": build_tiled2_processor("llava_onevision"),
    "pinpoints_1x3": build_tiled2_processor("llava_onevision", image_grid_pinpoints=[[32, 32], [32, 96], [96, 32],
                                                                                     [64, 64], [48, 80]]),
}
PROCESSORS["default_strategy"].vision_feature_select_strategy = "default"


def _expanded(proc, text, imgs):
    parts = text.split(proc.image_token)
    n = len(imgs)
    return parts[0] + "".join(onevision.placeholder_text(im.height, im.width, proc, images_in_row=n) + p
                              for im, p in zip(imgs, parts[1:]))


def _check_row(proc, imgs):
    """One prompt with ``imgs``: counts, tiles, text, image_sizes == the processor's."""
    n = len(imgs)
    text = proc.apply_chat_template(_messages(n), tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[imgs], return_tensors="np")  # one image list per prompt
    table = normalise_table(effective_image_processor(proc))
    for i, im in enumerate(imgs):
        tiles = onevision.tiles_u8(im, proc, n)
        k = onevision.tile_count(im.height, im.width, proc, n)
        assert tiles.dtype == np.uint8 and tiles.shape == (k, TILE, TILE, 3)
        pv = out["pixel_values"][i]
        assert np.array_equal(normalise_tiles(tiles, table), pv[:k])  # bit for bit
        assert not pv[k:].any()  # the processor's tile-axis padding is float zeros
    assert out["pixel_values"].shape[1] == max(onevision.tile_count(im.height, im.width, proc, n) for im in imgs)
    assert out["input_ids"][0].tolist() == proc.tokenizer(_expanded(proc, text, imgs))["input_ids"]
    tokens = sum(onevision.image_tokens(im.height, im.width, proc, proc, n) for im in imgs)
    assert int((out["input_ids"][0] == proc.image_token_id).sum()) == tokens
    assert np.array_equal(out["image_sizes"], onevision.image_sizes([(im.height, im.width) for im in imgs]))
    assert out["batch_num_images"].tolist() == onevision.batch_num_images([n]).tolist()


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_single_image_rows_match_the_processor(name):
    for img in IMAGES:
        _check_row(PROCESSORS[name], [img])


@pytest.mark.parametrize("name", ["full", "default_strategy"])
def test_multi_image_rows_match_the_processor(name):
    """Rows of 2 and 3 images: one padded-square tile each, base tokens + a newline each."""
    proc = PROCESSORS[name]
    _check_row(proc, IMAGES[:2])
    _check_row(proc, IMAGES[3:6])
    _check_row(proc, [IMAGES[4], IMAGES[8], IMAGES[-1]])


def test_batch_of_rows_pads_the_tile_axis():
    """Rows of 0, 1, 2 images in one processor call: each image's tiles where the processor puts
    them, the rest of the tile axis zeros; batch_num_images leaves the empty row out."""
    proc = PROCESSORS["full"]
    rows = [[], [IMAGES[1]], [IMAGES[0], IMAGES[2]]]
    texts = [proc.apply_chat_template(_messages(len(r)), tokenize=False, add_generation_prompt=True) for r in rows]
    out = proc(text=texts, images=rows, return_tensors="np", padding=True)
    table = normalise_table(effective_image_processor(proc))
    flat = [(im, len(r)) for r in rows for im in r]
    for i, (im, n) in enumerate(flat):
        tiles = onevision.tiles_u8(im, proc, n)
        assert np.array_equal(normalise_tiles(tiles, table), out["pixel_values"][i, :len(tiles)])
        assert not out["pixel_values"][i, len(tiles):].any()
    assert out["batch_num_images"].tolist() == onevision.batch_num_images([len(r) for r in rows]).tolist() == [1, 2]


def test_the_anyres_max_shrink_is_exercised():
    """The tiny pinpoints reach 4x4 tiles (8x8 features > 9 tiles' worth): the token count takes
    the shrunk grid there, so the rule's second branch is checked above."""
    proc = PROCESSORS["full"]
    h = w = 4 * TILE
    assert onevision.best_resolution(h, w, proc) == (4 * TILE, 4 * TILE)
    side = 2  # sqrt(num_image_tokens)
    assert onevision.image_tokens(h, w, proc, proc) < (4 * side) ** 2 + 4 * side + 4


@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 3000), w=st.integers(1, 3000), strategy=st.sampled_from(["full", "default"]))
def test_token_count_matches_the_processor_rule(h, w, strategy):
    """From the size alone, over many sizes: == the processor's own count (its
    _get_num_multimodal_tokens) and the model's own patch count (image_size_to_num_patches)."""
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

    proc = _RULE_PROC
    proc.vision_feature_select_strategy = strategy
    assert onevision.image_tokens(h, w, proc, proc) == proc._get_num_multimodal_tokens(image_sizes=[(h, w)]).num_image_tokens[0]
    assert onevision.tile_count(h, w, proc) == image_size_to_num_patches((h, w), ONEVISION_PINPOINTS, TILE)


_RULE_PROC = build_tiled2_processor("llava_onevision")


@pytest.mark.parametrize("n", [2, 3])
def test_flat_image_lists_tile_every_image(n):
    """The processor given a FLAT image list (as vLLM and the generic path call it) tiles every
    image of a multi-image row: the default rule (images_in_row=1); batch_pixel_values lays the
    tiles out as the processor does, extra_inputs gives its image_sizes."""
    proc = PROCESSORS["full"]
    imgs = [IMAGES[1], IMAGES[9], IMAGES[-1]][:n]
    text = proc.apply_chat_template(_messages(n), tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=imgs, return_tensors="np")
    assert out["batch_num_images"].tolist() == [1] * n
    ip = effective_image_processor(proc)
    tiles = [onevision.tiles_u8(im, ip) for im in imgs]
    flat = normalise_tiles(np.concatenate(tiles), normalise_table(ip))
    assert np.array_equal(onevision.batch_pixel_values(flat, [len(t) for t in tiles]), out["pixel_values"])
    parts = text.split(proc.image_token)
    expanded = parts[0] + "".join(onevision.expand_placeholder(im.height, im.width, proc, ip) + p
                                  for im, p in zip(imgs, parts[1:]))
    assert out["input_ids"][0].tolist() == proc.tokenizer(expanded)["input_ids"]
    hw = np.asarray([(im.height, im.width) for im in imgs], np.int64)
    extra = onevision.extra_inputs(hw)
    assert set(extra) == {"image_sizes"} and np.array_equal(extra["image_sizes"], out["image_sizes"])


def test_real_checkpoint_settings():
    """The module docstring's figures: stock 384x384 tiles, stock pinpoints, 729 tokens per
    tile (27x27 SigLIP patches): a 600x800 image -> 7 tiles, 4725 tokens (== the processor's count)."""
    import transformers

    proc = build_tiled2_processor("llava_onevision")
    proc.image_processor = transformers.LlavaOnevisionImageProcessorPil()
    proc.num_image_tokens = 729
    assert onevision.tile_count(600, 800, proc) == 7
    assert onevision.image_tokens(600, 800, proc, proc) == 4725
    assert proc._get_num_multimodal_tokens(image_sizes=[(600, 800)]).num_image_tokens == [4725]


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 400), w=st.integers(1, 400), seed=st.integers(0, 2**16), n=st.sampled_from([1, 1, 2]))
def test_tiles_match_the_processor_at_any_size(h, w, seed, n):
    """Random noise (the worst case for resampling) at random sizes, rows of 1 or 2 images."""
    rng = np.random.default_rng(seed)
    imgs = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(n)]
    _check_row(PROCESSORS["full"], imgs)


def test_max_tiles_bounds_every_image():
    proc = PROCESSORS["full"]
    assert onevision.max_tiles(proc) == 1 + 16  # the 4x4 pinpoint + the base tile
    assert max(onevision.tile_count(h, w, proc) for h in range(1, 400, 9) for w in range(1, 400, 9)) == 17
