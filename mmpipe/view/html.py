"""Rows, batches and rollout samples as HTML (view stage): what Jupyter shows for them
(`row_html`, `batch_html`, `rollout_html`), `to_html` for any of them, and `html_page`, a
standalone document for a browser.

All HTML is escaped, styled by one inline ``<style>`` block, with no JavaScript and no
external resource. See `mmpipe.view` for what each element shows.
"""

from __future__ import annotations

import html
from typing import Optional, Sequence

import numpy as np

from mmpipe.batching.unbatch import unbatch
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.images import image_arrays, media_colour, png_data_uri, shown_size, spec_for, tint, video_frames
from mmpipe.view.spans import Span, TokenText, collapse_plan, span_label, token_spans, value_range
from mmpipe.view.style import style_block
from mmpipe.view.tiled import as_tiled, tiled_html
from mmpipe.view.summary import as_row, batch_table_rows, grid_str, row_summary
from mmpipe.records.columns import to_numpy

DEFAULT_MAX_TOKENS = 400  # text tokens shown per row before text runs collapse
DEFAULT_MAX_ROWS = 16  # rows of a batch shown in full (the table lists every row)



_esc = html.escape


def _style() -> str:
    return style_block()


def _thumb_html(img_arr: Optional[np.ndarray], label_index: int, grid, n_tokens: int, first_token: Optional[int],
                exact: bool, p: int, pixel_format: str) -> str:
    """One image: an <img> with its index and colour, or a placeholder box without pixels."""
    t, h, w = grid
    H, W = h * p, w * p
    colour = media_colour(label_index)
    where = f" #{first_token}–{first_token + n_tokens - 1}" if first_token is not None else ""
    if img_arr is None:
        sw, sh, _ = shown_size(W, H)
        return (
            f'<figure class="mmpipe-figure"><div class="mmpipe-placeholder" data-mmpipe-placeholder="{label_index}" '
            f'style="width:{sw}px;height:{sh}px;border-color:{colour}">image {label_index}<br>{W}×{H} px<br>'
            f"no pixels stored (layout-only row, pixels={_esc(pixel_format)!s})</div>"
            f"<figcaption>image {label_index} · grid {t}×{h}×{w} · {n_tokens} tokens{where} · {W}×{H} px"
            f"</figcaption></figure>"
        )
    from PIL import Image

    img = Image.fromarray(img_arr, "RGB")
    note = ""
    sw, sh, pixelated = shown_size(W, H)
    if (sw, sh) != (W, H) and not pixelated:  # a large image: embed it at the size shown, not in full
        img = img.resize((sw, sh), Image.LANCZOS)
        note = f" (shown at {sw}×{sh})"
    cls = ' class="mmpipe-pixelated"' if pixelated else ""
    approx = "" if exact else " · approximate colours (normalisation constants differ from the family's; pass the processor)"
    return (
        f'<figure class="mmpipe-figure"><img{cls} data-mmpipe-image="{label_index}" src="{png_data_uri(img)}" '
        f'width="{sw}" height="{sh}" style="border-color:{colour}" alt="image {label_index}, {W}x{H} pixels">'
        f"<figcaption>image {label_index} · grid {t}×{h}×{w} · {n_tokens} tokens{where} · {W}×{H} px{note}{approx}"
        f"</figcaption></figure>"
    )


def _video_html(frames: list, index: int, grid, n_tokens: int, p: int) -> str:
    t, h, w = grid
    colour = media_colour(index, "video")
    if not frames:
        inner = (f'<div class="mmpipe-placeholder" style="width:{shown_size(w * p, h * p)[0]}px;'
                 f'height:{shown_size(w * p, h * p)[1]}px">video {index}<br>no pixels stored</div>')
    else:
        shown = frames[:8]
        parts = []
        for g, fr in enumerate(shown):
            sw, sh, pix = shown_size(fr.width, fr.height)
            cls = ' class="mmpipe-pixelated"' if pix else ""
            parts.append(f'<img{cls} data-mmpipe-video="{index}" data-frame-group="{g}" src="{png_data_uri(fr)}" '
                         f'width="{sw // 2 or 1}" height="{sh // 2 or 1}" alt="video {index} frame group {g}">')
        more = f"<span class='mmpipe-gap'>… {len(frames) - 8} more frame groups</span>" if len(frames) > 8 else ""
        inner = f'<div class="mmpipe-frames" style="border-color:{colour}">{"".join(parts)}{more}</div>'
    return (f'<figure class="mmpipe-figure">{inner}<figcaption>video {index} · grid {t}×{h}×{w} · {n_tokens} tokens · '
            f"{w * p}×{h * p} px per frame</figcaption></figure>")


def _strip_html(row: MultiModalInputs, row_spans: list[Span], toks: TokenText, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int], extra: Optional[dict] = None) -> str:
    """The token strip: text chips, one labelled span per image/video (run), collapsed gaps."""
    ids = np.asarray(row.input_ids)
    pos = np.asarray(row.position_ids)
    labels = None if row.labels is None else np.asarray(row.labels)
    out = []
    for item in collapse_plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            kind_ids = image_ids if s.kind == "image" else video_ids
            shown_index = kind_ids[s.index] if 0 <= s.index < len(kind_ids) else -1
            shown = Span(s.kind, s.start, s.end, shown_index, s.grid, s.part, s.parts)
            colour = media_colour(max(shown_index, 0), s.kind) if shown_index >= 0 else "#d00000"
            p = pos[:, s.start:s.end]
            title = (f"tokens #{s.start}–#{s.end - 1}, token id {int(ids[s.start])}; positions "
                     f"t {value_range(p[0])}, h {value_range(p[1])}, w {value_range(p[2])}")
            trained = labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any())
            if trained:
                title += "; TRAINED (labels on media tokens)"
            tr = " mmpipe-trained" if trained else ""
            attr = "data-image" if s.kind == "image" else "data-video"
            out.append(
                f'<span class="mmpipe-{s.kind}-span{tr}" {attr}="{shown_index}" data-start="{s.start}" '
                f'data-tokens="{s.length}" style="border-color:{colour};background:{tint(colour)}" '
                f'title="{_esc(title)}">{_esc(span_label(shown))}</span>'
            )
        elif item[0] == "gap":
            out.append(f'<span class="mmpipe-gap">… {item[1]} tokens …</span>')
        else:
            i = item[1]
            tid = int(ids[i])
            cls = "mmpipe-tok"
            if toks.is_special(tid):
                cls += " mmpipe-special"
            title = f"#{i} id {tid} pos ({pos[0, i]},{pos[1, i]},{pos[2, i]})"
            if labels is not None:
                lab = int(labels[i])
                if lab != IGNORE_INDEX:
                    cls += " mmpipe-trained"
                    title += f" label {lab}"
                else:
                    title += " label -100"
            if extra and i in extra:
                title += " " + extra[i]
            out.append(f'<span class="{cls}" title="{_esc(title)}">{_esc(toks.shown(tid))}</span>')
    return f'<div class="mmpipe-strip">{"".join(out)}</div>'


def _legend(row: MultiModalInputs, toks: TokenText, counts: bool = True) -> str:
    parts = ['<span><span class="mmpipe-tok">text</span> text token</span>']
    if toks.tok is not None:
        parts.append('<span><span class="mmpipe-tok mmpipe-special">&lt;|special|&gt;</span> special token</span>')
    else:
        parts.append("<span>token ids shown (pass tokenizer= or a processor for text)</span>")
    parts.append('<span><span class="mmpipe-image-span" style="border-color:#888">image k</span> one span per image, '
                 "coloured like its thumbnail</span>")
    if row.num_videos:
        parts.append('<span><span class="mmpipe-video-span" style="border-color:#888">video k</span> video tokens</span>')
    if row.labels is None:
        parts.append("<span>no labels (nothing trained)</span>")
    else:
        n = int((np.asarray(row.labels) != IGNORE_INDEX).sum())
        n = f" ({n} tokens)" if counts else ""
        parts.append(f'<span><span class="mmpipe-tok mmpipe-trained">tok</span> trained: labels ≠ -100{n}</span>')
    parts.append("<span>hover a token: index, id, (t,h,w) position, label</span>")
    return f'<div class="mmpipe-legend">{"".join(parts)}</div>'


def _row_body(row: MultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
              image_ids: Optional[Sequence[int]] = None, video_ids: Optional[Sequence[int]] = None, spec=None,
              title: str = "MultiModalInputs", extra: Optional[dict] = None, toks: Optional[TokenText] = None,
              legend: bool = True) -> str:
    toks = toks or TokenText(tokenizer)
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    spec = spec_for(row.family, spec if spec is not None else tokenizer)
    row_spans = token_spans(row)
    first = {}
    for s in row_spans:
        if s.kind != "text" and s.index >= 0:
            first.setdefault((s.kind, s.index), s.start)
    parts = [f'<div class="mmpipe"><div class="mmpipe-head">{_esc(title)} · {_esc(row_summary(row))}</div>']
    if row.fam.is_vision and (row.num_images or row.num_videos):
        arrays, exact = image_arrays(row, spec)
        p = spec.patch_size
        tokens = row.fam.tokens_per_grid(row.image_grid_thw).tolist()
        figs = []
        for k, (arr, g) in enumerate(zip(arrays, np.asarray(row.image_grid_thw).tolist())):
            figs.append(_thumb_html(arr, image_ids[k], g, tokens[k], first.get(("image", k)),
                                    exact, p, row.pixel_format))
        if row.num_videos:
            frames = video_frames(row, spec=spec)
            video_tokens = row.fam.tokens_per_grid(row.video_grid_thw).tolist()
            for k, g in enumerate(np.asarray(row.video_grid_thw).tolist()):
                figs.append(_video_html(frames[k], video_ids[k], g, video_tokens[k], p))
        parts.append(f'<div class="mmpipe-images">{"".join(figs)}</div>')
        if not row.has_pixels:
            parts.append('<div class="mmpipe-note">layout-only row (pixels="none"): grids and positions come from the '
                         "image sizes; no pixels are stored, so boxes of the resized size stand in for the images"
                         "</div>")
    parts.append(_strip_html(row, row_spans, toks, max_tokens, image_ids, video_ids, extra))
    if legend:
        parts.append(_legend(row, toks))
    parts.append("</div>")
    return "".join(parts)


def row_html(row, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS, spec=None) -> str:
    """HTML of one row: thumbnails, the token strip, labels and a legend.

    Args:
        row: a `MultiModalInputs` (or a stored row dict).
        tokenizer: a tokenizer or processor to show token text (else ids); a processor also
            gives the normalisation constants used to read float32 pixels.
        max_tokens: text tokens shown before long text runs collapse to head/tail with
            "… n tokens …" (None: never collapse). Image spans are always all shown.
        spec: a `VisionSpec` overriding the pixel constants.

    Each image is an ``<img data-mmpipe-image="k">`` (a ``data-mmpipe-placeholder`` box for a
    layout-only row) and one ``<span class="mmpipe-image-span" data-image="k">``.
    """
    if as_tiled(row) is not None:  # a tiled family's row (mmpipe.view.tiled): its tiles, no grids
        return tiled_html(row, tokenizer=tokenizer, max_tokens=max_tokens)
    return _style() + _row_body(as_row(row), tokenizer=tokenizer, max_tokens=max_tokens, spec=spec)


def batch_html(batch: BatchedMultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
               max_rows: Optional[int] = DEFAULT_MAX_ROWS) -> str:
    """HTML of a batch: a per-row table (length, padding, images, tokens per image, grids,
    labels) of every row, then the thumbnails and token strip of the first ``max_rows`` rows
    (None: all; the page says how many are left out). Images carry their index in the batch
    (``image_grid_thw`` row); ``sample_to_image_indices`` says which row owns which. A
    `BatchedMultiModalInputs`: `mmpipe.view.tiled.tiled_html`."""
    if as_tiled(batch) is not None:
        return tiled_html(batch, tokenizer=tokenizer, max_tokens=max_tokens)
    rows = unbatch(batch)
    info = batch_table_rows(batch)
    B, L = batch.input_ids.shape
    toks = TokenText(tokenizer)
    n_vid = int(to_numpy(batch.video_grid_thw).shape[0])
    head = (f"BatchedMultiModalInputs · {batch.family} · B={B} rows × L={L} · {int(to_numpy(batch.image_grid_thw).shape[0])} "
            f"images{f' · {n_vid} videos' if n_vid else ''} · padding {batch.padding_side} · pixels {batch.pixel_format}")
    trs = []
    for r in info:
        imgs = ", ".join(str(i) for i in r["images"]) or "–"
        vids = f" + videos {', '.join(str(i) for i in r['videos'])}" if r["videos"] else ""
        trs.append(
            f"<tr><td>{r['row']}</td><td>{r['length']}</td><td>{r['padding']} ({batch.padding_side})</td>"
            f"<td>{len(r['images'])}: [{imgs}]{vids}</td><td>{', '.join(map(str, r['tokens_per_image'])) or '–'}</td>"
            f"<td>{', '.join(grid_str(g) for g in r['grids']) or '–'}</td>"
            f"<td>{'yes (' + str(r['trained_tokens']) + ' trained)' if r['has_labels'] else 'no'}</td>"
            f"<td>{_esc(r['pixels'])}</td></tr>"
        )
    table = ('<table class="mmpipe-table"><thead><tr><th>row</th><th>length</th><th>padding</th><th>images</th>'
             "<th>tokens per image</th><th>grids (t×h×w)</th><th>labels</th><th>pixels</th></tr></thead>"
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
    lp = None if sample.logprobs is None else np.asarray(sample.logprobs, np.float64)
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
    if as_tiled(obj) is not None:
        return tiled_html(obj, tokenizer=tokenizer, max_tokens=max_tokens)
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
