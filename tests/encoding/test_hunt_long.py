"""Very long conversations and max_length: what users bring (hundreds of turns, tens of
thousands of tokens, many images, a token budget).

- a 300-turn conversation: every reply labelled exactly as transformers'
  ``return_assistant_tokens_mask`` labels it, with a fixed number of template renders;
- a row over ``max_length`` is dropped / skipped and counted alike on every route
  (``Encoder.encode_one``, a batched ``datasets.map`` of ``mmpipe.encode`` with full and
  layout-only pixels, ``encode_dataset``, ``encode_stream``); ``truncate_text`` never keeps a row
  whose images lie past the cut;
- a long row with images late in it and a 64-image conversation: positions and rope_delta equal
  transformers' ``get_rope_index``.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.data.streaming import encode_stream
from mmpipe.encoding.encoder import Encoder
from mmpipe.offline.chat_templates import chat_template
from mmpipe.testing.invariants import assert_row_positions

from conftest import model_for, processor_for

IMG = Image.new("RGB", (56, 56), (10, 200, 30))
IMG2 = Image.new("RGB", (56, 112), (200, 0, 30))


def _conv(turns: int, image_turns=()) -> list:
    msgs = []
    for t in range(turns):
        content = [{"type": "image"}] if t in image_turns else []
        msgs.append({"role": "user", "content": content + [{"type": "text", "text": f"question {t} " + "x" * (t % 7)}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {t}" + " y" * (t % 5)}]})
    return msgs


def test_300_turns_labels_match_transformers_with_fixed_renders():
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    msgs = _conv(300)
    calls = []
    enc = Encoder(proc)
    render = enc.render
    enc.render = lambda *a, **k: calls.append(1) or render(*a, **k)
    row = mmpipe.Encoder.encode_row(enc, {"messages": msgs})
    short = Encoder(proc)
    render_s = short.render
    short_calls = []
    short.render = lambda *a, **k: short_calls.append(1) or render_s(*a, **k)
    Encoder.encode_row(short, {"messages": _conv(3)})
    assert len(calls) == len(short_calls)  # renders do not grow with the turns
    ref = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                  chat_template=chat_template("qwen2_vl", generation=True))
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"])
    np.testing.assert_array_equal(row.labels != -100, np.asarray(ref["assistant_masks"], bool))
    assert row.num_tokens > 8000


ROWS = [
    {"messages": _conv(1), "images": []},
    {"messages": _conv(200), "images": []},
    {"messages": _conv(200, image_turns=(0,)), "images": [IMG]},
    {"messages": _conv(200, image_turns=(190,)), "images": [IMG]},  # its image lies past any cut
    {"messages": _conv(64, image_turns=set(range(64))), "images": [IMG] * 64},
]
CAP = 300


@pytest.mark.parametrize("truncation, kept, lengths", [("drop", 1, [43]), ("truncate_text", 3, [43, CAP, CAP])])
def test_over_length_rows_are_counted_alike_on_every_route(truncation, kept, lengths):
    proc = processor_for("qwen2_vl")
    kw = dict(max_length=CAP, truncation=truncation, on_error="skip")
    for pixels in ("uint8", "none"):
        enc = Encoder(proc, pixels=pixels, **kw)
        one = [enc.encode_one(r, i) for i, r in enumerate(ROWS)]
        assert [len(o["input_ids"]) for o in one if o is not None and not o.get("mmpipe_error")] == lengths
        assert enc.stats.encoded == kept and sum(enc.stats.dropped.values()) + sum(enc.stats.failed.values()) == 5 - kept
        out, report = mmpipe.encode_dataset(datasets.Dataset.from_list(ROWS), proc, pixels=pixels, **kw)
        assert [len(x) for x in out["input_ids"]] == lengths, pixels
        assert f"encoded {kept} of 5 rows" in str(report)
    errors = []
    stream = encode_stream(datasets.Dataset.from_list(ROWS).to_iterable_dataset(), proc, batch_size=8,
                           errors=errors, pixels="none", **kw)
    assert [len(x["input_ids"]) for x in stream] == lengths
    assert len(errors) == (0 if truncation == "drop" else 2)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_long_row_with_late_images_positions_match_transformers(family):
    proc, model = processor_for(family), model_for(family)
    msgs, images = _conv(120, image_turns=(100, 110, 119)), [IMG, IMG2, IMG]
    for pixels in ("uint8", "none"):
        row = mmpipe.encode_row({"messages": msgs, "images": images}, proc, pixels=pixels)
        assert_row_positions(row, model=model)
        cut = mmpipe.encode_row({"messages": msgs, "images": images}, proc, pixels=pixels,
                                max_length=row.num_tokens - 5, truncation="truncate_text")
        assert_row_positions(cut, model=model)
        assert cut.rope_delta == row.rope_delta and len(cut.image_grid_thw) == 3
    many = mmpipe.encode_row({"messages": _conv(64, image_turns=set(range(64))), "images": [IMG, IMG2] * 32}, proc)
    assert len(many.image_grid_thw) == 64
    assert_row_positions(many, model=model)
