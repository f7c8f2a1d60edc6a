"""``pixels="source"`` rows in the views (the storage at 1.000x the source files): each image
showed as an empty placeholder box, since no pixels are stored. The views now decode the files
as collate does (the default processor's sizes and, for tiled families, its image processor):
the pictures equal those of the same row encoded with ``pixels="uint8"``, bit for bit. Files
that do not decode to the stored layout (other sizes) keep the placeholder, never an error."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.view import set_default_processor
from mmpipe.view.images import row_pictures

ROW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Both?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]}],
       "images": [testing.tiny_image(60, 90, seed=2), testing.tiny_image(130, 40, seed=5)]}


@pytest.fixture
def default_processor():
    yield set_default_processor
    set_default_processor(None)


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3", "internvl", "llava_onevision"])
def test_source_rows_show_the_pictures_of_their_uint8_encode(family, default_processor):
    proc = testing.build_processor(family)
    want, _ = row_pictures(mmpipe.encode_row(ROW, proc, pixels="uint8"), proc)
    row = mmpipe.encode_row(ROW, proc, pixels="source")
    got, exact = row_pictures(row, proc)
    assert exact and len(got) == 2
    for w, g in zip(want, got):
        assert g is not None and len(g) == len(w) and all(np.array_equal(a, b) for a, b in zip(w, g))
    default_processor(proc)  # what a notebook sets once: the html shows both images
    html = mmpipe.view.to_html(row)
    assert html.count("<img") >= 2 and "data-mmpipe-placeholder" not in html


def test_source_files_read_with_other_sizes_keep_the_placeholder():
    """A row encoded with larger max_pixels than the view's processor: its files decode to
    other grids, so the view keeps the placeholder (collate would refuse, naming the fix)."""
    big = testing.build_processor("qwen2_vl", max_pixels=64 * 28 * 28)
    small = testing.build_processor("qwen2_vl", max_pixels=4 * 28 * 28)
    row = mmpipe.encode_row({**ROW, "images": [testing.tiny_image(280, 420, seed=1)] * 2}, big, pixels="source")
    assert row_pictures(row, big)[0][0] is not None
    assert row_pictures(row, small)[0] == [None, None]
    assert "data-mmpipe-placeholder" in mmpipe.view.to_html(row, tokenizer=small)
