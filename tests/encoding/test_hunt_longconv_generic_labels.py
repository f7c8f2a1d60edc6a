"""Long conversations with images scattered over the user turns on the generic path (a processor's
own chat template and call): every reply labelled as its text and end-of-turn token, nothing else
(no user text, not the newline after), however many images the row holds and wherever they sit;
the processor calls for a row do not grow with its turns (counted, not timed).

PaliGemma's processor puts ``<bos>`` after the row's LAST image and appends ``"\\n"`` to the text:
a conversation prefix's call (how replies were located in a row with images) then differs from
the row after the prefix's own last image, and the common prefix stopped inside a user turn."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing

from conftest import processor_for

IGNORE = mmpipe.IGNORE_INDEX


def _row(turns: int, every: int) -> tuple[dict, list]:
    """``turns`` user/assistant pairs, an image in every ``every``-th user turn; (row, replies)."""
    msgs, images, replies = [{"role": "system", "content": "Be brief."}], [], []
    for i in range(turns):
        parts = [{"type": "image"}] if i % every == 0 else []
        if parts:
            images.append(Image.new("RGB", (32 + 8 * (i % 3), 32), (i % 255, 3, 4)))
        msgs.append({"role": "user", "content": parts + [{"type": "text", "text": f"question {i} " + "w" * (i % 3)}]})
        replies.append(f"ANS{i}" + " z" * (i % 3))
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": replies[-1]}]})
    return {"messages": msgs, "images": images}, replies


def _labelled_runs(row, tok) -> list:
    """The decoded text of each run of labelled tokens, in order."""
    on = np.r_[False, row.labels != IGNORE, False].astype(np.int8)
    starts, ends = np.flatnonzero(np.diff(on) == 1), np.flatnonzero(np.diff(on) == -1)
    return [tok.decode(row.input_ids[a:b].tolist()) for a, b in zip(starts, ends)]


@pytest.mark.parametrize("family", ["paligemma", "llava", "mllama", "llava_onevision1_5", "ovis2_5", "idefics3",
                                    "minicpmv4_6"])
@pytest.mark.parametrize("turns,every", [(6, 2), (5, 1), (60, 7)])
def test_every_reply_labelled_as_its_text_and_end_of_turn(family, turns, every):
    proc = processor_for(family)
    raw, replies = _row(turns, every)
    row = mmpipe.encode_row(raw, proc)
    assert row.num_images == len(raw["images"])
    runs = _labelled_runs(row, proc.tokenizer)
    # failed before the fix on PaliGemma with 2+ images (user text such as "q" labelled, replies
    # before the last image unlabelled) and with one image (the newline after the last reply labelled)
    assert runs == [r + "<|im_end|>" for r in replies], runs[:4]


def test_minicpm_processor_calls_do_not_grow_with_the_turns(monkeypatch):
    """MiniCPM-V writes ``<image_id>0</image_id>`` (a text token) into each image's tokens: its rows'
    replies were located with one processor call on a growing conversation prefix per reply
    edge (quadratic: 362 calls, 2.9 s for 200 turns here; 42 for 25). Now one call a row, as a
    text row; the labels are the per-prefix way's."""
    import mmpipe.encoding.call_labels as cl
    import mmpipe.media.processor_encode as pe

    enc = mmpipe.Encoder(processor_for("minicpmv4_6"))
    enc.encode_row(_row(1, 1)[0])  # the layout probe and the template probes
    real, calls = pe.run_processor, []
    monkeypatch.setattr(pe, "run_processor", lambda *a, **k: calls.append(1) or real(*a, **k))
    counts = {}
    for turns in (3, 120):
        calls.clear()
        row = enc.encode_row(_row(turns, 20)[0])
        counts[turns] = len(calls)
    assert counts[120] == counts[3] == 1, counts  # failed before: 202 calls for 120 turns
    monkeypatch.setattr(cl, "_aligned_labels", lambda *a, **k: None)  # the per-prefix way
    np.testing.assert_array_equal(enc.encode_row(_row(120, 20)[0]).labels, row.labels)
