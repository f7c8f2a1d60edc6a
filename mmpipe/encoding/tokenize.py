"""Tokenizing a rendered prompt with memory bounded by the text, not by the tokenizer's output.

A fast tokenizer's Python result costs ~40 bytes per token id and ~130 per offset pair (Python
ints and tuples), plus its Rust encoding: a 10 MB text row took ~3 GB to tokenize whole. Long
texts are therefore tokenized piece by piece, each piece's ids and offsets converted to numpy
at once, and the pieces joined; the peak is one piece's Python output plus the int64 arrays.

Exactness: a cut is only made where the tokenizer itself would split. A candidate cut ``c``
(just after a newline, else after a space, near each piece's end) is accepted when, in a
window of ``window`` characters around it (at least twice the longest added token), (1) the
tokenizer's own tokens of the window have a pre-token (word) boundary at ``c``, and the
pre-tokens on both sides of it end inside the window, and (2) tokenizing the two halves
separately gives exactly those tokens. Added/special tokens, pre-tokens (a long whitespace run
is one), normalizer context (NFC combining marks) and BPE merges that span ``c`` fail (1) or (2). Where no candidate in a piece
passes, the piece grows (worst case: the whole text in one call, as before). Short texts (under
``MIN_CHARS``) take the single call. `tests/encoding/test_tokenize.py` checks pieces == whole
on adversarial texts with tiny pieces and windows, on a tokenizer with learned BPE merges.

Also here: where a tokenizer's text splits at all, its added tokens (`added_tokens`, and
`text_run_start` for the run of text ids before a position), which the video timestamps and the
multi-turn appends re-tokenize from.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np

MIN_CHARS = 1 << 18  # 256 KiB of text: below this one call is cheap (a few tens of MB)
PIECE_CHARS = 1 << 16  # ~64K characters per call above it
WINDOW = 512  # characters each side of a candidate cut checked by tokenizing


def _call(tokenizer, text: str, offsets: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """One tokenizer call -> (ids int64 [n], offsets int64 [n, 2] or None), Python lists freed."""
    enc = dict(tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets,
                         return_attention_mask=False, return_token_type_ids=False))
    ids = np.asarray(enc.pop("input_ids"), dtype=np.int64)
    if not offsets:
        return ids, None
    off = np.asarray(enc.pop("offset_mapping"), dtype=np.int64).reshape(-1, 2)
    return ids, off


def _cut_ok(tokenizer, text: str, c: int, window: int) -> bool:
    """Whether ``text`` may be tokenized as ``text[:c]`` and ``text[c:]`` around ``c`` (module doc)."""
    lo, hi = max(0, c - window), min(len(text), c + window)
    enc = tokenizer(text[lo:hi], add_special_tokens=False, return_offsets_mapping=True,
                    return_attention_mask=False, return_token_type_ids=False)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    off = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    k = int(np.searchsorted(off[:, 0], c - lo))
    if k == 0 or k >= len(ids) or off[k, 0] != c - lo or off[k - 1, 1] > c - lo:
        return False  # no token starts exactly at c (or the one before runs over it)
    words = [(-1 - i if w is None else w) for i, w in enumerate(enc.word_ids())]  # added tokens: own word
    if words[k - 1] == words[k] or words[k - 1] == words[0] or words[k] == words[-1]:
        # not a pre-token boundary, or a pre-token next to c runs out of the window (its global
        # extent, and so its BPE merges, are unknown here)
        return False
    left, _ = _call(tokenizer, text[lo:c], False)
    right, _ = _call(tokenizer, text[c:hi], False)
    return len(left) == k and np.array_equal(left, ids[:k]) and np.array_equal(right, ids[k:])


def _candidates(text: str, start: int, target: int, end: int):
    """Cut positions after ``target`` (and before ``end``), best first: after a newline, then
    after a space, then any position (text without either, e.g. CJK), nearest first."""
    for sep in ("\n", " ", ""):
        at = target
        for _ in range(8):  # a few of each kind before widening the piece
            at = text.find(sep, at + (not sep), end)
            if at < 0:
                break
            at += len(sep)
            if at > start:
                yield at


def cut_points(tokenizer, text: str, piece: int = PIECE_CHARS, window: int = WINDOW) -> list[int]:
    """Verified cut positions ``0 < c1 < c2 < ... < len(text)`` splitting ``text`` into pieces
    of about ``piece`` characters (module doc for the rule)."""
    cuts, start = [], 0
    while len(text) - start > piece + window:
        target = start + piece
        found = None
        while found is None and target < len(text) - window:
            for c in _candidates(text, start, target, min(len(text) - 1, target + piece)):
                if _cut_ok(tokenizer, text, c, window):
                    found = c
                    break
            target += piece  # nothing verified here: grow the piece
        if found is None:
            break
        cuts.append(found)
        start = found
    return cuts


def tokenize_text(tokenizer, text: str, offsets: bool, *, min_chars: int = MIN_CHARS, piece: int = PIECE_CHARS,
                  window: int = WINDOW) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """``tokenizer(text, add_special_tokens=False)`` as (ids int64 [L], offsets int64 [L, 2] or
    None), equal to the single call, with peak memory bounded by ``piece`` characters' output
    plus the result arrays once ``len(text) >= min_chars``."""
    if len(text) < min_chars:
        return _call(tokenizer, text, offsets)
    # the window must hold any added token that could span a cut whole
    window = max(window, 2 * max(map(len, tokenizer.get_added_vocab()), default=0))
    bounds = [0, *cut_points(tokenizer, text, piece, window), len(text)]
    ids_parts, off_parts = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        ids, off = _call(tokenizer, text[a:b], offsets)
        ids_parts.append(ids)
        if offsets:
            off_parts.append(off + a)
    ids = np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0]
    if not offsets:
        return ids, None
    return ids, (np.concatenate(off_parts) if len(off_parts) > 1 else off_parts[0])


# ---- where a tokenizer's text splits: at its added (special or not) tokens --------------------
# tokenizer -> (its length, its added tokens). Weak keys: a dict keyed by id() that held the
# tokenizer kept every tokenizer used once alive after its processor was dropped.
_ADDED: "weakref.WeakKeyDictionary[Any, tuple[int, tuple[str, ...]]]" = weakref.WeakKeyDictionary()
_ADDED_IDS: "weakref.WeakKeyDictionary[Any, tuple[Any, frozenset]]" = weakref.WeakKeyDictionary()  # `added_token_ids`


def added_tokens(tok) -> tuple[str, ...]:
    """The tokenizer's added (special) token strings: tokenization never crosses them (cached per
    tokenizer object while it lives and its length is unchanged: ``add_tokens`` refreshes it)."""
    size = len(tok)
    try:
        hit = _ADDED.get(tok)
    except TypeError:  # not a weakref-able key: read every time
        return tuple(tok.get_added_vocab())
    if hit is None or hit[0] != size:
        hit = _ADDED[tok] = (size, tuple(tok.get_added_vocab()))
    return hit[1]


def added_token_ids(tok) -> frozenset:
    """The ids of the tokenizer's added (special or not) tokens, ``added_tokens_decoder``'s keys
    (empty without one); cached as `added_tokens` is (a fast tokenizer builds that dict anew on
    every access)."""
    size = len(tok) if hasattr(tok, "__len__") else None
    try:
        hit = _ADDED_IDS.get(tok)
    except TypeError:  # not a weakref-able key: read every time
        return frozenset(int(i) for i in getattr(tok, "added_tokens_decoder", {}))
    if hit is None or hit[0] != size:
        hit = _ADDED_IDS[tok] = (size, frozenset(int(i) for i in getattr(tok, "added_tokens_decoder", {})))
    return hit[1]


def text_run_start(ids: np.ndarray, end: int, floor: int, tokenizer) -> int:
    """The first index of the run of text ids (int [L]) before ``end``: back to one of
    ``tokenizer``'s added tokens (special or not), where its text splits, or to ``floor``."""
    boundaries = added_token_ids(tokenizer)
    j = end
    while j > floor and int(ids[j - 1]) not in boundaries:
        j -= 1
    return j
