"""Rows, batches and rollout samples that show themselves: HTML for Jupyter, text for terminals.

What a row looks like to the model, one call away::

    row                      # in Jupyter: MultiModalInputs._repr_html_ -> row_html(row)
    print(row.describe())    # terminal: lengths, grids, token spans, the token text
    batch                    # per-row table (length, padding, images, tokens per image) + rows

- **Images** are reconstructed from the stored pixels, i.e. what the model sees after the
  resize: compact uint8 rows via `mmpipe.images.unpatchify_u8`, float32 rows by inverting
  the normalisation table exactly (`mmpipe.images.pixel_values_to_u8`). Layout-only rows
  (``pixels="none"``) have no pixels: a labelled placeholder box of the image's resized
  aspect is drawn instead (never an ``<img>``).
- **Tokens** form a strip coloured by modality. Each image's tokens are ONE labelled span
  ("image k · grid t×h×w · n tokens", class ``mmpipe-image-span``, ``data-image="k"``) in the
  colour of that image's thumbnail border; videos likewise (``mmpipe-video-span``; Qwen3-VL
  splits a video into one span per frame group). Long text runs collapse to head/tail tokens
  with "… n tokens …"; image spans are never collapsed. Tokens with ``labels != -100`` (what
  the loss trains on) are underlined in green.
- Token text comes from ``tokenizer`` (a tokenizer or a processor, each token decoded on its
  own); without one the token ids are shown, unless `set_default_processor` named one (then
  plain ``row`` in Jupyter shows text too). A processor also supplies the normalisation
  constants for float32 rows (default: the family's).

All HTML is escaped, styled by one inline ``<style>`` block, with no JavaScript and no
external resource: `html_page` wraps it into a standalone document for a browser.
"""

from __future__ import annotations

import base64
import colorsys
import html
import io
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.families import get_family
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.batch import BatchedMultiModalInputs

DEFAULT_MAX_TOKENS = 400  # text tokens shown per row before text runs collapse
DEFAULT_MAX_ROWS = 16  # rows of a batch shown in full (the table lists every row)
_MIN_SHOWN_SIDE = 96  # tiny images are shown enlarged by a whole factor, pixelated
_MAX_SHOWN_SIDE = 320


# ---- what a row is made of ---------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """A run of tokens ``[start, end)`` of one modality.

    ``kind`` "text", "image" or "video"; ``index`` the image/video index in the row (-1 for
    text, or for media tokens that no grid accounts for); ``grid`` its (t, h, w) patch grid;
    ``part``/``parts`` the frame group of a video split over several runs (Qwen3-VL)."""

    kind: str
    start: int
    end: int
    index: int = -1
    grid: Optional[tuple] = None
    part: int = 0
    parts: int = 1

    @property
    def length(self) -> int:
        return self.end - self.start


def token_spans(row: MultiModalInputs) -> list[Span]:
    """The row's token sequence cut into text / image / video spans, one span per image (and
    per video run), images assigned in order by their grids' token counts."""
    mm = np.asarray(row.mm_token_type_ids)
    L = len(mm)
    m2 = row.fam.merge_size ** 2 if row.fam.is_vision else 1
    queues = {
        1: [(k, tuple(int(x) for x in g), int(np.prod(g)) // m2) for k, g in enumerate(np.asarray(row.image_grid_thw))],
        2: [(k, tuple(int(x) for x in g), int(np.prod(g)) // m2) for k, g in enumerate(np.asarray(row.video_grid_thw))],
    }
    left = {1: [q[2] for q in queues[1]], 2: [q[2] for q in queues[2]]}
    cursor = {1: 0, 2: 0}
    seen_parts: dict[tuple, int] = {}
    out: list[Span] = []
    change = np.flatnonzero(np.diff(mm)) + 1
    bounds = [0, *change.tolist(), L] if L else [0]
    for a, b in zip(bounds[:-1], bounds[1:]):
        code = int(mm[a])
        if code not in (1, 2):
            out.append(Span("text", a, b))
            continue
        kind = "image" if code == 1 else "video"
        pos = a
        while pos < b:
            k = cursor[code]
            if k >= len(queues[code]):  # more media tokens than the grids account for
                out.append(Span(kind, pos, b))
                break
            idx, grid, total = queues[code][k]
            take = min(b - pos, left[code][k])
            part = seen_parts.get((code, idx), 0)
            seen_parts[(code, idx)] = part + 1
            out.append(Span(kind, pos, pos + take, idx, grid, part))
            left[code][k] -= take
            if left[code][k] == 0:
                cursor[code] += 1
            pos += take
    # number the parts of split media (a Qwen3-VL video is one run per frame group)
    return [
        Span(s.kind, s.start, s.end, s.index, s.grid, s.part, seen_parts.get((1 if s.kind == "image" else 2, s.index), 1))
        if s.kind != "text" and s.index >= 0 else s
        for s in out
    ]


# ---- images --------------------------------------------------------------------------------
_DEFAULT: dict[str, Any] = {"processor": None}


def set_default_processor(processor) -> None:
    """Use ``processor`` (or a tokenizer) whenever a view is given none: token text for every
    ``row`` / ``batch`` shown in Jupyter, and its constants for float32 rows of its family.
    ``None`` goes back to token ids."""
    _DEFAULT["processor"] = processor


def _default_for(family: Optional[str] = None):
    proc = _DEFAULT["processor"]
    if proc is None or family is None:
        return proc
    try:
        from mmpipe.families import family_of

        return proc if family_of(proc).name == family else None
    except (TypeError, ValueError):
        return None


def _spec_for(family: str, source: Any = None):
    """The `VisionSpec` to read pixels with: from a processor / spec if given (or the default
    processor of this family), else the family's."""
    from mmpipe.images.spec import VisionSpec

    if source is None:
        source = _default_for(family)
    if isinstance(source, VisionSpec):
        return source
    if source is not None and getattr(source, "image_processor", None) is not None:
        return VisionSpec.from_processor(source)
    return VisionSpec.from_family(get_family(family))


def _approx_u8(x: np.ndarray, spec) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 by undoing the normalisation arithmetically (rounded)."""
    mean = np.asarray(spec.image_mean, np.float64)[None, :, None] if spec.do_normalize else 0.0
    std = np.asarray(spec.image_std, np.float64)[None, :, None] if spec.do_normalize else 1.0
    v = x.astype(np.float64) * std + mean
    v = v / spec.rescale_factor if spec.do_rescale else v
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def _patches_u8(row: MultiModalInputs, spec) -> tuple[Optional[np.ndarray], bool]:
    """The row's image patches as uint8 [N, 3*p*p] (one temporal copy) and whether they are
    exact; None for a row without pixels."""
    from mmpipe.images.pixels import pixel_values_to_u8

    if row.pixel_values_u8 is not None:
        return np.asarray(row.pixel_values_u8), True
    if row.pixel_values is None:
        return None, True
    pv = np.asarray(row.pixel_values, np.float32)
    try:
        return pixel_values_to_u8(pv, spec.lut(), spec.temporal_patch_size), True
    except ValueError:  # other normalisation constants than `spec`: undo them approximately
        n, d = pv.shape
        T = spec.temporal_patch_size
        x = pv.reshape(n, 3, T, d // (3 * T))[:, :, 0, :]
        return _approx_u8(x, spec).reshape(n, -1), False


def _image_arrays(row: MultiModalInputs, spec=None) -> tuple[list[Optional[np.ndarray]], bool]:
    """uint8 [H', W', 3] per image (None without pixels), and whether they are exact."""
    from mmpipe.images.pixels import unpatchify_u8

    spec = _spec_for(row.family, spec)
    patches, exact = _patches_u8(row, spec)
    grids = np.asarray(row.image_grid_thw).reshape(-1, 3)
    if patches is None:
        return [None] * len(grids), exact
    out, at = [], 0
    for t, h, w in grids.tolist():
        n = t * h * w
        out.append(unpatchify_u8(patches[at:at + h * w], h, w, spec))
        at += n
    return out, exact


def image_thumbnails(row, *, spec=None) -> list:
    """The row's images as the model sees them (after the resize), from the stored pixels.

    Args:
        row: a `MultiModalInputs` (or a stored row dict).
        spec: a `VisionSpec` or a processor supplying the normalisation constants that
            float32 rows are inverted with (default: the family's).

    Returns one ``PIL.Image`` (RGB, ``w*p x h*p`` pixels for grid ``(1, h, w)``) per image,
    equal to the resized uint8 image the processor normalised; ``None`` for each image of a
    layout-only row (``pixels="none"``), which stores no pixels.
    """
    from PIL import Image

    arrays, _ = _image_arrays(_as_row(row), spec)
    return [Image.fromarray(a, "RGB") if a is not None else None for a in arrays]


def video_frames(row, *, spec=None) -> list[list]:
    """Per video, the first frame of each temporal patch group as a ``PIL.Image`` (the model
    sees ``T`` frames per group); an empty list for a video without stored pixels."""
    from PIL import Image

    from mmpipe.images.pixels import unpatchify_u8, video_pixel_values_to_u8

    row = _as_row(row)
    spec = _spec_for(row.family, spec)
    T = spec.temporal_patch_size
    if row.pixel_values_videos_u8 is not None:
        patches = np.asarray(row.pixel_values_videos_u8)
    elif row.pixel_values_videos is not None:
        pv = np.asarray(row.pixel_values_videos, np.float32)
        try:
            patches = video_pixel_values_to_u8(pv, spec.lut())
        except ValueError:
            patches = _approx_u8(pv.reshape(len(pv), 3, -1), spec).reshape(len(pv), -1)
    else:
        return [[] for _ in range(row.num_videos)]
    out, at = [], 0
    for t, h, w in np.asarray(row.video_grid_thw).reshape(-1, 3).tolist():
        frames = []
        for g in range(t):
            block = patches[at + g * h * w: at + (g + 1) * h * w]
            first = block.reshape(h * w, 3, T, -1)[:, :, 0, :].reshape(h * w, -1)
            frames.append(Image.fromarray(unpatchify_u8(first, h, w, spec), "RGB"))
        out.append(frames)
        at += t * h * w
    return out


def _png_data_uri(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _shown_size(w: int, h: int) -> tuple[int, int, bool]:
    """CSS size of a thumbnail: small images enlarged by a whole factor (pixelated, so each
    patch stays crisp), large ones fitted into `_MAX_SHOWN_SIDE`."""
    side = max(w, h)
    if side < _MIN_SHOWN_SIDE:
        f = -(-_MIN_SHOWN_SIDE // side)
        return w * f, h * f, True
    if side > _MAX_SHOWN_SIDE:
        s = _MAX_SHOWN_SIDE / side
        return max(1, round(w * s)), max(1, round(h * s)), False
    return w, h, False


def media_colour(index: int, kind: str = "image") -> str:
    """The colour of image (or video) ``index``: its thumbnail border and its token span.
    Saturated, distinct for neighbouring indices (golden-ratio hue steps)."""
    base, sat = (0.02, 0.9) if kind == "image" else (0.52, 0.7)
    r, g, b = colorsys.hsv_to_rgb((base + index * 0.6180339887) % 1.0, sat, 0.82)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def _tint(colour: str, amount: float = 0.82) -> str:
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#%02x%02x%02x" % tuple(round(c + (255 - c) * amount) for c in rgb)


# ---- tokens --------------------------------------------------------------------------------
class _Tokens:
    """Token id -> display text, via the tokenizer when there is one (decoded one by one)."""

    def __init__(self, tokenizer=None):
        tokenizer = tokenizer if tokenizer is not None else _DEFAULT["processor"]
        tok = getattr(tokenizer, "tokenizer", tokenizer)
        self.tok = tok if hasattr(tok, "decode") else None
        self.cache: dict[int, str] = {}
        self.special = set(getattr(self.tok, "all_special_ids", ()) or ())

    def text(self, i: int) -> str:
        i = int(i)
        if self.tok is None:
            return str(i)
        s = self.cache.get(i)
        if s is None:
            s = self.tok.decode([i], skip_special_tokens=False)
            self.cache[i] = s
        return s

    def is_special(self, i: int) -> bool:
        if self.tok is None:
            return False
        s = self.text(i)
        return int(i) in self.special or (s.startswith("<|") and s.endswith("|>"))

    def shown(self, i: int) -> str:
        """Text for a token chip: newlines and tabs made visible, empty tokens marked."""
        s = self.text(i)
        if self.tok is None:
            return s
        s = s.replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")
        return s if s else "∅"


def _plan(row_spans: Sequence[Span], max_tokens: Optional[int]) -> list:
    """Items to show: a Span for image/video, ("tok", i) for a text token, ("gap", n) for a
    collapsed middle of a long text run. Text runs collapse only when the row's text tokens
    exceed ``max_tokens``; each then keeps about ``max_tokens / (2 * runs)`` head and tail tokens."""
    text = [s for s in row_spans if s.kind == "text"]
    n_text = sum(s.length for s in text)
    keep = None
    if max_tokens is not None and n_text > max_tokens:
        keep = max(1, int(max_tokens) // (2 * max(1, len(text))))
    items: list = []
    for s in row_spans:
        if s.kind != "text":
            items.append(s)
        elif keep is None or s.length <= 2 * keep + 1:
            items += [("tok", i) for i in range(s.start, s.end)]
        else:
            items += [("tok", i) for i in range(s.start, s.start + keep)]
            items.append(("gap", s.length - 2 * keep))
            items += [("tok", i) for i in range(s.end - keep, s.end)]
    return items


def _span_label(s: Span) -> str:
    t, h, w = s.grid if s.grid is not None else ("?", "?", "?")
    name = f"{s.kind} {s.index}" if s.index >= 0 else f"{s.kind} ? (no grid accounts for these tokens)"
    part = f" · frames {s.part + 1}/{s.parts}" if s.parts > 1 else ""
    return f"{name}{part} · grid {t}×{h}×{w} · {s.length} tokens"


def _range(pos: np.ndarray) -> str:
    lo, hi = int(pos.min()), int(pos.max())
    return str(lo) if lo == hi else f"{lo}..{hi}"


# ---- HTML ----------------------------------------------------------------------------------
_CSS = """
.mmpipe{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:13px;color:#222;
  background:#fff;line-height:1.45;margin:6px 0;padding:6px 8px;border:1px solid #ddd;border-radius:6px}
.mmpipe .mmpipe{border:none;padding:0;margin:10px 0 0 0}
.mmpipe-head{font-weight:600;margin:2px 0 6px 0}
.mmpipe-note{color:#8a5a00;font-size:12px;margin:2px 0}
.mmpipe-images{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-end;margin:6px 0}
.mmpipe-figure{margin:0;display:flex;flex-direction:column;align-items:flex-start}
.mmpipe-figure img{border:4px solid;display:block}
.mmpipe-pixelated{image-rendering:pixelated}
.mmpipe-figure figcaption{font-size:11px;color:#444;max-width:340px;margin-top:2px}
.mmpipe-frames{display:flex;gap:3px;padding:3px;border:4px dashed}
.mmpipe-placeholder{border:3px dashed #888;box-sizing:border-box;display:flex;align-items:center;
  justify-content:center;text-align:center;font-size:11px;color:#444;padding:4px;
  background:repeating-linear-gradient(45deg,#f3f3f3,#f3f3f3 6px,#e6e6e6 6px,#e6e6e6 12px)}
.mmpipe-strip{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;line-height:2.2;
  word-break:break-all;margin:6px 0}
.mmpipe-tok{white-space:pre;background:#eef0f3;border-radius:3px;padding:1px 2px;margin:0 1px}
.mmpipe-special{background:#e6e0f8;color:#4b2f99}
.mmpipe-trained{background:#dcf3e2;box-shadow:inset 0 -3px 0 #1f8a3b}
.mmpipe-image-span,.mmpipe-video-span{border:2px solid;border-radius:4px;padding:1px 6px;margin:0 2px;
  font-weight:600;white-space:nowrap;font-family:system-ui,sans-serif;font-size:11px}
.mmpipe-video-span{border-style:dashed}
.mmpipe-gap{color:#777;font-style:italic;padding:0 4px;white-space:nowrap}
.mmpipe-legend{font-size:11px;color:#555;margin:4px 0}
.mmpipe-legend span{margin-right:10px}
.mmpipe-table{border-collapse:collapse;margin:6px 0;font-size:12px}
.mmpipe-table th,.mmpipe-table td{border:1px solid #ccc;padding:2px 7px;text-align:left;vertical-align:top}
.mmpipe-table th{background:#f4f4f4}
.mmpipe-response{white-space:pre-wrap;background:#f7f7f7;border-left:3px solid #1f8a3b;padding:4px 8px;
  font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
"""

_esc = html.escape


def _style() -> str:
    return f"<style>{_CSS}</style>"


def _thumb_html(img_arr: Optional[np.ndarray], label_index: int, grid, n_tokens: int, first_token: Optional[int],
                exact: bool, p: int, pixel_format: str) -> str:
    """One image: an <img> with its index and colour, or a placeholder box without pixels."""
    t, h, w = grid
    H, W = h * p, w * p
    colour = media_colour(label_index)
    where = f" #{first_token}–{first_token + n_tokens - 1}" if first_token is not None else ""
    if img_arr is None:
        sw, sh, _ = _shown_size(W, H)
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
    sw, sh, pixelated = _shown_size(W, H)
    if (sw, sh) != (W, H) and not pixelated:  # a large image: embed it at the size shown, not in full
        img = img.resize((sw, sh), Image.LANCZOS)
        note = f" (shown at {sw}×{sh})"
    cls = ' class="mmpipe-pixelated"' if pixelated else ""
    approx = "" if exact else " · approximate colours (normalisation constants differ from the family's; pass the processor)"
    return (
        f'<figure class="mmpipe-figure"><img{cls} data-mmpipe-image="{label_index}" src="{_png_data_uri(img)}" '
        f'width="{sw}" height="{sh}" style="border-color:{colour}" alt="image {label_index}, {W}x{H} pixels">'
        f"<figcaption>image {label_index} · grid {t}×{h}×{w} · {n_tokens} tokens{where} · {W}×{H} px{note}{approx}"
        f"</figcaption></figure>"
    )


def _video_html(frames: list, index: int, grid, n_tokens: int, p: int) -> str:
    t, h, w = grid
    colour = media_colour(index, "video")
    if not frames:
        inner = (f'<div class="mmpipe-placeholder" style="width:{_shown_size(w * p, h * p)[0]}px;'
                 f'height:{_shown_size(w * p, h * p)[1]}px">video {index}<br>no pixels stored</div>')
    else:
        shown = frames[:8]
        parts = []
        for g, fr in enumerate(shown):
            sw, sh, pix = _shown_size(fr.width, fr.height)
            cls = ' class="mmpipe-pixelated"' if pix else ""
            parts.append(f'<img{cls} data-mmpipe-video="{index}" data-frame-group="{g}" src="{_png_data_uri(fr)}" '
                         f'width="{sw // 2 or 1}" height="{sh // 2 or 1}" alt="video {index} frame group {g}">')
        more = f"<span class='mmpipe-gap'>… {len(frames) - 8} more frame groups</span>" if len(frames) > 8 else ""
        inner = f'<div class="mmpipe-frames" style="border-color:{colour}">{"".join(parts)}{more}</div>'
    return (f'<figure class="mmpipe-figure">{inner}<figcaption>video {index} · grid {t}×{h}×{w} · {n_tokens} tokens · '
            f"{w * p}×{h * p} px per frame</figcaption></figure>")


def _strip_html(row: MultiModalInputs, row_spans: list[Span], toks: _Tokens, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int], extra: Optional[dict] = None) -> str:
    """The token strip: text chips, one labelled span per image/video (run), collapsed gaps."""
    ids = np.asarray(row.input_ids)
    pos = np.asarray(row.position_ids)
    labels = None if row.labels is None else np.asarray(row.labels)
    out = []
    for item in _plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            kind_ids = image_ids if s.kind == "image" else video_ids
            shown_index = kind_ids[s.index] if 0 <= s.index < len(kind_ids) else -1
            shown = Span(s.kind, s.start, s.end, shown_index, s.grid, s.part, s.parts)
            colour = media_colour(max(shown_index, 0), s.kind) if shown_index >= 0 else "#d00000"
            p = pos[:, s.start:s.end]
            title = (f"tokens #{s.start}–#{s.end - 1}, token id {int(ids[s.start])}; positions "
                     f"t {_range(p[0])}, h {_range(p[1])}, w {_range(p[2])}")
            trained = labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any())
            if trained:
                title += "; TRAINED (labels on media tokens)"
            tr = " mmpipe-trained" if trained else ""
            attr = "data-image" if s.kind == "image" else "data-video"
            out.append(
                f'<span class="mmpipe-{s.kind}-span{tr}" {attr}="{shown_index}" data-start="{s.start}" '
                f'data-tokens="{s.length}" style="border-color:{colour};background:{_tint(colour)}" '
                f'title="{_esc(title)}">{_esc(_span_label(shown))}</span>'
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


def _legend(row: MultiModalInputs, toks: _Tokens, counts: bool = True) -> str:
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


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _row_summary(row: MultiModalInputs) -> str:
    mm = np.asarray(row.mm_token_type_ids)
    n_img, n_vid = int((mm == 1).sum()), int((mm == 2).sum())
    lab = "no labels" if row.labels is None else f"{int((np.asarray(row.labels) != IGNORE_INDEX).sum())} trained tokens"
    if not row.fam.is_vision:
        return f"{row.family} · {row.num_tokens} tokens · {lab} · rope_delta {row.rope_delta}"
    vids = f", {_n(row.num_videos, 'video')}" if row.num_videos else ""
    return (f"{row.family} · {row.num_tokens} tokens ({row.num_tokens - n_img - n_vid} text, {n_img} image"
            f"{f', {n_vid} video' if n_vid else ''}) · {_n(row.num_images, 'image')}{vids} · pixels {row.pixel_format} · "
            f"{lab} · rope_delta {row.rope_delta}")


def _row_body(row: MultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
              image_ids: Optional[Sequence[int]] = None, video_ids: Optional[Sequence[int]] = None, spec=None,
              title: str = "MultiModalInputs", extra: Optional[dict] = None, toks: Optional[_Tokens] = None,
              legend: bool = True) -> str:
    toks = toks or _Tokens(tokenizer)
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    spec = _spec_for(row.family, spec if spec is not None else tokenizer)
    row_spans = token_spans(row)
    first = {}
    for s in row_spans:
        if s.kind != "text" and s.index >= 0:
            first.setdefault((s.kind, s.index), s.start)
    parts = [f'<div class="mmpipe"><div class="mmpipe-head">{_esc(title)} · {_esc(_row_summary(row))}</div>']
    if row.fam.is_vision and (row.num_images or row.num_videos):
        arrays, exact = _image_arrays(row, spec)
        p = spec.patch_size
        m2 = row.fam.merge_size ** 2
        figs = []
        for k, (arr, g) in enumerate(zip(arrays, np.asarray(row.image_grid_thw).tolist())):
            figs.append(_thumb_html(arr, image_ids[k], g, int(np.prod(g)) // m2, first.get(("image", k)),
                                    exact, p, row.pixel_format))
        if row.num_videos:
            frames = video_frames(row, spec=spec)
            for k, g in enumerate(np.asarray(row.video_grid_thw).tolist()):
                figs.append(_video_html(frames[k], video_ids[k], g, int(np.prod(g)) // m2, p))
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


def _as_row(row) -> MultiModalInputs:
    if isinstance(row, MultiModalInputs):
        return row
    if isinstance(row, dict):
        return MultiModalInputs.from_dict(row)
    raise TypeError(f"expected a MultiModalInputs (or a stored row dict), found {type(row).__name__}")


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
    return _style() + _row_body(_as_row(row), tokenizer=tokenizer, max_tokens=max_tokens, spec=spec)


def _np(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def batch_table_rows(batch: BatchedMultiModalInputs) -> list[dict]:
    """Per row of a batch: length, padding, images (batch indices via
    ``sample_to_image_indices``), tokens per image, grids, videos and labels."""
    B, L = batch.input_ids.shape
    lengths = _np(batch.seq_lengths)
    grids = _np(batch.image_grid_thw).reshape(-1, 3)
    vgrids = _np(batch.video_grid_thw).reshape(-1, 3)
    m2 = batch.fam.merge_size ** 2 if batch.fam.is_vision else 1
    labels = _np(batch.labels) if batch.labels is not None else None
    has = _np(batch.row_has_labels) if batch.row_has_labels is not None else np.full(B, labels is not None)
    att = _np(batch.attention_mask)
    formats = batch.row_pixel_formats or [batch.pixel_format] * B
    out = []
    for b, (imgs, vids) in enumerate(zip(batch.sample_to_image_indices, batch.sample_to_video_indices)):
        n = int(lengths[b])
        out.append({
            "row": b,
            "length": n,
            "padding": int(L - n),
            "attended": int(att[b].sum()),
            "images": list(imgs),
            "tokens_per_image": [int(np.prod(grids[i])) // m2 for i in imgs],
            "grids": [tuple(int(x) for x in grids[i]) for i in imgs],
            "videos": list(vids),
            "video_grids": [tuple(int(x) for x in vgrids[i]) for i in vids],
            "has_labels": bool(has[b]),
            "trained_tokens": int((labels[b] != IGNORE_INDEX).sum()) if (labels is not None and has[b]) else 0,
            "pixels": formats[b],
        })
    return out


def _grid_str(g) -> str:
    return "×".join(str(x) for x in g)


def batch_html(batch: BatchedMultiModalInputs, *, tokenizer=None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
               max_rows: Optional[int] = DEFAULT_MAX_ROWS) -> str:
    """HTML of a batch: a per-row table (length, padding, images, tokens per image, grids,
    labels) of every row, then the thumbnails and token strip of the first ``max_rows`` rows
    (None: all; the page says how many are left out). Images carry their index in the batch
    (``image_grid_thw`` row); ``sample_to_image_indices`` says which row owns which."""
    from mmpipe.batching.unbatch import unbatch

    rows = unbatch(batch)
    info = batch_table_rows(batch)
    B, L = batch.input_ids.shape
    toks = _Tokens(tokenizer)
    head = (f"BatchedMultiModalInputs · {batch.family} · B={B} rows × L={L} · {int(_np(batch.image_grid_thw).shape[0])} "
            f"images · padding {batch.padding_side} · pixels {batch.pixel_format}")
    trs = []
    for r in info:
        imgs = ", ".join(str(i) for i in r["images"]) or "–"
        vids = f" + videos {', '.join(str(i) for i in r['videos'])}" if r["videos"] else ""
        trs.append(
            f"<tr><td>{r['row']}</td><td>{r['length']}</td><td>{r['padding']} ({batch.padding_side})</td>"
            f"<td>{len(r['images'])}: [{imgs}]{vids}</td><td>{', '.join(map(str, r['tokens_per_image'])) or '–'}</td>"
            f"<td>{', '.join(_grid_str(g) for g in r['grids']) or '–'}</td>"
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
    toks = _Tokens(tokenizer)
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
    from mmpipe.records.rollout import RolloutSample

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


# ---- plain text ----------------------------------------------------------------------------
def _token_line(row: MultiModalInputs, row_spans: list[Span], toks: _Tokens, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int]) -> str:
    """The sequence as one line: decoded text (or ids), media as [image k · ...], trained
    tokens between ⟦ ⟧."""
    labels = None if row.labels is None else np.asarray(row.labels)
    ids = np.asarray(row.input_ids)
    out, trained_open = [], False
    sep = "" if toks.tok is not None else " "

    def mark(trained: bool):
        nonlocal trained_open
        if trained != trained_open:
            out.append("⟦" if trained else "⟧")
            trained_open = trained

    for item in _plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            kind_ids = image_ids if s.kind == "image" else video_ids
            shown = Span(s.kind, s.start, s.end, kind_ids[s.index] if 0 <= s.index < len(kind_ids) else -1,
                         s.grid, s.part, s.parts)
            mark(labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any()))
            out.append(f"{sep}[{_span_label(shown)}]{sep}")
        elif item[0] == "gap":
            out.append(f"{sep}… {item[1]} tokens …{sep}")
        else:
            i = item[1]
            mark(labels is not None and int(labels[i]) != IGNORE_INDEX)
            out.append((toks.shown(int(ids[i])) if toks.tok is not None else str(int(ids[i]))) + sep)
    mark(False)
    return "".join(out).strip()


def _describe_row(row: MultiModalInputs, toks: _Tokens, max_tokens, image_ids=None, video_ids=None,
                  title="MultiModalInputs", indent="") -> list[str]:
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    row_spans = token_spans(row)
    lines = [f"{indent}{title}: {_row_summary(row)}"]
    pos = np.asarray(row.position_ids)
    p = row.fam.patch_size
    for s in row_spans:
        if s.kind == "text":
            continue
        ids = image_ids if s.kind == "image" else video_ids
        k = ids[s.index] if 0 <= s.index < len(ids) else -1
        shown = Span(s.kind, s.start, s.end, k, s.grid, s.part, s.parts)
        size = f", {s.grid[2] * p}×{s.grid[1] * p} px" if s.grid is not None else ""
        q = pos[:, s.start:s.end]
        lines.append(f"{indent}  {_span_label(shown)}{size}, tokens [{s.start}, {s.end}), "
                     f"positions t {_range(q[0])} h {_range(q[1])} w {_range(q[2])}")
    if not row.has_pixels and (row.num_images or row.num_videos):
        lines.append(f"{indent}  (layout-only row: no pixels stored)")
    lines.append(f"{indent}  tokens: {_token_line(row, row_spans, toks, max_tokens, image_ids, video_ids)}")
    if row.labels is not None:
        lines.append(f"{indent}  (trained tokens, labels != -100, between ⟦ ⟧)")
    return lines


def describe(obj, *, tokenizer=None, max_tokens: Optional[int] = 120) -> str:
    """Plain-text description for terminals of a row, batch or rollout sample (or a list).

    Rows: lengths, one line per image (grid, tokens, resized size, token range, position
    ranges) and the token sequence (decoded with ``tokenizer``, else ids; long text runs
    collapsed beyond ``max_tokens``; trained tokens between ⟦ ⟧). Batches: a per-row table
    (length, padding, images, tokens per image, grids, labels), then each row.
    """
    from mmpipe.records.rollout import RolloutSample

    toks = _Tokens(tokenizer)
    if isinstance(obj, (list, tuple)):
        return "\n".join(describe(o, tokenizer=tokenizer, max_tokens=max_tokens) for o in obj)
    if isinstance(obj, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        info = batch_table_rows(obj)
        B, L = obj.input_ids.shape
        lines = [f"BatchedMultiModalInputs: {obj.family}, B={B} rows x L={L}, {sum(len(r['images']) for r in info)} "
                 f"images, padding {obj.padding_side}, pixels {obj.pixel_format}"]
        head = ("row", "length", "padding", "images", "tokens/image", "grids", "labels")
        table = [head]
        for r in info:
            table.append((
                str(r["row"]), str(r["length"]), str(r["padding"]),
                f"{len(r['images'])} {r['images']}" + (f" +videos {r['videos']}" if r["videos"] else ""),
                ",".join(map(str, r["tokens_per_image"])) or "-",
                ",".join(_grid_str(g) for g in r["grids"]) or "-",
                f"yes ({r['trained_tokens']} trained)" if r["has_labels"] else "no",
            ))
        widths = [max(len(t[c]) for t in table) for c in range(len(head))]
        for t in table:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
        for b, row in enumerate(unbatch(obj)):
            lines += _describe_row(row, toks, max_tokens, info[b]["images"], info[b]["videos"], f"row {b}", "  ")
        return "\n".join(lines)
    if isinstance(obj, RolloutSample):
        lp = None if obj.logprobs is None else np.asarray(obj.logprobs, np.float64)
        R = len(obj.response_ids)
        stats = f", logprobs mean {lp.mean():.4f} min {lp.min():.4f}" if (lp is not None and R) else ""
        lines = [f"RolloutSample: prompt {obj.prompt_index} sample {obj.sample_index}, finish {obj.finish_reason}"
                 + (f" ({obj.stop_reason})" if obj.stop_reason is not None else "")
                 + f", {obj.prompt.num_tokens} prompt + {R} response tokens{stats}"]
        lines += _describe_row(obj.to_row(), toks, max_tokens, title="prompt+response", indent="  ")
        return "\n".join(lines)
    return "\n".join(_describe_row(_as_row(obj), toks, max_tokens))
