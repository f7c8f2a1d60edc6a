"""Cost in the size of the data, counted (never timed): the generic path's labels of a long
conversation about one image (`mmpipe.encoding.call_labels`)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
import mmpipe.encoding.call_labels as call_labels_module
from mmpipe.offline import tiny_image

from conftest import processor_for


def _conversation(turns: int) -> dict:
    """One image in the first user turn, then ``turns`` question/answer pairs of text."""
    messages = []
    for i in range(turns):
        content = [{"type": "text", "text": f"question {i}: what else is there?"}]
        messages.append({"role": "user", "content": ([{"type": "image"}] if i == 0 else []) + content})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}, a small thing."}]})
    return {"messages": messages, "images": [tiny_image(40, 56)]}


def _tokenized_chars(monkeypatch, processor, row) -> tuple[int, mmpipe.MultiModalInputs]:
    """Characters the processor's tokenizer is called on while ``row`` is encoded, and the row."""
    tokenizer_class, seen = type(processor.tokenizer), [0]
    original = tokenizer_class.__call__

    def counting(self, text=None, *args, **kwargs):
        seen[0] += len(text) if isinstance(text, str) else sum(len(t) for t in text or () if isinstance(t, str))
        return original(self, text, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(tokenizer_class, "__call__", counting)
        row = mmpipe.encode_row(row, processor)
    return seen[0], row


@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_labels_after_the_last_image_tokenize_linear_in_the_turns(monkeypatch, family):
    """Each reply after a row's last image was located by tokenizing the whole rest of the
    conversation from each of its edges: characters tokenized quadratic in the turns (a 256-turn
    row: 3 s, 97% of its encode, LLaVA). Now the text between two edges is tokenized once. 4x the
    turns tokenized 13.7x (LLaVA) / 11.2x (Idefics3) the characters before, 2.9x / 2.1x now."""
    processor = processor_for(family)
    small, _ = _tokenized_chars(monkeypatch, processor, _conversation(8))
    large, row = _tokenized_chars(monkeypatch, processor, _conversation(32))
    assert large < 6 * small, (small, large)
    assert (row.labels != -100).any()


def test_tail_cuts_agree_with_each_rest_tokenized_alone(monkeypatch):
    """Guard: the labels are those of each edge's whole rest tokenized alone (`suffix_cut`)."""
    processor = processor_for("llava")
    row = _conversation(6)
    row["messages"][5]["content"][0]["text"] = "  spaced\n\n reply "
    fast = mmpipe.encode_row(row, processor)

    def each_alone(enc, ids, full, prefixes):
        return {p: call_labels_module.suffix_cut(enc, ids, full, p) for p in prefixes}

    monkeypatch.setattr(call_labels_module, "tail_cuts", each_alone)
    slow = mmpipe.encode_row(row, processor)
    np.testing.assert_array_equal(fast.labels, slow.labels)
    assert (fast.labels != -100).sum() > 6
