"""Hunt: the views on user text (characters split over byte-level tokens, HTML escaping)."""

from __future__ import annotations

import html as htmllib
import re

import numpy as np

import mmpipe
from mmpipe import testing, view
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import CONTINUED, TokenText

TEXT = "שלום 🙂 日本語 <script>x</script> & &amp;"


def _row(proc):
    raw = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": TEXT}]}
    return MultiModalInputs.from_dict(mmpipe.encode(raw, processor=proc))


def test_characters_split_over_tokens_are_shown_whole():
    # before: each byte-level token decoded alone -> 'שלום 🙂' shown as '��������'
    proc = testing.build_processor("qwen2_vl")
    row = _row(proc)
    text = view.describe(row, tokenizer=proc, max_tokens=None)
    assert TEXT in text and "\ufffd" not in text
    page = view.row_html(row, tokenizer=proc, max_tokens=None)
    chips = [htmllib.unescape(c) for c in re.findall(r'<span class="mmpipe-tok[^"]*" title="[^"]*">([^<]*)</span>', page)]
    assert "\ufffd" not in "".join(chips)
    assert TEXT in "".join(c for c in chips if c != CONTINUED)
    assert "<script>" not in page  # user text escaped (the chips above unescape to it)


def test_split_chars_keeps_a_cut_character_as_is():
    proc = testing.build_processor("qwen2_vl")
    tok = proc.tokenizer
    ids = np.asarray(tok("🙂", add_special_tokens=False)["input_ids"])
    toks = TokenText(proc)
    assert len(ids) > 1 and toks.split_chars(ids)[0] == "🙂"
    assert toks.split_chars(ids[:-1]) == {}  # a row cut inside the character: the tokens' own text
