"""Every kind's per-item layout in one typed form (`MediaLayout`): read from the fields the kind
declares, the same for a row and for the batch of its rows, and what the views show of it (labels,
sizes, token counts) agrees with the stored ids and pixels."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.records.media_layout import MediaLayout

from helpers import encode_mixed, generic_chat_rows

RNG = np.random.default_rng(3)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 56), (70, 30), (90, 64)]]


def _raw(n: int) -> dict:
    content = [x for k in range(n) for x in ({"type": "image"}, {"type": "text", "text": f"look {k}"})]
    return {"messages": [{"role": "user", "content": content + [{"type": "text", "text": "what is it?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}], "images": IMAGES[:n]}


def _rows(family: str, pixels: str = "uint8"):
    proc = build_processor(family)
    return proc, [mmpipe.encode_row(_raw(n), proc, pixels=pixels) for n in (2, 0, 1, 3)]


def _marked_runs(row, code: int) -> list[int]:
    mm = np.asarray(row.mm_token_type_ids) == code
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mm.astype(np.int8), [0]])))
    return (edges[1::2] - edges[::2]).tolist()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "glm4v"])
def test_patch_grids(family):
    proc, rows = _rows(family)
    fam = rows[0].fam
    for r in rows:
        lay = r.media_layout()
        assert lay.modality == "image" and lay.hw is None and lay.tiles is None
        np.testing.assert_array_equal(lay.grid_thw, r.image_grid_thw)
        assert len(lay) == r.num_images and lay.tokens.tolist() == _marked_runs(r, 1)  # one run per image here
        assert int(lay.units.sum()) == len(r.pixel_values_u8)  # a pixel row per patch
        for k, (t, h, w) in enumerate(r.image_grid_thw.tolist()):
            assert lay.size(k) == (h * fam.patch_size, w * fam.patch_size)
            assert lay.label(k) == f"grid {t}×{h}×{w}" and not lay.label_shows_size
        assert lay.size(r.num_images) is None and lay.label(r.num_images) == "grid ?×?×?"
        assert lay.summary() == [] and len(r.media_layout("video")) == 0


def test_video_grids_are_a_layout_of_their_own():
    proc = build_processor("qwen2_vl")
    rows = encode_mixed(["vIv", "I"], proc)
    lay = rows[0].media_layout("video")
    np.testing.assert_array_equal(lay.grid_thw, rows[0].video_grid_thw)
    assert len(lay) == 2 and int(lay.tokens.sum()) == int((rows[0].mm_token_type_ids == 2).sum())
    assert len(rows[0].media_layout()) == 1 and len(rows[1].media_layout("video")) == 0


@pytest.mark.parametrize("family", ["gemma3", "internvl", "llava_onevision"])
def test_tiles(family):
    proc, rows = _rows(family)
    for r in rows:
        lay = r.media_layout()
        assert lay.grid_thw is None and lay.tokens is None and lay.patch_size == 0
        np.testing.assert_array_equal(lay.hw, r.image_hw)
        np.testing.assert_array_equal(lay.tiles, r.tiles_per_image)
        assert int(lay.units.sum()) == len(r.pixel_values_u8)  # a stored tile per unit
        for k, (h, w) in enumerate(r.image_hw.tolist()):
            assert lay.size(k) == (h, w) == IMAGES[k].size[::-1]
            assert lay.label(k) == f"{h}×{w} px · {int(r.tiles_per_image[k])} tiles" and lay.label_shows_size
        if r.num_images > 1:  # touching images: their tiles together
            assert lay.label(0, r.num_images - 1) == f"{int(r.tiles_per_image.sum())} tiles"
        assert lay.summary() == [f"{int(r.tiles_per_image.sum())} tiles"]
        assert len(r.media_layout("video")) == 0  # no video items in this kind
    layout_only = mmpipe.encode_row(_raw(2), proc, pixels="none").media_layout()
    assert layout_only.size(1) == (70, 30) and layout_only.tiles.tolist() == rows[0].tiles_per_image.tolist()


def test_processor_kind_and_rows_without_sizes():
    proc = build_foreign_processor("idefics3")
    rows = [mmpipe.encode_row(r, proc) for r in generic_chat_rows((2, 0, 1))]
    lay = rows[0].media_layout()
    assert lay.grid_thw is None and lay.tiles is None and lay.tokens is None and lay.units is None
    assert len(lay) == 2 and lay.size(1) == (70, 30) and lay.label(0) == "40×56 px"
    old = MediaLayout.of(mmpipe.MultiModalInputs.from_dict({**rows[0].to_dict(), "image_hw": None}))
    assert len(old) == 0 and old.size(0) is None and old.label(0) == "size unknown"  # an earlier mmpipe's row


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "llava_onevision", "generic"])
def test_a_batch_layout_is_its_rows_layouts_in_row_order(family):
    if family == "generic":
        proc = build_foreign_processor("idefics3")
        rows = [mmpipe.encode_row(r, proc) for r in generic_chat_rows((2, 0, 1))]
    else:
        proc, rows = _rows(family)
    batch = mmpipe.Collator(proc)(rows)
    got = batch.media_layout()
    assert len(got) == sum(r.num_images for r in rows)
    # the row of each image, a torch tensor for every kind (the tiled and generic batches' offsets are numpy)
    assert batch.image_to_sample.tolist() == [b for b, r in enumerate(rows) for _ in range(r.num_images)]
    for field in ("grid_thw", "hw", "tiles", "tokens"):
        parts = [getattr(r.media_layout(), field) for r in rows]
        want = None if parts[0] is None else np.concatenate(parts)
        assert (getattr(got, field) is None) == (want is None), field
        if want is not None:
            np.testing.assert_array_equal(getattr(got, field), want)
    for b, images in enumerate(batch.sample_to_image_indices):  # each row's images are its own items
        assert [got.label(k) for k in images] == [rows[b].media_layout().label(k) for k in range(rows[b].num_images)]
