"""Cost in the size of the data, counted (never timed): the generic path's labels of a long
conversation about one image (`mmpipe.encoding.call_labels`)."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
import mmpipe.encoding.call_labels as call_labels_module
from mmpipe.offline import tiny_image

from conftest import processor_for


def _conversation(turns: int, image_every_turn: bool = False) -> dict:
    """``turns`` question/answer pairs of text, an image in the first question (in every one)."""
    messages = []
    for i in range(turns):
        content = [{"type": "text", "text": f"question {i}: what else is there?"}]
        image = i == 0 or image_every_turn
        messages.append({"role": "user", "content": ([{"type": "image"}] if image else []) + content})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}, a small thing."}]})
    return {"messages": messages, "images": [tiny_image(40 + i % 3, 56) for i in range(turns if image_every_turn else 1)]}


def _counted_encode(monkeypatch, cls, param: str, measure, processor, row) -> tuple[int, mmpipe.MultiModalInputs]:
    """The sum of ``measure`` over the argument ``param`` (first positional, or by name) of every
    ``cls.__call__`` while ``row`` is encoded, and the row."""
    original, seen = cls.__call__, [0]

    def counting(self, *args, **kwargs):
        seen[0] += measure(args[0] if args else kwargs.get(param))
        return original(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(cls, "__call__", counting)
        row = mmpipe.encode_row(row, processor)
    return seen[0], row


def _chars(text) -> int:  # a string, or a list of them
    return len(text) if isinstance(text, str) else sum(len(t) for t in text or () if isinstance(t, str))


def _images(images) -> int:  # a list of images, or one list of them per text (Idefics3)
    return sum(_images(x) for x in images) if isinstance(images, (list, tuple)) else 1


def _tokenized_chars(monkeypatch, processor, row) -> tuple[int, mmpipe.MultiModalInputs]:
    """Characters the processor's tokenizer is called on while ``row`` is encoded, and the row."""
    return _counted_encode(monkeypatch, type(processor.tokenizer), "text", _chars, processor, row)


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


def _images_processed(monkeypatch, processor, row) -> tuple[int, mmpipe.MultiModalInputs]:
    """Images the processor's image processor is called on while ``row`` is encoded, and the row."""
    return _counted_encode(monkeypatch, type(processor.image_processor), "images", _images, processor, row)


@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_labels_of_a_conversation_with_an_image_every_turn_process_each_image_once(monkeypatch, family):
    """Each reply with an image after it was located by the processor's call on the conversation
    up to each of its two edges, every earlier image in it: images processed quadratic in the turns
    (64 turns with one image each: 4.2 s a row, Idefics3). Now the text between two edges is
    called with its own images only. 4x the turns processed 10.2x the images before, 2.4x now."""
    processor = processor_for(family)
    small, _ = _images_processed(monkeypatch, processor, _conversation(4, image_every_turn=True))
    large, row = _images_processed(monkeypatch, processor, _conversation(16, image_every_turn=True))
    assert large < 6 * small, (small, large)
    assert row.num_images == 16 and (row.labels != -100).any()


@pytest.mark.parametrize("family", ["llava", "idefics3"])
@pytest.mark.parametrize("image_every_turn", [False, True])
def test_tail_cuts_agree_with_each_edge_found_alone(monkeypatch, family, image_every_turn):
    """Guard: the labels are those of each edge found on its own: its whole rest tokenized alone
    where no image follows (`suffix_cut`), else the processor's call on the conversation up to it."""
    processor = processor_for(family)
    row = _conversation(5, image_every_turn)
    row["messages"][5]["content"][0]["text"] = "  spaced\n\n reply "
    fast = mmpipe.encode_row(row, processor)
    n_images = len(row["images"])

    def each_alone(enc, ids, full, edges, media=((), ()), segment_ids_of=None):
        return {p: call_labels_module.suffix_cut(enc, ids, full, p) if held == (n_images, 0) else None
                for p, held in edges}

    monkeypatch.setattr(call_labels_module, "tail_cuts", each_alone)
    slow = mmpipe.encode_row(row, processor)
    np.testing.assert_array_equal(fast.labels, slow.labels)
    assert (fast.labels != -100).sum() > 10
