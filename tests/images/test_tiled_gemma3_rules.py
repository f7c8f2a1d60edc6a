"""mmpipe.images.gemma3 from the image size alone: pan-and-scan crop counts equal the image
processor's own (``num_crops``) over many aspect ratios and both crop-size settings, and the
tiles equal what it normalises; the real checkpoints' settings give one 896x896 tile."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmpipe.images import gemma3
from mmpipe.images.tiles import effective_image_processor, normalise_table, normalise_tiles
from mmpipe.offline.gemma3 import GEMMA3_REAL_TILE, build_gemma3_processor

SIZES = [(1, 1), (10, 11), (10, 12), (10, 13), (7, 40), (40, 7), (16, 100), (100, 16), (33, 97), (97, 33),
         (8, 17), (17, 8), (64, 200), (300, 31)]


@pytest.mark.parametrize("min_crop", [8, 16])
def test_crop_counts_and_tiles_equal_the_image_processor(min_crop):
    proc = build_gemma3_processor()
    kw = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": min_crop}
    ip = effective_image_processor(proc, **kw)
    table = normalise_table(ip)
    rng = np.random.default_rng(min_crop)
    for h, w in SIZES:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        out = proc.image_processor(images=[img], return_tensors="np", **{**type(proc).images_kwargs, **kw})
        assert gemma3.tile_count(h, w, ip) == int(out["num_crops"][0]) + 1, (h, w)
        assert np.array_equal(normalise_tiles(gemma3.tiles_u8(img, ip), table), out["pixel_values"]), (h, w)


def test_real_settings_and_large_crops():
    proc = build_gemma3_processor(real=True)
    ip = effective_image_processor(proc)
    assert gemma3.tile_size(ip) == (GEMMA3_REAL_TILE, GEMMA3_REAL_TILE) and gemma3.max_tiles(ip) == 1
    assert gemma3.image_tokens(480, 640, ip, proc) == 256
    pas = effective_image_processor(proc, do_pan_and_scan=True)  # the processor's defaults: crops >= 256 px, <= 4
    assert gemma3.max_tiles(pas) == 5
    for h, w in [(600, 1300), (300, 1300), (500, 600), (400, 700), (1300, 512), (256, 1024), (255, 1024)]:
        img = Image.new("RGB", (w, h))
        out = proc.image_processor(images=[img], return_tensors="np", **{**type(proc).images_kwargs,
                                                                        "do_pan_and_scan": True})
        assert gemma3.tile_count(h, w, pas) == 1 + int(out["num_crops"][0]), (h, w)
    assert gemma3.tile_count(300, 1300, pas) == 5 and gemma3.tile_count(400, 440, pas) == 1  # 4 crops; ratio < 1.2
