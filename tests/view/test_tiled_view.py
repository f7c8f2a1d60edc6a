"""The view stage on tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision): describe and the
HTML views show each image (its stored tiles as thumbnails, or a labelled box for layout-only
rows) and the text with each image's feature tokens collapsed into one labelled span."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import token_spans

RNG = np.random.default_rng(9)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 56), (70, 30)]]
FAMILIES = ("gemma3", "internvl", "llava_onevision")


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    proc = build_processor(request.param)
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "look"},
                                                     {"type": "image"}, {"type": "text", "text": "hi " * 60}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "ok cat"}]}], "images": IMAGES}
    return request.param, proc, mmpipe.encode_row(raw, proc), mmpipe.encode_row(raw, proc, pixels="none")


def test_spans_cover_every_feature_token_once(fam):
    name, proc, row, _ = fam
    spans = token_spans(row)
    assert [s.start for s in spans][0] == 0 and spans[-1].end == len(row)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
    images = [s for s in spans if s.kind == "image"]
    assert [s.index for s in images] == [0, 1]  # a text item between the images: one span each
    assert sum(s.length for s in images) == int(row.mm_token_type_ids.sum())
    for s in images:
        assert (row.mm_token_type_ids[s.start:s.end] == 1).sum() >= 1


def test_describe_collapses_image_runs_and_long_text(fam):
    name, proc, row, layout = fam
    text = mmpipe.view.describe(row, tokenizer=proc, max_tokens=40)
    head, *rest = text.splitlines()
    assert head.startswith(f"MultiModalInputs: {name}, {len(row)} tokens") and "uint8 tiles" in head
    for k, (h, w) in enumerate(row.image_hw.tolist()):
        assert f"image {k} · {h}×{w} px · {int(row.tiles_per_image[k])} tiles" in text
    tokens_line = rest[-1]
    assert proc.tokenizer.convert_ids_to_tokens(proc.tokenizer.convert_tokens_to_ids(
        mmpipe.families.TILED_FAMILIES[name].feature_token)) not in tokens_line  # no feature token spelled out
    assert "… " in tokens_line and "⟦ok cat" in tokens_line
    assert "layout-only (no pixels)" in mmpipe.view.describe(layout, tokenizer=proc)
    batch = mmpipe.Collator(proc)([row, row])
    btext = mmpipe.view.describe(batch, tokenizer=proc)
    assert btext.startswith(f"BatchedMultiModalInputs: {name}, B=2 rows") and btext.count("  row ") == 2
    assert mmpipe.view.describe(row.to_dict(), tokenizer=proc) == mmpipe.view.describe(row, tokenizer=proc)


def test_html_shows_the_tiles_or_a_box(fam):
    name, proc, row, layout = fam
    page = mmpipe.view.html_page(row, tokenizer=proc)
    assert page.count("<img") == int(row.tiles_per_image.sum())  # one thumbnail per stored tile
    assert page.count('class="mmpipe-image-span"') == 2 and "<script" not in page
    srcs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(srcs) == int(row.tiles_per_image.sum())
    import base64
    import io

    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(srcs[0]))))
    assert np.array_equal(first, row.pixel_values_u8[0])  # the stored tile itself, as the model sees it
    box = mmpipe.view.to_html(layout, tokenizer=proc)
    assert "<img" not in box and box.count("no pixels stored") == 2
    batch = mmpipe.view.to_html(mmpipe.Collator(proc)([row, row]))
    assert batch.count("<img") == 2 * int(row.tiles_per_image.sum()) and "BatchedMultiModalInputs" in html.unescape(batch)
    assert mmpipe.view.row_html(row.to_dict()) == mmpipe.view.row_html(MultiModalInputs.from_dict(row.to_dict()))


def test_readme_tiled_rows_after_encoding(tmp_path, monkeypatch, capsys):
    import datasets

    from helpers import readme_block

    monkeypatch.chdir(tmp_path)
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": "hi"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}],
             "images": IMAGES[:n]} for n in (1, 0, 2)]
    prompt_rows = [{"messages": r["messages"][:1], "images": r["images"]} for r in raws]
    ns = {"ds": datasets.Dataset.from_list(raws), "prompt_rows": prompt_rows}
    exec(compile(readme_block("**Tiled rows after encoding**"), "README.md", "exec"), ns)
    out = capsys.readouterr().out
    assert "3 rows, pixels=uint8, labels=yes: OK" in out and "[image 0 · 40×56 px · 1 tiles · 4 tokens]" in out
    assert ns["page"].count("<img") == 1 and len(ns["rows"]) == 6 and ns["lp"].shape[0] == 6
    assert "token_type_ids" in ns["inputs"]


def test_records_show_themselves_in_jupyter_and_terminals():
    """A tiled row's and batch's own ``_repr_html_`` / ``describe`` (Jupyter's plain display) are the
    views' output, as for the patch-grid records."""
    from mmpipe.offline.tile_builders import build_tiled2_processor
    from mmpipe.view import batch_html, describe, row_html

    proc = build_tiled2_processor("internvl")
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"},
                                                                      {"type": "text", "text": "what?"}]}],
                             "images": [img]}, proc)
    batch = mmpipe.collate([row, row], processor=proc)
    assert row._repr_html_() == row_html(row) and "<img" in row._repr_html_()
    assert batch._repr_html_() == batch_html(batch)
    assert row.describe(tokenizer=proc.tokenizer) == describe(row, tokenizer=proc.tokenizer)
    assert batch.describe() == describe(batch)
