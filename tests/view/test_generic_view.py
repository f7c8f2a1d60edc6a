"""The one view pipeline on every kind of family: the generic path's rows and batches (a processor
without a family table: Idefics3) describe and render like the others - a head line with the
processor's output shapes, each image as a labelled box of its size (its pixels are the
processor's own outputs), every token accounted for, batch images numbered by
``sample_to_image_indices``; the positions plot and the thumbnails follow each kind (1-D
positions, tiles side by side), and a plot that needs a patch grid says so."""

from __future__ import annotations

import re

import numpy as np
import pytest

import mmpipe
from mmpipe import view
from mmpipe.errors import ArgumentError
from mmpipe.offline import build_processor
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows
from test_display import Page

COUNTS = (2, 0, 1)


@pytest.fixture(scope="module")
def generic():
    proc = build_foreign_processor("idefics3")
    rows = [mmpipe.encode_row(r, proc) for r in generic_chat_rows(COUNTS)]
    assert {r.family for r in rows} == {"generic"}
    return proc, rows


def test_generic_row_describes_its_images_and_outputs(generic):
    proc, rows = generic
    row = rows[0]
    text = view.describe(row, tokenizer=proc, max_tokens=20)
    head, *rest = text.splitlines()
    assert head.startswith(f"MultiModalInputs: generic, {row.num_tokens} tokens")
    assert "2 images (Idefics3Processor, " in head and "pixel_values float32 [1, " in head
    for k, (h, w) in enumerate(row.image_hw.tolist()):
        assert f"image {k} · {h}×{w} px, its tokens are not marked" in text
    assert rest[-1].lstrip().startswith("tokens (trained ones") and "… " in rest[-1] and "⟦" in rest[-1]
    assert view.describe(row.to_dict(), tokenizer=proc) == row.describe(tokenizer=proc)


def test_generic_row_html_boxes_every_image_and_shows_every_token(generic):
    proc, rows = generic
    row = rows[0]
    page = Page(view.row_html(row, tokenizer=proc, max_tokens=30))
    assert page.find(tag="img") == []  # the processor's outputs are not turned back into pictures
    boxes = page.find(attr="data-mmpipe-placeholder")
    assert [int(b["attrs"]["data-mmpipe-placeholder"]) for b in boxes] == [0, 1]
    for box, (h, w) in zip(boxes, row.image_hw.tolist()):
        sw, sh = (int(v) for v in re.search(r"width:(\d+)px;height:(\d+)px", box["attrs"]["style"]).groups())
        assert abs(sw / sh - w / h) < 0.05 and f"{h}×{w} px" in box["text"]
    assert page.find(cls="mmpipe-image-span", inside="mmpipe-strip") == []
    chips = page.find(cls="mmpipe-tok", inside="mmpipe-strip")
    gaps = sum(int(re.search(r"(\d+) tokens", g["text"]).group(1)) for g in page.find(cls="mmpipe-gap"))
    assert len(chips) + gaps == row.num_tokens
    trained = [c for c in page.find(cls="mmpipe-trained", inside="mmpipe-strip")]
    assert len(trained) == int((row.labels != -100).sum())
    assert row._repr_html_() == view.row_html(row)


def test_generic_batch_table_numbers_images_by_row(generic):
    proc, rows = generic
    batch = mmpipe.collate(rows, processor=proc)
    invariants.assert_roundtrip(rows, batch=batch)
    text = view.describe(batch, tokenizer=proc)
    lines = text.splitlines()
    assert lines[0].startswith(f"BatchedMultiModalInputs: generic, B={len(rows)} rows") and "3 images" in lines[0]
    L = batch.input_ids.shape[1]
    table = [ln.split() for ln in lines[2:2 + len(rows)]]
    assert [(int(c[0]), int(c[1]), int(c[2])) for c in table] == [(b, r.num_tokens, L - r.num_tokens)
                                                                     for b, r in enumerate(rows)]
    assert "row 2:" in text and "image 2 · " in text  # row 2's image is the batch's image 2
    page = Page(view.batch_html(batch, tokenizer=proc))
    assert len(page.find(tag="tr")) == 1 + len(rows)
    boxes = [int(b["attrs"]["data-mmpipe-placeholder"]) for b in page.find(attr="data-mmpipe-placeholder")]
    assert boxes == [i for idx in batch.sample_to_image_indices for i in idx] == [0, 1, 2]
    assert batch._repr_html_() == view.batch_html(batch) and batch.describe() == view.describe(batch)
    assert "<!DOCTYPE html>" in view.html_page(batch) and "<script" not in view.html_page(batch)


@pytest.mark.parametrize("name", ["gemma3", "generic"])
def test_plots_and_thumbnails_follow_the_kind(name, generic):
    from mmpipe.view.plots import plot_image_grid, plot_positions

    if name == "generic":
        proc, rows = generic
    else:
        proc = build_processor(name)
        rows = [mmpipe.encode_row(r, proc) for r in generic_chat_rows(COUNTS)]
    row = rows[0]
    fig = plot_positions(row)
    (line,) = fig.axes[0].get_lines()  # 1-D positions: one line
    assert np.array_equal(line.get_ydata(), row.position_ids)
    assert fig._repr_png_().startswith(b"\x89PNG")
    thumbs = view.image_thumbnails(row)
    assert len(thumbs) == row.num_images
    if row.pixel_values_u8 is not None:  # tiles: each image's stored tiles side by side
        first = int(row.tiles_per_image[0])
        assert np.array_equal(np.asarray(thumbs[0]), np.concatenate(list(row.pixel_values_u8[:first]), axis=1))
    else:
        assert thumbs == [None] * row.num_images
    with pytest.raises(ArgumentError, match="no patch grid"):
        plot_image_grid(row, 0)
