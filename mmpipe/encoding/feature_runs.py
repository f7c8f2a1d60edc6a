"""Tokenizing a text holding long runs of one added token (an image's feature tokens: Gemma 3's
256 ``<image_soft_token>``, InternVL's ``<IMG_CONTEXT>`` runs) without writing the runs out.

Each run is written ONCE in the text given to the tokenizer, and its id repeated afterwards.
An added token is atomic, so the ids equal those of the fully written text; `collapse_is_exact`
checks that on probe texts (once per tokenizer and probe), and a tokenizer where it does not
hold keeps the fully written path.
"""

from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

__all__ = ["collapse_is_exact", "run_repeats"]

_CHECKED = weakref.WeakKeyDictionary()  # tokenizer -> {probe text: exact}


def collapse_is_exact(tokenizer, feature_id: int, token: str, text: str, runs: list) -> bool:
    """Whether tokenizing ``text`` (an image's text with each run of ``token`` written once;
    ``runs``: their lengths) then repeating ``feature_id`` gives the ids of the fully written
    text: ``text`` and ``token`` alone between varied neighbours (spaces, newlines, letters,
    none), runs of 1 and 3 against 1. True for a text without runs."""
    if not runs or text.count(token) != len(runs):
        return bool(not runs)
    try:  # once per tokenizer and probe text
        return _CHECKED.setdefault(tokenizer, {})[text]
    except KeyError:
        pass
    except TypeError:  # a tokenizer that is no weakref-able dict key: probe every time
        return _collapse_exact(tokenizer, feature_id, token, text)
    exact = _CHECKED[tokenizer][text] = _collapse_exact(tokenizer, feature_id, token, text)
    return exact


def _collapse_exact(tokenizer, feature_id: int, tok: str, text: str) -> bool:
    """``text`` and ``tok`` alone, between varied neighbours: tokenized with each ``tok`` once,
    the feature id repeated 3 times == tokenized with each ``tok`` written 3 times."""
    sides = ["", "a", " ", "\n", "\n\n", "x \n\n", ". "]
    shorts = [left + body + right for body in (text, tok) for left in sides for right in sides[::-1]]
    longs = [t.replace(tok, tok * 3) for t in shorts]
    one, three = (tokenizer(texts)["input_ids"] for texts in (shorts, longs))
    for t, a, b in zip(shorts, one, three):
        feature = np.asarray(a, np.int64) == feature_id
        if int(feature.sum()) != t.count(tok) or np.repeat(a, np.where(feature, 3, 1)).tolist() != list(b):
            return False
    return True


def run_repeats(short: np.ndarray, feature_id: int, runs: Optional[list]) -> tuple[Optional[np.ndarray], int]:
    """(how many times each id of ``short`` int64 [n] stands, int64 [n], or None for ids already
    written out; the feature tokens the written-out ids hold). ``runs``: the run lengths in
    order (None: the text was written out)."""
    at = np.flatnonzero(short == feature_id)
    if runs is None:
        return None, len(at)
    found = len(at) - len(runs) + sum(runs)  # a literal feature token in the text counts once
    if len(at) != len(runs):
        return None, found
    repeat = np.ones(len(short), np.int64)
    repeat[at] = runs
    return repeat, found
