"""Memory of a long multi-turn loop (hunt): each append to a conversation copied every earlier
turn's pixels again (``np.concatenate([old, new])`` in `multiturn._extend`), so a VRAG-style
loop of N turns with an image each copied O(N^2) pixel bytes. The pixels now grow in place
(`mmpipe.rollout.turn_buffer.grow`). Counted, not timed: the bytes the rows of all turns hold
(tracemalloc), which is every copy made when each turn's row is kept."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.rollout.multiturn import append_observation, append_response, start

from conftest import processor_for

TURNS = 40


def _img(i: int) -> Image.Image:
    rng = np.random.default_rng(i)
    return Image.fromarray(rng.integers(0, 255, (112 + 28 * (i % 2), 112, 3), np.uint8))


def _reply(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]


def _prompt():
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
            "images": [_img(0)]}


@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_turn_pixels_are_not_copied_again_each_turn(pixels):
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    name = "pixel_values_u8" if pixels == "uint8" else "pixel_values"
    conv = start(_prompt(), proc, pixels=pixels)
    rows = []
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(TURNS):
            conv = append_response(conv, _reply(tok, f"look {i}"))
            conv = append_observation(conv, [{"type": "image"}, {"type": "text", "text": f"page {i}"}],
                                      images=[_img(i + 1)])
            rows.append(conv.row)  # every turn's row kept: what the appends copied stays counted
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    final = getattr(conv.row, name).nbytes
    # old code: turn k's row held its own copy of k images' pixels, sum ~ TURNS/2 * final (measured
    # 22x uint8, 21x float32); growing in place: the last store (1.5x the pixels) plus the earlier,
    # smaller ones the earlier rows keep (< 4.5x), and the rows' token arrays (measured 5.3x, 4.1x)
    assert held < 8 * final, f"the {TURNS} turns' rows hold {held} bytes for {final} bytes of pixels"
    # and each kept row still holds exactly its own turns' pixels
    assert getattr(rows[-1], name).shape[0] == int(conv.row.image_grid_thw.prod(1).sum())
    for a, b in zip(rows, rows[1:]):
        pa, pb = getattr(a, name), getattr(b, name)
        assert pa.shape[0] == int(a.image_grid_thw.prod(1).sum())
        assert np.array_equal(pb[: len(pa)], pa)


def test_grown_pixels_equal_encoding_the_whole_conversation_and_branches_stay_apart():
    """Guard: appends after growing in place, and two observations appended to ONE conversation
    (a branch: the second must not write over the first's pixels), equal encode_row."""
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    conv = start(_prompt(), proc)
    msgs, imgs = list(_prompt()["messages"]), list(_prompt()["images"])
    for i in range(6):
        conv = append_response(conv, _reply(tok, f"look {i}"))
        msgs.append({"role": "assistant", "content": f"look {i}"})
        obs = [{"type": "image"}] * (i % 3) + [{"type": "text", "text": f"page {i}"}]
        new = [_img(10 * i + j) for j in range(i % 3)]
        conv = append_observation(conv, obs, images=new)
        msgs.append({"role": "user", "content": obs})
        imgs += new
    conv = append_response(conv, _reply(tok, "again"))
    msgs.append({"role": "assistant", "content": "again"})
    branches = {}
    for tag in (101, 202):
        obs = [{"type": "image"}, {"type": "text", "text": f"b{tag}"}]
        branches[tag] = (append_observation(conv, obs, images=[_img(tag)]), obs)
    for tag, (b, obs) in branches.items():
        whole = mmpipe.encode_row({"messages": msgs + [{"role": "user", "content": obs}], "images": imgs + [_img(tag)]},
                                  proc, add_generation_prompt=True)
        assert np.array_equal(b.row.pixel_values_u8, whole.pixel_values_u8)
        assert np.array_equal(b.row.image_grid_thw, whole.image_grid_thw)
        assert np.array_equal(b.row.input_ids, whole.input_ids)
    done = append_response(branches[101][0], _reply(tok, "end"), done=True)
    assert done.row.pixel_values_u8.base is None  # a done conversation keeps no spare room alive
    assert np.array_equal(done.row.pixel_values_u8, branches[101][0].row.pixel_values_u8)


def test_a_batch_conversation_marked_done_keeps_no_spare_room():
    """`MultiTurnBatch.mark_done` ends a conversation as ``append_response(done=True)`` does: its
    grown pixel fields become exact-size arrays (before: the 1.5x store's spare room stayed alive
    with every conversation a batch ended early)."""
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    batch = mmpipe.rollout.MultiTurnBatch.start([_prompt(), _prompt()], proc)
    for i in range(3):
        for j in (0, 1):
            batch.append_response(j, _reply(tok, f"look {i}"))
            batch.append_observation(j, [{"type": "image"}, {"type": "text", "text": "p"}], images=[_img(i + 1)])
    before = batch.conversations[0].row.pixel_values_u8.copy()
    batch.mark_done(0, "length")
    conv = batch.conversations[0]
    pixels = conv.row.pixel_values_u8
    assert conv.done and conv.finish_reason == "length"
    assert pixels.base is None and np.array_equal(pixels, before)  # its own exact-size array, same values
    assert batch.conversations[1].row.pixel_values_u8.base is not None  # still growing
