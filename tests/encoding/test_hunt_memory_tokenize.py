"""Memory over a long run (hunt): `added_tokens` caches per tokenizer without keeping it. Its
cache was a module dict keyed by id() holding the tokenizer: every tokenizer a multi-turn loop
used stayed alive after its processor was dropped (a notebook or a sweep loading checkpoint
after checkpoint kept each vocabulary). Also the cached list follows ``add_tokens``."""

from __future__ import annotations

import gc
import weakref

from mmpipe import testing
from mmpipe.encoding.tokenize import added_tokens


def test_a_dropped_tokenizer_is_not_kept():
    tok = testing.build_processor("qwen2_vl").tokenizer
    assert "<|im_end|>" in added_tokens(tok)
    ref = weakref.ref(tok)
    del tok
    gc.collect()
    assert ref() is None  # was alive: held by the cache for the life of the process


def test_tokens_added_later_are_seen():
    tok = testing.build_processor("qwen2_vl").tokenizer
    assert "<|mytool|>" not in added_tokens(tok)
    tok.add_tokens(["<|mytool|>"], special_tokens=True)
    assert "<|mytool|>" in added_tokens(tok)  # was the list cached before add_tokens
