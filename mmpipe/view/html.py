"""Rows, batches and rollout samples as HTML (view stage): what Jupyter shows for them
(`row_html`, `batch_html`, `rollout_html`), `to_html` for any of them, and `html_page`, a
standalone document for a browser. One page layout for every family: what differs per kind
(a span's label, the pictures) comes from the row's media strategy (`mmpipe.media`).

All HTML is escaped, styled by one inline ``<style>`` block, with no JavaScript and no
external resource. See `mmpipe.view` for what each element shows.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.unbatch import unbatch
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, to_numpy
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.images import media_colour, media_pictures, png_data_uri, row_pictures, shown_size, tint
from mmpipe.view.spans import (
    CONTINUED, Span, TokenText, collapse_plan, media_tokens, position_ranges, span_label, token_position, token_spans,
)
from mmpipe.view.style import style_block
from mmpipe.view.summary import as_row, batch_table_rows, count_list, row_summary, size_notes

DEFAULT_MAX_TOKENS = 400  # text tokens shown per row before text runs collapse
DEFAULT_MAX_ROWS = 16  # rows of a batch shown in full (the table lists every row)
PLACEHOLDER_SIDE = 64  # the box of an image whose size is not known

_esc = html.escape


def _style() -> str:
    return style_block()


def _picture_html(arr: np.ndarray, shown: int, tile: Optional[int], colour: str) -> tuple[str, str]:
    """One picture as an ``<img>`` (large ones embedded at the size shown), and a note when it
    was made smaller."""
    from PIL import Image

    img = Image.fromarray(arr, "RGB")
    H, W = arr.shape[:2]
    sw, sh, pixelated = shown_size(W, H)
    note = ""
    if (sw, sh) != (W, H) and not pixelated:  # a large image: embed it at the size shown, not in full
        img = img.resize((sw, sh), Image.LANCZOS)
        note = f" (shown at {sw}×{sh})"
    cls = ' class="mmpipe-pixelated"' if pixelated else ""
    what = f"image {shown}" + (f" tile {tile}" if tile is not None else "")
    attr = f' data-tile="{tile}"' if tile is not None else ""
    return (f'<img{cls} data-mmpipe-image="{shown}"{attr} src="{png_data_uri(img)}" width="{sw}" height="{sh}" '
            f'style="border-color:{colour}" alt="{what}, {W}x{H} pixels">', note)


def _placeholder_html(row: MultiModalInputs, k: int, shown: int, colour: str) -> str:
    """A box of the image's aspect standing in for an image without pictures, saying why."""
    size = row.media_layout().size(k) or (PLACEHOLDER_SIDE, PLACEHOLDER_SIDE)
    sw, sh, _ = shown_size(size[1], size[0])
    fmt = row.pixel_format
    why = ("no pixels stored (layout-only row, pixels=none)" if fmt == "none" else
           "no pixels decoded (pixels=source: the image files)" if fmt == "source" else
           f"not drawn (pixels={fmt}: the processor's own outputs)")
    what = " · ".join(size_notes(row, "image", k)) or row.media_layout().label(k)
    return (f'<div class="mmpipe-placeholder" data-mmpipe-placeholder="{shown}" style="width:{sw}px;height:{sh}px;'
            f'border-color:{colour}">image {shown}<br>{_esc(what)}<br>{_esc(why)}</div>')


def _figure_html(row: MultiModalInputs, k: int, shown: int, pictures: Optional[list], tokens: dict,
                 exact: bool) -> str:
    """Image ``k`` of the row (``shown``: its number on the page): its pictures or a box, and a
    caption with its layout, its tokens and where they are."""
    colour = media_colour(shown)
    first, n = tokens.get(("image", k), (None, 0))
    where = f" #{first}–{first + n - 1}" if first is not None else ""
    caption = " · ".join([f"image {shown}", row.media_layout().label(k), f"{n} tokens{where}",
                          *size_notes(row, "image", k)])
    if pictures is None:
        body = _placeholder_html(row, k, shown, colour)
    else:
        tiles = len(pictures) > 1  # a tiled image: one picture per stored tile
        imgs = [_picture_html(a, shown, j if tiles else None, colour) for j, a in enumerate(pictures)]
        body = "".join(img for img, _ in imgs)
        body = f'<div class="mmpipe-images">{body}</div>' if len(imgs) > 1 else body
        caption += imgs[0][1] if len(imgs) == 1 else ""
    if not exact and pictures is not None:
        caption += " · approximate colours (normalisation constants differ from the family's; pass the processor)"
    return f'<figure class="mmpipe-figure">{body}<figcaption>{_esc(caption)}</figcaption></figure>'


def _video_html(row: MultiModalInputs, frames: list, k: int, shown: int, n_tokens: int) -> str:
    colour = media_colour(shown, "video")
    size = row.media_layout("video").size(k) or (PLACEHOLDER_SIDE, PLACEHOLDER_SIDE)
    if not frames:
        sw, sh, _ = shown_size(size[1], size[0])
        inner = (f'<div class="mmpipe-placeholder" style="width:{sw}px;height:{sh}px">video {shown}<br>'
                 "no pixels stored</div>")
    else:
        parts = []
        for g, fr in enumerate(frames[:8]):
            sw, sh, pix = shown_size(fr.shape[1], fr.shape[0])
            cls = ' class="mmpipe-pixelated"' if pix else ""
            parts.append(f'<img{cls} data-mmpipe-video="{shown}" data-frame-group="{g}" src="{png_data_uri(_pil(fr))}" '
                         f'width="{sw // 2 or 1}" height="{sh // 2 or 1}" alt="video {shown} frame group {g}">')
        more = f"<span class='mmpipe-gap'>… {len(frames) - 8} more frame groups</span>" if len(frames) > 8 else ""
        inner = f'<div class="mmpipe-frames" style="border-color:{colour}">{"".join(parts)}{more}</div>'
    caption = " · ".join([f"video {shown}", row.media_layout("video").label(k), f"{n_tokens} tokens",
                          *[f"{n} per frame" for n in size_notes(row, "video", k)]])
    return f'<figure class="mmpipe-figure">{inner}<figcaption>{_esc(caption)}</figcaption></figure>'


def _pil(arr: np.ndarray):
    from PIL import Image

    return Image.fromarray(arr, "RGB")


def _media_html(row: MultiModalInputs, row_spans: list[Span], source: Any, image_ids: Sequence[int],
                video_ids: Sequence[int]) -> str:
    """The row's images (and videos) as figures, numbered ``image_ids`` / ``video_ids``."""
    tokens = media_tokens(row_spans)
    pictures, exact = row_pictures(row, source)
    figs = [_figure_html(row, k, image_ids[k], pics, tokens, exact) for k, pics in enumerate(pictures)]
    if row.num_videos:
        frames, _ = media_pictures(row, "video", source)  # None: no frames stored
        figs += [_video_html(row, frames[k], k, video_ids[k], tokens.get(("video", k), (0, 0))[1])
                 for k in range(row.num_videos)]
    return f'<div class="mmpipe-images">{"".join(figs)}</div>'


def _strip_html(row: MultiModalInputs, row_spans: list[Span], toks: TokenText, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int], extra: Optional[dict] = None) -> str:
    """The token strip: text chips, one labelled span per image/video (run), collapsed gaps."""
    ids = np.asarray(row.input_ids)
    labels = None if row.labels is None else np.asarray(row.labels)
    out = []
    split = toks.split_chars(ids)  # characters split over byte-level tokens, shown whole
    for item in collapse_plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            kind_ids = image_ids if s.kind == "image" else video_ids
            shown = kind_ids[s.index] if 0 <= s.index < len(kind_ids) else -1
            colour = media_colour(max(shown, 0), s.kind) if shown >= 0 else "#d00000"
            title = (f"tokens #{s.start}–#{s.end - 1}, token id {int(ids[s.start])}; positions "
                     + ", ".join(position_ranges(row, s.start, s.end)))
            trained = labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any())
            if trained:
                title += "; TRAINED (labels on media tokens)"
            tr = " mmpipe-trained" if trained else ""
            attr = "data-image" if s.kind == "image" else "data-video"
            out.append(
                f'<span class="mmpipe-{s.kind}-span{tr}" {attr}="{shown}" data-start="{s.start}" '
                f'data-tokens="{s.length}" style="border-color:{colour};background:{tint(colour)}" '
                f'title="{_esc(title)}">{_esc(span_label(row, s, shown))}</span>'
            )
        elif item[0] == "gap":
            out.append(f'<span class="mmpipe-gap">… {item[1]} tokens …</span>')
        else:
            i = item[1]
            tid = int(ids[i])
            cls = "mmpipe-tok"
            if toks.is_special(tid):
                cls += " mmpipe-special"
            title = f"#{i} id {tid} pos {token_position(row, i)}"
            if labels is not None:
                lab = int(labels[i])
                if lab != IGNORE_INDEX:
                    cls += " mmpipe-trained"
                    title += f" label {lab}"
                else:
                    title += " label -100"
            if extra and i in extra:
                title += " " + extra[i]
            if split.get(i) == CONTINUED:
                title += " (continues the character of the token before)"
            out.append(f'<span class="{cls}" title="{_esc(title)}">{_esc(toks.shown(tid, split.get(i)))}</span>')
    return f'<div class="mmpipe-strip">{"".join(out)}</div>'


def _legend(row: MultiModalInputs, toks: TokenText, counts: bool = True) -> str:
    parts = ['<span><span class="mmpipe-tok">text</span> text token</span>']
    if toks.tok is not None:
        parts.append('<span><span class="mmpipe-tok mmpipe-special">&lt;|special|&gt;</span> special token</span>')
    else:
        parts.append("<span>token ids shown (pass tokenizer= or a processor for text)</span>")
    # the legend's sample chips carry a class of their own: only the strip's spans are the spans
    parts.append('<span><span class="mmpipe-image-span mmpipe-sample" style="border-color:#888">image k</span> one '
                 "span per image, coloured like its thumbnail</span>")
    if row.num_videos:
        parts.append('<span><span class="mmpipe-video-span mmpipe-sample" style="border-color:#888">video k</span> '
                     "video tokens</span>")
    if row.labels is None:
        parts.append("<span>no labels (nothing trained)</span>")
    else:
        n = int((np.asarray(row.labels) != IGNORE_INDEX).sum())
        n = f" ({n} tokens)" if counts else ""
        parts.append(f'<span><span class="mmpipe-tok mmpipe-trained">tok</span> trained: labels ≠ -100{n}</span>')
    parts.append("<span>hover a token: index, id, position, label</span>")
    return f'<div class="mmpipe-legend">{"".join(parts)}</div>'


def _row_body(row: MultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
              image_ids: Optional[Sequence[int]] = None, video_ids: Optional[Sequence[int]] = None, spec=None,
              title: str = "MultiModalInputs", extra: Optional[dict] = None, toks: Optional[TokenText] = None,
              legend: bool = True) -> str:
    toks = toks or TokenText(tokenizer)
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    row_spans = token_spans(row)
    parts = [f'<div class="mmpipe"><div class="mmpipe-head">{_esc(title)} · {_esc(row_summary(row))}</div>']
    if row.num_images or row.num_videos:
        source = spec if spec is not None else tokenizer  # what float32 pixels are read with
        parts.append(_media_html(row, row_spans, source, image_ids, video_ids))
        if row.pixel_format == "none":
            parts.append('<div class="mmpipe-note">layout-only row (pixels="none"): the layout and positions come '
                         "from the image sizes; no pixels are stored, so boxes of the image's shape stand in for "
                         "the images</div>")
    parts.append(_strip_html(row, row_spans, toks, max_tokens, image_ids, video_ids, extra))
    if legend:
        parts.append(_legend(row, toks))
    parts.append("</div>")
    return "".join(parts)


def row_html(row, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS, spec=None) -> str:
    """HTML of one row of any family: thumbnails, the token strip, labels and a legend.

    Args:
        row: a `MultiModalInputs` (or a stored row dict).
        tokenizer: a tokenizer or processor to show token text (else ids); a processor also
            gives the normalisation constants used to read float32 pixels.
        max_tokens: text tokens shown before long text runs collapse to head/tail with
            "… n tokens …" (None: never collapse). Image spans are always all shown.
        spec: a `VisionSpec` overriding the pixel constants.

    Each image is a ``<figure>`` holding its ``<img data-mmpipe-image="k">`` (one
    per stored tile for a tiled family; a ``data-mmpipe-placeholder`` box when there is no
    picture: a layout-only row, the generic path) and, where its tokens are marked, one
    ``<span class="mmpipe-image-span" data-image="k">``.
    """
    return _style() + _row_body(as_row(row), tokenizer=tokenizer, max_tokens=max_tokens, spec=spec)


def batch_html(batch: BatchedMultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
               max_rows: Optional[int] = DEFAULT_MAX_ROWS) -> str:
    """HTML of a batch of any family: a per-row table (length, padding, images, tokens per
    image, layouts, labels) of every row, then the thumbnails and token strip of the first
    ``max_rows`` rows (None: all; the page says how many are left out). Images carry their
    index in the batch; ``sample_to_image_indices`` says which row owns which."""
    rows = unbatch(batch)
    info = batch_table_rows(batch, rows)
    B, L = batch.input_ids.shape
    toks = TokenText(tokenizer)
    n_img, n_vid = int(to_numpy(batch.image_offsets)[-1]), int(to_numpy(batch.video_grid_thw).shape[0])
    head = (f"BatchedMultiModalInputs · {batch.family} · B={B} rows × L={L} · {n_img} "
            f"images{f' · {n_vid} videos' if n_vid else ''} · padding {batch.padding_side} · pixels {batch.pixel_format}")
    trs = []
    for r in info:
        imgs = ", ".join(str(i) for i in r["images"]) or "–"
        vids = f" + videos {', '.join(str(i) for i in r['videos'])}" if r["videos"] else ""
        trs.append(
            f"<tr><td>{r['row']}</td><td>{r['length']}</td><td>{r['padding']} ({batch.padding_side})</td>"
            f"<td>{len(r['images'])}: [{imgs}]{vids}</td><td>{count_list(r['tokens_per_image']) or '–'}</td>"
            f"<td>{_esc(', '.join(r['layouts'])) or '–'}</td>"
            f"<td>{'yes (' + str(r['trained_tokens']) + ' trained)' if r['has_labels'] else 'no'}</td>"
            f"<td>{_esc(r['pixels'])}</td></tr>"
        )
    table = ('<table class="mmpipe-table"><thead><tr><th>row</th><th>length</th><th>padding</th><th>images</th>'
             "<th>tokens per image</th><th>layouts</th><th>labels</th><th>pixels</th></tr></thead>"
             f"<tbody>{''.join(trs)}</tbody></table>")
    bodies = [
        _row_body(row, tokenizer=tokenizer, max_tokens=max_tokens, image_ids=info[b]["images"],
                  video_ids=info[b]["videos"], spec=batch.spec if batch.spec is not None else tokenizer,
                  title=f"row {b}", toks=toks, legend=False)
        for b, row in enumerate(rows[:max_rows] if max_rows is not None else rows)
    ]
    if len(bodies) < len(rows):
        bodies.append(f'<div class="mmpipe-note">rows {len(bodies)}..{len(rows) - 1} are in the table only '
                      f"(max_rows={max_rows}; batch_html(batch, max_rows=None) shows all)</div>")
    legend = _legend(next((r for r in rows if r.labels is not None), rows[0]), toks, counts=False) if rows else ""
    return (f'{_style()}<div class="mmpipe"><div class="mmpipe-head">{_esc(head)}</div>{table}{legend}'
            f'{"".join(bodies)}</div>')


def rollout_html(sample, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS) -> str:
    """HTML of a `RolloutSample`: its prompt's images, the prompt + response token strip
    (response tokens are the trained ones; hover shows each one's rollout logprob), and the
    decoded response."""
    row = sample.to_row()
    P = sample.prompt.num_tokens
    lp = None if sample.logprobs is None else to_numpy(sample.logprobs).astype(np.float64)  # bf16 too
    extra = {P + k: f"logprob {lp[k]:.4f}" for k in range(len(lp))} if lp is not None else None
    toks = TokenText(tokenizer)
    R = len(sample.response_ids)
    stats = f" · mean logprob {lp.mean():.4f}" if (lp is not None and R) else ""
    title = (f"RolloutSample prompt {sample.prompt_index} · sample {sample.sample_index} · finish "
             f"{sample.finish_reason}" + (f" ({sample.stop_reason})" if sample.stop_reason is not None else "")
             + f" · {P} prompt + {R} response tokens{stats}")
    body = _row_body(row, tokenizer=tokenizer, max_tokens=max_tokens, title=title, extra=extra, toks=toks)
    if toks.tok is not None:
        text = toks.tok.decode([int(i) for i in sample.response_ids], skip_special_tokens=False)
    else:
        text = " ".join(str(int(i)) for i in sample.response_ids)
    resp = f'<div class="mmpipe-legend">response</div><div class="mmpipe-response">{_esc(text) or "(empty)"}</div>'
    return _style() + body[:-len("</div>")] + resp + "</div>"


def to_html(obj, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS) -> str:
    """HTML fragment of a row, batch, rollout sample, stored row dict, or a list of them."""
    if isinstance(obj, BatchedMultiModalInputs):
        return batch_html(obj, tokenizer=tokenizer, max_tokens=max_tokens)
    if isinstance(obj, RolloutSample):
        return rollout_html(obj, tokenizer=tokenizer, max_tokens=max_tokens)
    if isinstance(obj, (MultiModalInputs, dict)):
        return row_html(obj, tokenizer=tokenizer, max_tokens=max_tokens)
    if isinstance(obj, (list, tuple)):
        return "".join(to_html(o, tokenizer=tokenizer, max_tokens=max_tokens) for o in obj)
    raise TypeError(f"cannot display {type(obj).__name__}; expected a MultiModalInputs, BatchedMultiModalInputs, "
                    "RolloutSample, stored row dict, or a list of them")


def html_page(obj, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS, title: str = "mmpipe") -> str:
    """A standalone HTML document (UTF-8, inline CSS, images as data URIs, no script) showing
    ``obj`` (see `to_html`), for a browser or a file."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title></head><body style=\"margin:12px;background:#fff\">"
            f"{to_html(obj, tokenizer=tokenizer, max_tokens=max_tokens)}</body></html>\n")
