"""Tiled-family rows and batches in the view stage (Gemma 3, InternVL, LLaVA-OneVision:
`mmpipe.records.tiled.MultiModalInputs` / `BatchedMultiModalInputs`, or their stored dicts): `mmpipe.view.describe`
and `row_html` / `batch_html` / `to_html` come here for them.

- **Images**: each image's stored uint8 tiles (what the processor normalises into
  ``pixel_values``: resized, cropped, padded as the model sees them), one thumbnail per tile;
  layout-only rows (no pixels) get a labelled box per image with its stored (height, width).
- **Tokens**: each image's feature tokens are ONE labelled span ("image k · H×W px · n tiles ·
  t tokens", class ``mmpipe-image-span``); Gemma 3 writes one run per tile, merged into its
  image's span; where images touch (LLaVA-OneVision renders ``<image><image>``) one span
  covers them ("images 0-1"). Long text runs collapse to head/tail tokens; tokens with labels
  are underlined in green (describe: between ⟦ ⟧).
"""

from __future__ import annotations

import html
from typing import Any, Optional

import numpy as np
from PIL import Image

from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.kinds import is_tiled_row
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.images import media_colour, png_data_uri, shown_size, tint
from mmpipe.view.spans import Span, TokenText, collapse_plan
from mmpipe.view.style import style_block

__all__ = ["as_tiled", "tiled_spans", "describe_tiled", "tiled_html"]

_esc = html.escape


def as_tiled(obj: Any):
    """``obj`` as a `MultiModalInputs` / `BatchedMultiModalInputs` (a stored tiled dict is read), else None."""
    if isinstance(obj, (MultiModalInputs, BatchedMultiModalInputs)):
        return obj if is_tiled_row(obj) else None
    if isinstance(obj, dict) and is_tiled_row(obj):
        return MultiModalInputs.from_dict(obj)
    return None


def tiled_spans(row: MultiModalInputs) -> list[Span]:
    """The row's tokens cut into text spans and one span per image (``index`` k; ``part`` the
    last image of a span covering touching images, else k)."""
    marked = np.asarray(row.mm_token_type_ids) == 1
    edges = np.diff(np.concatenate([[0], marked.astype(np.int8), [0]]))
    runs = list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))
    tiles, n = np.asarray(row.tiles_per_image), row.num_images
    if len(runs) == int(tiles.sum()) and len(runs) != n:  # a run per tile (Gemma 3): one span per image
        ends = np.cumsum(tiles).tolist()
        groups = [(runs[e - t][0], runs[e - 1][1], k, k) for k, (e, t) in enumerate(zip(ends, tiles.tolist())) if t]
    elif len(runs) == n:
        groups = [(a, b, k, k) for k, (a, b) in enumerate(runs)]
    else:  # touching images: runs in order, the last covering the rest
        groups = [(a, b, k, k if k < len(runs) - 1 else n - 1) for k, (a, b) in enumerate(runs)]
    out, pos = [], 0
    for a, b, first, last in groups:
        if a > pos:
            out.append(Span("text", pos, a))
        out.append(Span("image", a, b, first, None, last))
        pos = b
    if pos < len(marked):
        out.append(Span("text", pos, len(marked)))
    return out


def _label(row: MultiModalInputs, s: Span) -> str:
    if s.part != s.index:
        return f"images {s.index}-{s.part} · {int(row.tiles_per_image[s.index:s.part + 1].sum())} tiles · {s.length} tokens"
    h, w = (int(x) for x in row.image_hw[s.index])
    return f"image {s.index} · {h}×{w} px · {int(row.tiles_per_image[s.index])} tiles · {s.length} tokens"


def _rows_of(obj) -> list[MultiModalInputs]:
    if isinstance(obj, BatchedMultiModalInputs):
        from mmpipe.batching.tiled import unbatch_tiled

        return unbatch_tiled(obj)
    return [obj]


def _head(row: MultiModalInputs, title: str) -> str:
    trained = "no labels" if row.labels is None else f"{int((row.labels != IGNORE_INDEX).sum())} trained tokens"
    pixels = "uint8 tiles" if row.has_pixels else "layout-only (no pixels)"
    return (f"{title}: {row.family}, {len(row)} tokens ({int(row.mm_token_type_ids.sum())} image), "
            f"{row.num_images} images ({int(row.tiles_per_image.sum())} tiles), {pixels}, {trained}")


def _token_line(row: MultiModalInputs, spans: list[Span], toks: TokenText, max_tokens: Optional[int]) -> str:
    labels, ids, out, open_ = row.labels, row.input_ids, [], False
    sep = "" if toks.tok is not None else " "
    for item in collapse_plan(spans, max_tokens):
        trained = False
        if isinstance(item, Span):
            piece = f"{sep}[{_label(row, item)}]{sep}"
        elif item[0] == "gap":
            piece = f"{sep}… {item[1]} tokens …{sep}"
        else:
            trained = labels is not None and int(labels[item[1]]) != IGNORE_INDEX
            piece = toks.shown(int(ids[item[1]])) + sep
        if trained != open_:
            out.append("⟦" if trained else "⟧")
            open_ = trained
        out.append(piece)
    return "".join(out + (["⟧"] if open_ else [])).strip()


def describe_tiled(obj, *, tokenizer=None, max_tokens: Optional[int] = 120) -> str:
    """Plain text of a tiled row or batch: a head line, one line per image (size, tiles, token
    range) and the token sequence with the image runs collapsed into ``[image k · ...]``."""
    obj, toks, lines = as_tiled(obj), TokenText(tokenizer), []
    if isinstance(obj, BatchedMultiModalInputs):
        lines.append(f"BatchedMultiModalInputs: {obj.family}, B={obj.batch_size} rows x L={obj.input_ids.shape[1]}, "
                     f"{len(obj.tiles_per_image)} images ({int(obj.tiles_per_image.sum())} tiles), "
                     f"padding {obj.padding_side}")
    indent = "  " if isinstance(obj, BatchedMultiModalInputs) else ""
    for b, row in enumerate(_rows_of(obj)):
        spans = tiled_spans(row)
        lines.append(indent + _head(row, f"row {b}" if indent else "MultiModalInputs"))
        for s in spans:
            if s.kind == "image":
                lines.append(f"{indent}  {_label(row, s)}, tokens [{s.start}, {s.end})")
        lines.append(f"{indent}  tokens: {_token_line(row, spans, toks, max_tokens)}")
    return "\n".join(lines)


def _images_html(row: MultiModalInputs) -> str:
    figs, first = [], np.concatenate([[0], np.cumsum(row.tiles_per_image)]).astype(int)
    for k, (h, w) in enumerate(row.image_hw.tolist()):
        colour = media_colour(k)
        cap = f"image {k} · {h}×{w} px · {int(row.tiles_per_image[k])} tiles"
        if row.has_pixels:
            tiles = row.pixel_values_u8[first[k]:first[k + 1]]
            imgs = []
            for t in tiles:
                sw, sh, pix = shown_size(t.shape[1], t.shape[0])
                imgs.append(f'<img src="{png_data_uri(Image.fromarray(t))}" width="{sw}" height="{sh}" '
                            f'class="{"mmpipe-pixelated" if pix else ""}" style="border-color:{colour}" alt="tile">')
            body = f'<div class="mmpipe-images">{"".join(imgs)}</div>'
        else:
            sw, sh, _ = shown_size(w, h)
            body = (f'<div class="mmpipe-placeholder" style="width:{sw}px;height:{sh}px;border-color:{colour}">'
                    f'{h}×{w} px, no pixels stored</div>')
        figs.append(f'<figure class="mmpipe-figure" data-image="{k}">{body}<figcaption>{_esc(cap)}</figcaption></figure>')
    return f'<div class="mmpipe-images">{"".join(figs)}</div>' if figs else ""


def _strip_html(row: MultiModalInputs, spans: list[Span], toks: TokenText, max_tokens: Optional[int]) -> str:
    ids, labels, out = row.input_ids, row.labels, []
    for item in collapse_plan(spans, max_tokens):
        if isinstance(item, Span):
            colour = media_colour(item.index)
            out.append(f'<span class="mmpipe-image-span" data-image="{item.index}" data-start="{item.start}" '
                       f'data-tokens="{item.length}" style="border-color:{colour};background:{tint(colour)}">'
                       f'{_esc(_label(row, item))}</span>')
        elif item[0] == "gap":
            out.append(f'<span class="mmpipe-gap">… {item[1]} tokens …</span>')
        else:
            i, tid = item[1], int(ids[item[1]])
            cls = "mmpipe-tok" + (" mmpipe-special" if toks.is_special(tid) else "")
            if labels is not None and int(labels[i]) != IGNORE_INDEX:
                cls += " mmpipe-trained"
            out.append(f'<span class="{cls}" title="#{i} id {tid}">{_esc(toks.shown(tid))}</span>')
    return f'<div class="mmpipe-strip">{"".join(out)}</div>'


def tiled_html(obj, *, tokenizer=None, max_tokens: Optional[int] = 400) -> str:
    """HTML of a tiled row or batch (module doc): escaped, one inline style block."""
    obj, toks, parts = as_tiled(obj), TokenText(tokenizer), [style_block()]
    batch = isinstance(obj, BatchedMultiModalInputs)
    if batch:
        parts.append(f'<div class="mmpipe"><div class="mmpipe-head">{_esc(describe_tiled(obj).splitlines()[0])}</div>')
    for b, row in enumerate(_rows_of(obj)):
        head = _head(row, f"row {b}" if batch else "MultiModalInputs")
        parts.append(f'<div class="mmpipe"><div class="mmpipe-head">{_esc(head)}</div>{_images_html(row)}'
                     f'{_strip_html(row, tiled_spans(row), toks, max_tokens)}</div>')
    return "".join(parts) + ("</div>" if batch else "")
