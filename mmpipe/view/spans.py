"""Token spans of a row (view stage): the token sequence cut into text / image / video runs,
token ids shown as text, and how long text runs collapse for display.

`set_default_processor` names the tokenizer (or processor) every view falls back to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.families import ModelFamily, family_of
from mmpipe.records.row import MultiModalInputs


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


def _media_queue(fam: ModelFamily, grids) -> list[tuple[int, tuple, int]]:
    """``(index, grid, LLM tokens)`` of each (t, h, w) grid of ``grids`` int [n, 3], in order."""
    grids = np.asarray(grids).reshape(-1, 3)
    return [(k, tuple(int(x) for x in g), int(n)) for k, (g, n) in enumerate(zip(grids, fam.tokens_per_grid(grids)))]


def token_spans(row: MultiModalInputs) -> list[Span]:
    """The row's token sequence cut into text / image / video spans, one span per image (and
    per video run), images assigned in order by their grids' token counts."""
    mm = np.asarray(row.mm_token_type_ids)
    L = len(mm)
    queues = {1: _media_queue(row.fam, row.image_grid_thw), 2: _media_queue(row.fam, row.video_grid_thw)}
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


# ---- the default tokenizer / processor ------------------------------------------------------
_DEFAULT: dict[str, Any] = {"processor": None}


def set_default_processor(processor) -> None:
    """Use ``processor`` (or a tokenizer) whenever a view is given none: token text for every
    ``row`` / ``batch`` shown in Jupyter, and its constants for float32 rows of its family.
    ``None`` goes back to token ids."""
    _DEFAULT["processor"] = processor


def default_processor_for(family: Optional[str] = None) -> Any:
    """The processor set by `set_default_processor` (None if none), or None when it belongs to
    another family than ``family``."""
    proc = _DEFAULT["processor"]
    if proc is None or family is None:
        return proc
    try:
        return proc if family_of(proc).name == family else None
    except (TypeError, ValueError):
        return None


# ---- token text ----------------------------------------------------------------------------
class TokenText:
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


def collapse_plan(row_spans: Sequence[Span], max_tokens: Optional[int]) -> list:
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


def span_label(s: Span) -> str:
    """``"image 0 · grid 1×4×6 · 6 tokens"`` (plus ``"· frames k/n"`` for a split video)."""
    t, h, w = s.grid if s.grid is not None else ("?", "?", "?")
    name = f"{s.kind} {s.index}" if s.index >= 0 else f"{s.kind} ? (no grid accounts for these tokens)"
    part = f" · frames {s.part + 1}/{s.parts}" if s.parts > 1 else ""
    return f"{name}{part} · grid {t}×{h}×{w} · {s.length} tokens"


def value_range(pos: np.ndarray) -> str:
    """``"lo..hi"`` of an array (``"v"`` when constant), e.g. a span's positions on one axis."""
    lo, hi = int(pos.min()), int(pos.max())
    return str(lo) if lo == hi else f"{lo}..{hi}"
