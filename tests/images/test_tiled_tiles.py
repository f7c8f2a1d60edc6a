"""mmpipe.images.tiles: the per-channel table is the image processor's own rescale + normalise
arithmetic (every uint8 value, bit for bit), tiles expand to float32 and back exactly, and the
effective image processor carries the processor call's own image settings."""

from __future__ import annotations

import numpy as np
import pytest

from mmpipe.errors import ArgumentError
from mmpipe.images.tiles import effective_image_processor, normalise_table, normalise_tiles, tiles_to_u8
from mmpipe.offline.gemma3 import build_gemma3_processor


@pytest.fixture(scope="module")
def proc():
    return build_gemma3_processor()


def test_table_is_the_processors_arithmetic(proc):
    ip = effective_image_processor(proc)
    table = normalise_table(ip)
    assert table.dtype == np.float32 and table.shape == (3, 256)
    # the image processor's own steps on an image holding every value of every channel
    img = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 16, 256)).copy()
    want = ip.normalize(ip.rescale(img, ip.rescale_factor), ip.image_mean, ip.image_std)
    assert np.array_equal(want, np.broadcast_to(table[:, None, :], want.shape))
    assert np.all(np.diff(table, axis=1) > 0)  # strictly increasing: tiles_to_u8 inverts it


def test_tiles_expand_and_invert_exactly(proc):
    table = normalise_table(effective_image_processor(proc))
    tiles = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    pv = normalise_tiles(tiles, table)
    assert pv.shape == (3, 3, 32, 32) and pv.dtype == np.float32
    assert pv.nbytes == 4 * tiles.nbytes
    assert np.array_equal(pv[1, 2], table[2][tiles[1, :, :, 2]])
    assert np.array_equal(tiles_to_u8(pv, table), tiles)
    assert tiles_to_u8(pv + 1e-3, table) is None
    with pytest.raises(ArgumentError, match=r"uint8 \[n, S, S, 3\]"):
        normalise_tiles(pv, table)


def test_effective_image_processor_takes_the_call_settings(proc):
    """Gemma3Processor's images_kwargs (do_pan_and_scan=False) win over the image processor's
    attribute, and the caller's kwargs over both, as in a processor call; the original is untouched."""
    proc.image_processor.do_pan_and_scan = True
    try:
        assert effective_image_processor(proc).do_pan_and_scan is False
        ip = effective_image_processor(proc, do_pan_and_scan=True, pan_and_scan_min_crop_size=8)
        assert ip.do_pan_and_scan is True and ip.pan_and_scan_min_crop_size == 8
        assert proc.image_processor.pan_and_scan_min_crop_size is None
    finally:
        proc.image_processor.do_pan_and_scan = None
