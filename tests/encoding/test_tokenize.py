"""Long texts are tokenized in verified pieces (mmpipe/encoding/tokenize.py, issue 15.4): the
pieces' ids and offsets equal one tokenizer call on the whole text. Pieces and windows are made
tiny here (a cut every ~40 characters, checked in a window of 8-24) so that the cut rule meets
every hard case many times per text: special tokens, whitespace runs the learned merges join,
newline runs, multi-byte and combining characters (NFC), CJK without spaces, digits, code."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mmpipe.encoding.tokenize import _call, cut_points, tokenize_text
from mmpipe.offline import build_tokenizer

PIECES = [
    "hello", "world", " ", "  ", "   ", "\n", "\n\n", "\n  \n", "\t", "<|im_start|>", "<|im_end|>",
    "<|image_pad|>", "<|vision_start|>", "e\u0301", "\u0301", "caf\u00e9", "日本語の文章", "中文没有空格",
    "😀", "👩‍💻", "123", "4567", "x=f(y);", "{\"a\": [1, 2]}", "'s", "'ll", "\r\n", "\u200f", "ß", "ﬁ",
    "\u00a0", "...", "--", "A", "THE", "ing",
]


@pytest.fixture(scope="module", params=["qwen-like", "default"])
def tok(request):
    return build_tokenizer("qwen2_vl", merges=request.param)


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(n))


def _check(tok, text: str, piece: int, window: int) -> list[int]:
    """Pieces == one call; returns the cuts made (with the window tokenize_text widens to)."""
    whole_ids, whole_off = _call(tok, text, True)
    ids, off = tokenize_text(tok, text, True, min_chars=0, piece=piece, window=window)
    assert np.array_equal(ids, whole_ids)
    assert np.array_equal(off, whole_off)
    ids2, none = tokenize_text(tok, text, False, min_chars=0, piece=piece, window=window)
    assert none is None and np.array_equal(ids2, whole_ids)
    return cut_points(tok, text, piece, max(window, 2 * max(map(len, tok.get_added_vocab()))))


@pytest.mark.parametrize("seed", range(12))
def test_pieces_equal_one_call_on_adversarial_text(tok, seed):
    rng = random.Random(seed)
    text = _random_text(rng, 600)
    cuts = _check(tok, text, piece=rng.choice([24, 40, 64]), window=rng.choice([8, 16, 24]))
    assert len(cuts) >= 5  # the rule did cut: the comparison is not vacuous


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=0, max_size=120), st.integers(8, 48), st.integers(4, 24))
def test_pieces_equal_one_call_property(parts, piece, window):
    tok = build_tokenizer("qwen2_vl", merges="qwen-like")
    _check(tok, "".join(parts), piece, window)


def test_text_without_safe_cuts_is_one_call(tok):
    """One long whitespace run (a single pre-token) or one CJK run offers no verified cut: the
    text is tokenized whole, never split inside a pre-token."""
    for text in (" " * 3000, "中" * 3000, "a" * 3000):
        _check(tok, text, piece=64, window=16)


def test_short_text_takes_the_single_call(tok):
    text = "hello world\n" * 10
    assert cut_points(tok, text, 24, 16)  # it could be cut ...
    ids, off = tokenize_text(tok, text, True)  # ... but under MIN_CHARS it is not
    whole = _call(tok, text, True)
    assert np.array_equal(ids, whole[0]) and np.array_equal(off, whole[1])
