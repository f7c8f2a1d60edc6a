"""Rows, batches and rollout samples that show themselves (mmpipe.view: html, text, images, spans, plots).

Real rows from the offline processors of the three families; the HTML is parsed, never
matched loosely: one <img data-mmpipe-image> and one image-token span per image, thumbnails
equal to the processor's resized pixels, escaped text, per-row batch tables, plots whose
lines are the position ids."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import mmpipe
from mmpipe import view
from mmpipe import testing
from mmpipe.records.generation import Completion, Generation
from mmpipe.images.spec import VisionSpec
from mmpipe.images.load import load_image
from mmpipe.images.pixels import pixel_values_to_u8, resize_image, unpatchify_u8
from mmpipe.rollout.results import unbatch_rollout

from conftest import FAMILIES, processor_for
from helpers import processor_reference
from strategies import raw_rows

VOID = {"img", "br", "meta", "hr", "input", "link"}


class Page(HTMLParser):
    """Every element with its attributes, classes, text and the classes of its ancestors."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements, self.stack = [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        el = {"tag": tag, "attrs": attrs, "cls": set((attrs.get("class") or "").split()), "text": "",
              "inside": set().union(*(e["cls"] for e in self.stack)) if self.stack else set()}
        self.elements.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, -1, -1):
            if self.stack[k]["tag"] == tag:
                del self.stack[k:]
                break

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, cls=None, tag=None, attr=None, inside=None):
        return [e for e in self.elements if (cls is None or cls in e["cls"]) and (tag is None or e["tag"] == tag)
                and (attr is None or attr in e["attrs"]) and (inside is None or inside in e["inside"])]

    def images(self):
        return self.find(tag="img", attr="data-mmpipe-image")


def png_of(el) -> np.ndarray:
    src = el["attrs"]["src"]
    assert src.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"))


def chat(n_images, seed=0, text="What is shown?", answer="A cat & <b>dog</b>.", sizes=None):
    sizes = sizes or [(40, 60), (64, 48), (30, 90), (50, 50)]
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    msgs = [{"role": "user", "content": content}]
    if answer is not None:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    modes = ["RGB", "RGBA", "L", "RGB"]
    imgs = [testing.tiny_image(*sizes[i % len(sizes)], seed=seed + i, mode=modes[i % 4]) for i in range(n_images)]
    return {"messages": msgs, "images": imgs}


def token_count(grid, family):
    return int(np.prod(grid)) // mmpipe.family_of(family).merge_size ** 2


# ---- one row -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_row_html_has_one_image_and_one_span_per_image(family):
    proc = processor_for(family)
    for n in range(4):
        row = mmpipe.encode_row(chat(n, seed=n), proc)
        page = Page(view.row_html(row, tokenizer=proc))
        imgs = page.images()
        assert [int(e["attrs"]["data-mmpipe-image"]) for e in imgs] == list(range(n))
        spans = page.find(cls="mmpipe-image-span", inside="mmpipe-strip")
        assert [int(e["attrs"]["data-image"]) for e in spans] == list(range(n))
        for k, (e, grid) in enumerate(zip(spans, row.image_grid_thw.tolist())):
            t, h, w = grid
            assert e["text"] == f"image {k} · grid {t}×{h}×{w} · {token_count(grid, family)} tokens"
            assert int(e["attrs"]["data-tokens"]) == token_count(grid, family)
            assert (row.mm_token_type_ids[int(e["attrs"]["data-start"]):][:token_count(grid, family)] == 1).all()
        # the thumbnail and its token span share the image's colour
        for img, span in zip(imgs, spans):
            colour = view.media_colour(int(img["attrs"]["data-mmpipe-image"]))
            assert f"border-color:{colour}" in img["attrs"]["style"] and f"border-color:{colour}" in span["attrs"]["style"]
        assert len(set(view.media_colour(k) for k in range(24))) == 24
        # the Jupyter hook is the same view (token ids, no tokenizer)
        assert len(Page(row._repr_html_()).images()) == n


@pytest.mark.parametrize("family", FAMILIES)
def test_thumbnails_are_the_resized_images_the_processor_normalised(family):
    proc = processor_for(family)
    spec = VisionSpec.from_processor(proc)
    raw = chat(3, seed=5, sizes=[(40, 60), (97, 41), (120, 70)])
    row = mmpipe.encode_row(raw, proc)
    thumbs = view.image_thumbnails(row)
    assert len(thumbs) == 3
    # 1. mmpipe's own resize of the source image
    for th, src, (t, h, w) in zip(thumbs, raw["images"], row.image_grid_thw.tolist()):
        assert th.size == (w * spec.patch_size, h * spec.patch_size)
        assert np.array_equal(np.asarray(th), resize_image(load_image(src), spec))
    # 2. the transformers processor's own pixel_values, un-normalised
    ref = processor_reference(proc, raw["messages"], raw["images"])
    u8 = pixel_values_to_u8(ref["pixel_values"], spec.lut(), spec.temporal_patch_size)
    at = 0
    for th, (t, h, w) in zip(thumbs, ref["image_grid_thw"].tolist()):
        assert np.array_equal(np.asarray(th), unpatchify_u8(u8[at:at + h * w], h, w, spec))
        at += t * h * w
    # 3. the HTML embeds exactly these pixels
    for el, th in zip(Page(view.row_html(row)).images(), thumbs):
        assert np.array_equal(png_of(el), np.asarray(th))


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_rows_show_the_same_thumbnails_as_uint8_rows(family):
    proc = processor_for(family)
    raw = chat(2, seed=11)
    u8_row = mmpipe.encode_row(raw, proc)
    f32_row = mmpipe.encode_row(raw, proc, pixels="float32")
    assert f32_row.pixel_format == "float32"
    for a, b in zip(view.image_thumbnails(u8_row), view.image_thumbnails(f32_row)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    pa, pb = Page(view.row_html(u8_row)), Page(view.row_html(f32_row))
    assert [e["attrs"]["src"] for e in pa.images()] == [e["attrs"]["src"] for e in pb.images()]


def test_float32_rows_with_other_constants_are_exact_given_the_processor():
    proc = testing.build_processor("qwen2_vl")
    proc.image_processor.image_mean = [0.3, 0.4, 0.5]
    proc.image_processor.image_std = [0.2, 0.25, 0.3]
    raw = chat(1, seed=3)
    row = mmpipe.encode_row(raw, proc, pixels="float32")
    exact = np.asarray(resize_image(load_image(raw["images"][0]), VisionSpec.from_processor(proc)))
    assert np.array_equal(np.asarray(view.image_thumbnails(row, spec=proc)[0]), exact)
    approx = np.asarray(view.image_thumbnails(row)[0]).astype(int)  # family constants: undone arithmetically
    assert np.abs(approx - exact).max() > 0  # not silently claimed exact ...
    assert "approximate colours" in view.row_html(row)
    assert "approximate" not in view.row_html(row, tokenizer=proc)  # ... and exact with the processor


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_only_rows_render_placeholders_not_images(family):
    proc = processor_for(family)
    raw = chat(3, seed=2, sizes=[(40, 60), (90, 30), (50, 50)])
    row = mmpipe.encode_row(raw, proc, pixels="none")
    assert row.pixel_format == "none"
    assert view.image_thumbnails(row) == [None, None, None]
    page = Page(view.row_html(row, tokenizer=proc))
    assert page.find(tag="img") == []
    boxes = page.find(attr="data-mmpipe-placeholder")
    assert [int(b["attrs"]["data-mmpipe-placeholder"]) for b in boxes] == [0, 1, 2]
    for box, (t, h, w) in zip(boxes, row.image_grid_thw.tolist()):
        sw, sh = (int(v) for v in re.search(r"width:(\d+)px;height:(\d+)px", box["attrs"]["style"]).groups())
        assert abs(sw / sh - w / h) < 0.05  # the resized image's aspect
        assert "no pixels stored" in box["text"]
    assert len(page.find(cls="mmpipe-image-span", inside="mmpipe-strip")) == 3
    assert "layout-only" in view.describe(row)


def test_text_is_escaped_and_shown_in_order():
    proc = processor_for("qwen2_vl")
    nasty = 'Is <script>alert("x")</script> & <img src=x> safe?'
    row = mmpipe.encode_row(chat(1, text=nasty, answer="</div><b>&amp;"), proc)
    out = view.row_html(row, tokenizer=proc)
    assert "<script>" not in out and "<img src=x>" not in out and "</div><b>" not in out
    # every "<" opens one of the view's own tags and every "&" an entity, token by token
    own = {"style", "div", "span", "figure", "figcaption", "img", "br", "table", "thead", "tbody", "tr", "th", "td"}
    assert {name for _, name in re.findall(r"<(/?)([A-Za-z]*)", out)} <= own
    assert re.findall(r"&(?!amp;|lt;|gt;|quot;|#x27;)", out) == []
    page = Page(out)
    strip = page.find(cls="mmpipe-strip")[0]["text"]
    assert nasty in strip and "</div><b>&amp;" in strip
    assert len(page.images()) == 1 and page.find(tag="script") == []
    assert nasty in view.describe(row, tokenizer=proc)


def test_default_processor_gives_token_text_to_plain_jupyter_display():
    proc = processor_for("qwen2_5_vl")
    row = mmpipe.encode_row(chat(1), proc)
    ids_only = Page(row._repr_html_()).find(cls="mmpipe-tok", inside="mmpipe-strip")
    assert ids_only[0]["text"] == str(row.input_ids[0])
    view.set_default_processor(proc)
    try:
        page = Page(row._repr_html_())
        assert page.find(cls="mmpipe-tok", inside="mmpipe-strip")[0]["text"] == "<|im_start|>"
        assert "<|im_start|>" in row.describe()
    finally:
        view.set_default_processor(None)
    assert Page(row._repr_html_()).find(cls="mmpipe-tok", inside="mmpipe-strip")[0]["text"] == str(row.input_ids[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_are_marked_on_exactly_the_trained_tokens(family):
    proc = processor_for(family)
    row = mmpipe.encode_row(chat(2, answer="Two tiny pictures."), proc)
    page = Page(view.row_html(row, tokenizer=proc, max_tokens=None))
    chips = page.find(cls="mmpipe-tok", inside="mmpipe-strip")
    assert len(chips) == int((row.mm_token_type_ids == 0).sum())
    trained = [c for c in chips if "mmpipe-trained" in c["cls"]]
    assert len(trained) == int((row.labels != -100).sum()) > 0
    text = proc.tokenizer.decode(row.input_ids[row.labels != -100])
    assert "".join(c["text"] for c in trained).replace("↵", "\n") == text
    assert "⟦Two tiny pictures.<|im_end|>⟧" in view.describe(row, tokenizer=proc)
    no_labels = mmpipe.encode_row(chat(1, answer=None), proc, labels=False)
    assert Page(view.row_html(no_labels)).find(cls="mmpipe-trained", inside="mmpipe-strip") == []


def test_long_rows_collapse_text_but_never_image_spans():
    proc = processor_for("qwen2_5_vl")
    long_text = " ".join(f"word{i}" for i in range(300))
    row = mmpipe.encode_row(chat(3, text=long_text, answer=long_text), proc)
    n_text = int((row.mm_token_type_ids == 0).sum())
    page = Page(view.row_html(row, tokenizer=proc, max_tokens=40))
    chips = page.find(cls="mmpipe-tok", inside="mmpipe-strip")
    gaps = [int(re.search(r"(\d+) tokens", g["text"]).group(1)) for g in page.find(cls="mmpipe-gap")]
    assert gaps and len(chips) <= 40 + 10 and len(chips) + sum(gaps) == n_text
    assert len(page.find(cls="mmpipe-image-span", inside="mmpipe-strip")) == 3
    assert len(page.images()) == 3
    full = Page(view.row_html(row, tokenizer=proc, max_tokens=None))
    assert full.find(cls="mmpipe-gap") == [] and len(full.find(cls="mmpipe-tok", inside="mmpipe-strip")) == n_text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw_rows(max_turns=2, max_images=3), st.sampled_from(FAMILIES), st.sampled_from([None, 8, 30, 400]))
def test_any_row_shows_every_image_and_accounts_for_every_token(raw, family, max_tokens):
    proc = processor_for(family)
    row = mmpipe.encode_row(raw, proc)
    page = Page(view.row_html(row, tokenizer=proc, max_tokens=max_tokens))
    n = row.num_images
    assert len(page.images()) == n
    spans = page.find(cls="mmpipe-image-span", inside="mmpipe-strip")
    assert [int(s["attrs"]["data-image"]) for s in spans] == list(range(n))
    chips = page.find(cls="mmpipe-tok", inside="mmpipe-strip")
    gaps = sum(int(re.search(r"(\d+) tokens", g["text"]).group(1)) for g in page.find(cls="mmpipe-gap"))
    media = sum(int(s["attrs"]["data-tokens"]) for s in spans)
    assert len(chips) + gaps + media == row.num_tokens


# ---- videos ----------------------------------------------------------------------------------
def video_row(family, t_groups=2, gh=4, gw=6, seed=0):
    """A processor-style row holding one video whose frames are known: frame f is a seeded
    random image, laid out in patches as the Qwen video processor does."""
    proc = processor_for(family)
    tok = proc.tokenizer
    fam = mmpipe.family_of(proc)
    spec = VisionSpec.from_processor(proc)
    p, m, T = fam.patch_size, fam.merge_size, fam.temporal_patch_size
    frames = np.random.default_rng(seed).integers(0, 256, size=(t_groups * T, gh * p, gw * p, 3), dtype=np.uint8)
    x = frames.reshape(t_groups, T, gh // m, m, p, gw // m, m, p, 3)
    u8 = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7).reshape(t_groups * gh * gw, 3 * T * p * p)
    per = gh * gw // m ** 2
    ids = tok("<|im_start|>user\nWatch: ", add_special_tokens=False)["input_ids"]
    vs, ve, vp = (tok.convert_tokens_to_ids(s) for s in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>"))
    if fam.rope == "mrope_frames":
        for g in range(t_groups):
            ids += tok(f"<{g * 0.5:.1f} seconds>", add_special_tokens=False)["input_ids"] + [vs] + [vp] * per + [ve]
    else:
        ids += [vs] + [vp] * (t_groups * per) + [ve]
    ids = np.asarray(ids + tok("?<|im_end|>\n", add_special_tokens=False)["input_ids"])
    out = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64),
           "mm_token_type_ids": 2 * (ids == vp).astype(np.int64)[None], "video_grid_thw": np.asarray([[t_groups, gh, gw]]),
           "pixel_values_videos": mmpipe.images.u8_video_to_pixel_values(u8, spec.for_videos().lut()),
           "second_per_grid_ts": np.asarray([1.0], np.float32)}
    return mmpipe.rows_from_processor_output(out, proc)[0], frames


@pytest.mark.parametrize("family", FAMILIES)
def test_video_rows_show_their_frames_and_spans(family):
    proc = processor_for(family)
    row, frames = video_row(family)
    T = mmpipe.family_of(family).temporal_patch_size
    got = view.video_frames(row, spec=proc)[0]
    assert [np.array_equal(np.asarray(f), frames[g * T]) for g, f in enumerate(got)] == [True, True]
    compact = mmpipe.compact(row, VisionSpec.from_processor(proc))
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(got, view.video_frames(compact)[0]))
    page = Page(view.row_html(row, tokenizer=proc))
    spans = page.find(cls="mmpipe-video-span", inside="mmpipe-strip")
    split = mmpipe.family_of(family).rope == "mrope_frames"  # Qwen3-VL: one run per frame group
    assert len(spans) == (2 if split else 1)
    assert sum(int(s["attrs"]["data-tokens"]) for s in spans) == int((row.mm_token_type_ids == 2).sum())
    assert all(s["attrs"]["data-video"] == "0" for s in spans)
    assert len(page.find(tag="img", attr="data-mmpipe-video")) == 2 and page.images() == []
    assert "video 0" in view.describe(row)


# ---- batches -----------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_batch_html_table_images_and_row_ownership(family):
    proc = processor_for(family)
    rows = [mmpipe.encode_row(chat(n, seed=10 * n), proc) for n in (2, 0, 3, 1)]
    rows[3] = mmpipe.encode_row(chat(1, seed=30), proc, pixels="float32")  # a mixed-storage batch
    rows[1] = mmpipe.encode_row(chat(0, answer=None), proc, labels=False)
    batch = mmpipe.collate(rows, processor=proc)
    page = Page(view.batch_html(batch, tokenizer=proc))
    trs = page.find(tag="tr")
    assert len(trs) == 1 + len(rows)  # header + one per row
    L = batch.input_ids.shape[1]
    for r, (tr, row) in enumerate(zip(trs[1:], rows)):
        cells = tr["text"]
        assert cells.startswith(f"{r}{row.num_tokens}{L - row.num_tokens} ({batch.padding_side})")
        assert ("yes" in cells) == (row.labels is not None)
    imgs = page.images()
    owners = batch.sample_to_image_indices
    assert [int(e["attrs"]["data-mmpipe-image"]) for e in imgs] == list(range(6))
    for b, idx in enumerate(owners):  # image i is row b's image idx.index(i), pixel for pixel
        thumbs = view.image_thumbnails(rows[b], spec=proc)
        for local, i in enumerate(idx):
            assert np.array_equal(png_of(imgs[i]), np.asarray(thumbs[local]))
    spans = page.find(cls="mmpipe-image-span", inside="mmpipe-strip")
    assert [int(s["attrs"]["data-image"]) for s in spans] == list(range(6))
    assert len(Page(batch._repr_html_()).images()) == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_describe_gives_lengths_grids_and_a_batch_table(family):
    proc = processor_for(family)
    rows = [mmpipe.encode_row(chat(n, seed=n), proc) for n in (1, 0, 2)]
    text = rows[0].describe(tokenizer=proc)
    assert text == view.describe(rows[0], tokenizer=proc)
    t, h, w = rows[0].image_grid_thw[0].tolist()
    assert f"{rows[0].num_tokens} tokens" in text and f"grid {t}×{h}×{w}" in text
    assert f"{w * mmpipe.family_of(family).patch_size}×{h * mmpipe.family_of(family).patch_size} px" in text
    batch = mmpipe.collate(rows, processor=proc, padding_side="right")
    out = batch.describe()
    lines = out.splitlines()
    L = batch.input_ids.shape[1]
    table = [ln.split() for ln in lines[2:5]]
    assert [(int(c[0]), int(c[1]), int(c[2])) for c in table] == [(b, r.num_tokens, L - r.num_tokens) for b, r in enumerate(rows)]
    assert "row 2:" in out and "image 2 · grid" in out  # row 2 holds batch images 1 and 2


def test_repr_stays_a_short_one_liner():
    proc = processor_for("qwen2_vl")
    row = mmpipe.encode_row(chat(2), proc)
    batch = mmpipe.collate([row, row], processor=proc)
    for obj in (row, batch):
        assert "\n" not in repr(obj) and len(repr(obj)) < 200


# ---- rollout samples ------------------------------------------------------------------------
def test_rollout_sample_html_and_describe():
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    prompts = [mmpipe.encode_row(chat(n, seed=n, answer=None), proc, labels=False) for n in (2, 0)]
    response = tok("x < y & z", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    lps = [-0.25 * (k + 1) for k in range(len(response))]
    gens = [Generation(i, [Completion(response, lps, "stop"), Completion(response[:2], None, "length")])
            for i in range(2)]
    samples = unbatch_rollout(prompts, gens)
    s = samples[0]
    page = Page(view.rollout_html(s, tokenizer=proc))
    assert len(page.images()) == 2
    assert len(page.find(cls="mmpipe-image-span", inside="mmpipe-strip")) == 2
    trained = page.find(cls="mmpipe-trained", inside="mmpipe-strip")
    assert len(trained) == len(response)
    assert [t["attrs"]["title"].rsplit("logprob ", 1)[1] for t in trained] == [f"{v:.4f}" for v in lps]
    assert "x < y & z" in page.find(cls="mmpipe-response")[0]["text"]
    assert "<y" not in view.rollout_html(s, tokenizer=proc).split('class="mmpipe-response">')[1]
    assert "finish stop" in page.find(cls="mmpipe-head")[0]["text"]
    assert len(Page(samples[3]._repr_html_()).images()) == 0
    text = samples[1].describe(tokenizer=proc)
    assert "finish length" in text and f"{prompts[0].num_tokens} prompt + 2 response tokens" in text
    page_doc = view.html_page(samples)
    assert page_doc.startswith("<!DOCTYPE html>") and len(Page(page_doc).images()) == 2 + 2


# ---- plots ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_plot_positions_draws_the_three_position_rows(family):
    from mmpipe.view.plots import plot_positions

    proc = processor_for(family)
    rows = [mmpipe.encode_row(chat(n, seed=n), proc) for n in (2, 3)]
    batch = mmpipe.collate(rows, processor=proc)
    for obj, index, row in ((rows[0], 0, rows[0]), (batch, 1, rows[1])):
        fig = plot_positions(obj, index=index)
        ax = fig.axes[0]
        lines = ax.get_lines()
        assert len(lines) == 3
        for a, line in enumerate(lines):
            assert np.array_equal(line.get_xdata(), np.arange(row.num_tokens))
            assert np.array_equal(line.get_ydata(), row.position_ids[a])
        shaded = [p for p in ax.patches]
        assert len(shaded) == row.num_images
        assert fig._repr_png_().startswith(b"\x89PNG")  # renders without a display; Jupyter shows it


@pytest.mark.parametrize("family", FAMILIES)
def test_plot_image_grid_labels_each_token_cell_with_its_position(family):
    from mmpipe.view.plots import plot_image_grid

    proc = processor_for(family)
    m = mmpipe.family_of(family).merge_size
    row = mmpipe.encode_row(chat(2, seed=4, sizes=[(40, 60), (70, 50)]), proc)
    fig = plot_image_grid(row, 1)
    ax = fig.axes[0]
    assert np.array_equal(ax.images[0].get_array(), np.asarray(view.image_thumbnails(row)[1]))
    _, h, w = row.image_grid_thw[1].tolist()
    start = int(np.flatnonzero(row.mm_token_type_ids == 1)[token_count(row.image_grid_thw[0], family)])
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == (h // m) * (w // m)
    for i in range(h // m):
        for j in range(w // m):
            k = start + i * (w // m) + j
            pos = row.position_ids[:, k]
            assert labels[i * (w // m) + j] == f"#{k}\n({pos[0]},{pos[1]},{pos[2]})"
            # the merged grid: rows go down h, columns along w
            assert (pos[1] - row.position_ids[1, start], pos[2] - row.position_ids[2, start]) == (i, j)
    fig.savefig(io.BytesIO(), format="png")
    layout = mmpipe.encode_row(chat(1, seed=4), proc, pixels="none")
    fig = plot_image_grid(layout, 0)
    assert len(fig.axes[0].images) == 0 and "layout only" in fig.axes[0].get_title()
    with pytest.raises(IndexError, match="holds 1 images"):
        plot_image_grid(layout, 1)
