"""Token spans of a row (view stage): the token sequence cut into text / image / video runs,
token ids shown as text, and how long text runs collapse for display.

How many tokens each image and video takes, and how a span is labelled, comes from the row's
items in one typed form (`MediaLayout`: tokens, label); how its runs of media tokens group into
items is its kind's (``fam.media.view_runs``, `mmpipe.media`); the rest is the same for every family.
`set_default_processor` names the tokenizer (or processor) every view falls back to.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.families import resolve_family
from mmpipe.records.row import MultiModalInputs


@dataclass(frozen=True)
class Span:
    """A run of tokens ``[start, end)`` of one modality.

    ``kind`` "text", "image" or "video"; ``index`` the image/video index in the row (-1 for
    text, or for media tokens that no layout accounts for); ``last`` the last image of a span
    that covers touching images whose tokens cannot be cut apart (tiles kind), else ``index``;
    ``part``/``parts`` the frame group of a video split over several runs (Qwen3-VL)."""

    kind: str
    start: int
    end: int
    index: int = -1
    last: int = -1
    part: int = 0
    parts: int = 1

    @property
    def length(self) -> int:
        return self.end - self.start


def marked_runs(marked: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of True in ``marked`` bool [L]."""
    edges = np.diff(np.concatenate([[0], marked.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _cut(runs: list, counts: Optional[list[int]], n: int) -> list[tuple[int, int, int, int]]:
    """``(start, end, index, last)`` pieces of one kind's ``runs``: item k takes ``counts[k]``
    tokens in order, so touching items split where their counts say and an item over several
    runs gives a piece per run; index -1: tokens that no count accounts for. ``counts`` None
    (the row does not say where each item's tokens end): a run per item in order, the last run
    covering the rest (``index..n-1``)."""
    if counts is None:
        return [(a, b, k, k if k < len(runs) - 1 else n - 1) for k, (a, b) in enumerate(runs)]
    left, k, out = list(counts), 0, []
    for a, b in runs:
        while a < b:
            if k >= len(left):  # more media tokens than the counts account for
                out.append((a, b, -1, -1))
                break
            take = min(b - a, left[k])
            out.append((a, a + take, k, k))
            left[k] -= take
            k += left[k] == 0
            a += take
    return out


def media_spans(row: MultiModalInputs) -> list[Span]:
    """The row's image and video spans in token order: the runs of ``mm_token_type_ids`` (1
    image, 2 video) as the strategy reads them, with each item's token count where the row
    says it (`MediaLayout.tokens`; the runs as the kind reads them: ``fam.media.view_runs``), cut
    into items (`_cut`). An item over several runs is one span per run, ``part`` of ``parts``
    (Qwen3-VL's frame groups)."""
    mm, pieces = np.asarray(row.mm_token_type_ids), []
    for code, kind, n in ((1, "image", row.num_images), (2, "video", row.num_videos)):
        runs, tokens = row.fam.media.view_runs(row, kind, marked_runs(mm == code)), row.media_layout(kind).tokens
        counts = None if tokens is None else tokens.tolist()
        pieces += [(kind, *p) for p in _cut(runs, counts, n)]
    pieces.sort(key=lambda p: p[1])
    parts = Counter((kind, k) for kind, _, _, k, _ in pieces if k >= 0)
    seen: Counter = Counter()
    spans = []
    for kind, a, b, k, last in pieces:
        spans.append(Span(kind, a, b, k, last, seen[(kind, k)] if k >= 0 else 0, parts.get((kind, k), 1)))
        seen[(kind, k)] += 1
    return spans


def token_spans(row: MultiModalInputs) -> list[Span]:
    """The row's token sequence cut into text spans and its `media_spans`: one span per image
    (and per video run); text in between."""
    out: list[Span] = []
    pos, L = 0, row.num_tokens
    for s in media_spans(row):
        if s.start > pos:
            out.append(Span("text", pos, s.start))
        out.append(s)
        pos = s.end
    if pos < L:
        out.append(Span("text", pos, L))
    return out


def span_label(row: MultiModalInputs, s: Span, shown: Optional[int] = None) -> str:
    """``"image 0 · grid 1×4×6 · 6 tokens"`` (patches), ``"image 0 · 40×56 px · 1 tiles · 4
    tokens"`` (tiles), ``"images 0-1 · 5 tiles · 8 tokens"`` (touching images), plus ``"·
    frames k/n"`` for a split video. ``shown``: the number to show for ``s.index`` (a batch's
    image index), default ``s.index``."""
    k = s.index if shown is None else shown
    last = s.last if s.last >= 0 else s.index
    if s.index < 0:
        name = f"{s.kind} ? (no layout accounts for these tokens)"
    elif last != s.index:
        name = f"{s.kind}s {k}-{k + last - s.index}"
    else:
        name = f"{s.kind} {k}"
    part = f" · frames {s.part + 1}/{s.parts}" if s.parts > 1 else ""
    return f"{name}{part} · {row.media_layout(s.kind).label(s.index, last)} · {s.length} tokens"


def media_tokens(row_spans: Sequence[Span]) -> dict:
    """``(kind, index) -> (first token, tokens)`` of each media item that has its own span(s)."""
    out: dict = {}
    for s in row_spans:
        if s.kind != "text" and s.index >= 0 and s.last in (-1, s.index):
            first, n = out.get((s.kind, s.index), (s.start, 0))
            out[(s.kind, s.index)] = (first, n + s.length)
    return out


# ---- the default tokenizer / processor ------------------------------------------------------
_DEFAULT: dict[str, Any] = {"processor": None}


def set_default_processor(processor) -> None:
    """Use ``processor`` (or a tokenizer) whenever a view is given none: token text for every
    ``row`` / ``batch`` shown in Jupyter, its constants for float32 rows of its family, and its
    image processor for ``pixels="source"`` rows (their files decoded as collate decodes them).
    ``None`` goes back to token ids."""
    _DEFAULT["processor"] = processor


def default_processor_for(family: Optional[str] = None) -> Any:
    """The processor set by `set_default_processor` (None if none), or None when it belongs to
    another family than ``family``."""
    proc = _DEFAULT["processor"]
    if proc is None or family is None:
        return proc
    try:
        return proc if resolve_family(proc).name == family else None
    except (TypeError, ValueError):
        return None


# ---- token text ----------------------------------------------------------------------------
# a token that continues a character started by the token before it (`TokenText.split_chars`)
CONTINUED = "◌"
_MAX_CHAR_TOKENS = 8  # a character is at most 4 UTF-8 bytes; a run may start with other text


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

    def split_chars(self, ids: np.ndarray) -> dict[int, str]:
        """``{position: text}`` for tokens of ``ids`` (int [L]) that hold part of a character.

        Byte-level BPE splits a character of several UTF-8 bytes (emoji, CJK, Hebrew, ...)
        over tokens; decoded one by one each shows only U+FFFD. The token that starts such a
        character gets the text of the run decoded together (the whole character), the tokens
        that continue it get `CONTINUED`. A run that never decodes cleanly (a row cut inside a
        character, a real U+FFFD) keeps the tokens' own text."""
        out: dict[int, str] = {}
        if self.tok is None:
            return out
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        i, n = 0, len(ids)
        while i < n:
            end = None
            if "\ufffd" in self.text(ids[i]) and ids[i] not in self.special:
                for e in range(i + 2, min(i + _MAX_CHAR_TOKENS, n) + 1):
                    joined = self.tok.decode(ids[i:e], skip_special_tokens=False)
                    if "\ufffd" not in joined:
                        end = e
                        out[i] = joined
                        out.update((k, CONTINUED) for k in range(i + 1, e))
                        break
            i = end if end is not None else i + 1
        return out

    def shown(self, i: int, text: Optional[str] = None) -> str:
        """Text for a token chip: newlines and tabs made visible, empty tokens marked.
        ``text``: the token's text from `split_chars` (a character split over tokens)."""
        s = self.text(i) if text is None else text
        if self.tok is None or s == CONTINUED:
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


def value_range(pos: np.ndarray) -> str:
    """``"lo..hi"`` of an array (``"v"`` when constant), e.g. a span's positions on one axis."""
    lo, hi = int(pos.min()), int(pos.max())
    return str(lo) if lo == hi else f"{lo}..{hi}"


AXES = ("t", "h", "w")  # the M-RoPE position rows


def position_ranges(row: MultiModalInputs, start: int, end: int) -> list[str]:
    """Positions of tokens ``[start, end)`` per position row: ``["t 3", "h 3..4", "w 3..5"]``
    for M-RoPE rows ([3, L]), ``["3..9"]`` for 1-D positions ([L])."""
    pos = np.asarray(row.position_ids)
    if pos.ndim == 1:
        return [value_range(pos[start:end])]
    names = AXES if len(pos) == len(AXES) else [str(a) for a in range(len(pos))]
    return [f"{n} {value_range(q[start:end])}" for n, q in zip(names, pos)]


def token_position(row: MultiModalInputs, i: int) -> str:
    """Position of token ``i``: ``"(t,h,w)"`` for M-RoPE rows, ``"p"`` for 1-D positions."""
    pos = np.asarray(row.position_ids)
    return str(int(pos[i])) if pos.ndim == 1 else "(" + ",".join(str(int(q[i])) for q in pos) + ")"
