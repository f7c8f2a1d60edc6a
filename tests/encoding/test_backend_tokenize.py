"""The batched layout path's tokenizer call (`mmpipe.encoding.backend_tokenize`): ids and, for
labels, offsets equal to the tokenizer's own call, the offsets from the tokens' byte lengths
where that is exact and from the tokenizer's offset tracking everywhere else."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding import backend_tokenize, mapping
from mmpipe.encoding.backend_tokenize import _ByteTable, backend_encode

pytest.importorskip("transformers.tokenization_utils_tokenizers")  # the backend path is transformers 5's

TEXTS = [
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi  \n\n there<|im_end|>\n",
    "caf\u00e9 \u4f60\u597d\t\t x", "", "   ", "\n", "<|image_pad|><|image_pad|>   \n",
    "emoji \U0001f600\U0001f44d\U0001f3fd and a flag \U0001f1e9\U0001f1ea, then 12345 67.89",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",
    "mixed\u00e9\u4e2d<|im_end|>\u6587\r\nline\u2028sep \u00a0nbsp",
    "<|im_start|>assistant\n\u7b54\u6848\u662f 42\u3002<|im_end|>",
]


def _random_texts(n: int, seed: int = 0) -> list:
    """Texts drawn from ASCII, Latin-1, CJK, 4-byte emoji, whitespace and the chat tokens."""
    rng = np.random.default_rng(seed)
    pool = (list("abcdefghij XYZ012.,!?'\"-_/\\") + ["  ", "\n", "\n\n", "\t", "\u00e9", "\u00fc", "\u00df",
            "\u4e2d", "\u6587", "\u3002", "\u0416", "\U0001f600", "\U0001f680", "\u2764\ufe0f", "<|im_start|>",
            "<|im_end|>", "<|image_pad|>", "assistant\n"])
    return ["".join(rng.choice(pool, size=int(rng.integers(0, 60)))) for _ in range(n)]


def _offsets_of_the_call(tok, texts: list) -> tuple:
    call = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    return call["input_ids"], [[tuple(p) for p in o] for o in call["offset_mapping"]]


def _fresh(tok):
    """A copy of ``tok`` with its own backend (no byte table cached or checked yet)."""
    return copy.deepcopy(tok)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "glm4v"])
def test_byte_offsets_equal_the_tokenizer_call(family, monkeypatch):
    tok = _fresh(testing.build_processor(family).tokenizer)
    texts = TEXTS + _random_texts(300)
    ids, offsets = backend_encode(tok, texts, True)
    want_ids, want = _offsets_of_the_call(tok, texts)
    assert ids == want_ids
    assert [[tuple(p) for p in o.tolist()] for o in offsets] == want
    table = _ByteTable.of(tok.backend_tokenizer)
    assert table is not None and table.checked == {"ascii", "other"}  # the shortcut ran, checked on both
    # a later batch is not checked again: the offsets are the byte sums alone
    more = _random_texts(200, seed=1)
    tracked = []
    real = backend_tokenize.offset_array
    monkeypatch.setattr(backend_tokenize, "offset_array", lambda o: tracked.append(1) or real(o))
    got = backend_encode(tok, more, True)[1]
    assert not tracked
    assert [[tuple(p) for p in o.tolist()] for o in got] == _offsets_of_the_call(tok, more)[1]


def test_text_the_normalizer_changes_takes_the_tracked_offsets():
    """A text NFC would change (a combining accent) is tokenized normalised: its offsets are the
    tokenizer's tracked ones, the others' the byte sums."""
    tok = _fresh(testing.build_processor("qwen2_vl").tokenizer)
    texts = ["cafe\u0301 ok", "plain", "\u00e9t\u00e9"]
    ids, offsets = backend_encode(tok, texts, True)
    want_ids, want = _offsets_of_the_call(tok, texts)
    assert ids == want_ids and [[tuple(p) for p in o.tolist()] for o in offsets] == want


def test_backends_that_move_characters_keep_offset_tracking():
    """An added token that strips whitespace, or a post-processor that trims offsets: no byte
    table, the tracked offsets (equal to the call's)."""
    from tokenizers import AddedToken, processors

    strip = _fresh(testing.build_processor("qwen2_vl").tokenizer)
    strip.add_tokens([AddedToken("<mark>", lstrip=True, rstrip=True)])
    trim = _fresh(testing.build_processor("qwen2_vl").tokenizer)
    trim.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    texts = ["a  <mark>  b", " x y  ", "\u4e2d <mark>"]
    for tok in (strip, trim):
        assert _ByteTable.of(tok.backend_tokenizer) is None
        ids, offsets = backend_encode(tok, texts, True)
        want_ids, want = _offsets_of_the_call(tok, texts)
        assert ids == want_ids and [[tuple(p) for p in o.tolist()] for o in offsets] == want


def test_a_table_that_disagrees_is_dropped_at_its_first_check():
    """The first batch is also tokenized with offset tracking: a table whose sums still match
    the text but whose offsets differ (two tokens' lengths traded) is caught there, the call's
    offsets returned and the table never used again for that backend."""
    tok = _fresh(testing.build_processor("qwen2_vl").tokenizer)
    backend = tok.backend_tokenizer
    text = "hello world, hello again"
    first, second = backend.encode(text, add_special_tokens=False).ids[:2]
    table = _ByteTable.of(backend)
    table.lengths = table.lengths.copy()
    table.lengths[first] += 1
    table.lengths[second] -= 1
    assert table.rows([text], [backend.encode(text, add_special_tokens=False).ids], [True])[0] is not None  # sums agree
    _, offsets = backend_encode(tok, [text], True)
    assert [tuple(p) for p in offsets[0].tolist()] == _offsets_of_the_call(tok, [text])[1][0]
    assert _ByteTable.of(backend) is None


def test_layout_batch_labels_with_byte_offsets_equal_the_per_row_path(monkeypatch):
    """Labels of non-ASCII replies through the batched layout path (byte offsets) equal the
    per-row path's (the tokenizer's own offsets)."""
    proc = testing.build_processor("qwen2_vl")
    from PIL import Image

    def png(w: int) -> dict:
        buf = io.BytesIO()
        Image.new("RGB", (w, 32), (10, 200, 30)).save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    pairs = [("\u4f60\u597d?", "\u7b54\u6848 \U0001f600 42"), ("caf\u00e9", " \u00e9t\u00e9\n"),
             ("plain", "ascii reply"), ("cafe\u0301", "e\u0301 combining")]
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
                          {"role": "assistant", "content": a}], "images": [png(40 + 8 * i)]}
            for i, (q, a) in enumerate(pairs)]
    batch = {k: [r[k] for r in rows] for k in rows[0]}
    calls = []
    real = backend_tokenize._ByteTable.offsets
    monkeypatch.setattr(backend_tokenize._ByteTable, "offsets",
                        lambda self, *a: calls.append(1) or real(self, *a))
    fast = mmpipe.encode(batch, processor=proc, pixels="none")
    assert calls, "the batched path did not use the byte offsets"
    monkeypatch.setattr(mapping, "takes_layout_batch", lambda enc: False)
    slow = mmpipe.encode(batch, processor=proc, pixels="none")
    for k in slow:
        assert [np.asarray(x).tolist() for x in fast[k]] == [np.asarray(x).tolist() for x in slow[k]], k
    assert all((np.asarray(lab) != -100).any() for lab in fast["labels"])


def test_tokens_added_after_the_first_batch_build_a_new_table():
    """A tokenizer that gains tokens after its first batch gets a table that knows them (a
    stripping one: offset tracking again)."""
    from tokenizers import AddedToken

    tok = _fresh(testing.build_processor("qwen2_vl").tokenizer)
    texts = ["a <new> b \u4e2d", "x<new>y"]
    backend_encode(tok, texts, True)
    assert _ByteTable.of(tok.backend_tokenizer) is not None
    tok.add_tokens(["<new>"])
    ids, offsets = backend_encode(tok, texts, True)
    want_ids, want = _offsets_of_the_call(tok, texts)
    assert ids == want_ids and [[tuple(p) for p in o.tolist()] for o in offsets] == want
    assert _ByteTable.of(tok.backend_tokenizer) is not None
    tok.add_tokens([AddedToken("<strip>", lstrip=True)])
    assert _ByteTable.of(tok.backend_tokenizer) is None
