"""Long conversations with images scattered over the user turns on the generic path (a processor's
own chat template and call): every reply labelled as its text and end-of-turn token, nothing else
(no user text, not the newline after), however many images the row holds and wherever they sit.

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


@pytest.mark.parametrize("family", ["paligemma", "llava", "mllama", "llava_onevision1_5", "ovis2_5", "idefics3"])
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
