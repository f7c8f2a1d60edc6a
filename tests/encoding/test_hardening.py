"""Issue 15 hardening of encode: each case states its outcome (error class, stage, column, row,
words of the fix - or the documented handling), in the corpus' style, through real
``datasets.map`` calls where the case is about the map.

- drop + remove_columns under a batched map (and num_proc=2): works, counts agree with encode_dataset;
- a non-string / empty message role: ParseError [parse], column messages;
- a row with both messages and prompt: ParseError [parse] (unless one is empty or repeats a turn);
- bad option values (max_length <= 0, threads < 0, ...): ArgumentError at Encoder construction;
- a list-of-strings prompt under a per-row map: ParseError [parse], column prompt (not a batch);
- a lone UTF-16 surrogate: ParseError [parse] naming the column and the character position;
- a corrupt image in a decoded datasets.Image() column under a plain map: ImageError [image].
"""

from __future__ import annotations

import io
import json

import datasets
import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.encoding import Encoder
from mmpipe.errors import ArgumentError, ImageError, ParseError

from conftest import processor_for

ROW = 7


def _png(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 56), (seed * 40 % 256, 90, 160)).save(buf, format="PNG")
    return buf.getvalue()


def _raises(cls, row, column, fix_word, stage="parse", **options):
    """Encode ``row`` at index ROW and check the error's class, stage, column, row and fix."""
    with pytest.raises(cls) as info:
        mmpipe.encode_row(row, processor_for("qwen2_vl"), idx=ROW, **options)
    e = info.value
    assert (e.stage, e.column, e.row) == (stage, column, ROW), (e.stage, e.column, e.row, str(e))
    assert fix_word in (e.fix or ""), e.fix
    return e


# ---- 1. truncation="drop" with remove_columns under a batched map ----------------------------
def _drop_dataset() -> datasets.Dataset:
    rows = [{"prompt": "hi " * (300 if i % 3 == 0 else 3), "id": i} for i in range(10)]
    return datasets.Dataset.from_list(rows)


@pytest.mark.parametrize("num_proc", [None, 2])
def test_drop_with_remove_columns_works_and_counts_agree(num_proc):
    ds = _drop_dataset()
    kw = {"processor": processor_for("qwen2_vl"), "max_length": 64, "truncation": "drop"}
    out = ds.map(mmpipe.encode, fn_kwargs=kw, batched=True, batch_size=3, remove_columns=ds.column_names,
                 num_proc=num_proc, load_from_cache_file=False)
    enc, report = mmpipe.encode_dataset(ds, kw["processor"], num_proc=num_proc, batch_size=3,
                                        max_length=64, truncation="drop")
    assert report.dropped == {"too_long": 4} and report.rows_out == 6
    assert len(out) == 6 and set(out.column_names) == set(enc.column_names)  # no input column back
    assert out["input_ids"] == enc["input_ids"]


def test_drop_keeping_input_columns_shortens_them():
    ds = _drop_dataset()
    kw = {"processor": processor_for("qwen2_vl"), "max_length": 64, "truncation": "drop"}
    out = ds.map(mmpipe.encode, fn_kwargs=kw, batched=True, batch_size=3, load_from_cache_file=False)
    assert out["id"] == [i for i in range(10) if i % 3]
    assert out.features["id"] == ds.features["id"]
    assert all(len(p) < 20 for p in out["prompt"])


# ---- 2. message roles -------------------------------------------------------------------------
@pytest.mark.parametrize("role", [None, 5, "", " "])
def test_non_string_or_empty_role_is_refused(role):
    e = _raises(ParseError, {"messages": [{"role": "user", "content": "hi"}, {"role": role, "content": "x"}]},
                "messages", "role")
    assert "message 1" in str(e) and "assistant" in str(e.expected) and repr(role) in str(e.found)


def test_tool_role_still_encodes():
    row = {"messages": [{"role": "user", "content": "weather?"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}]},
                        {"role": "tool", "content": "sunny", "name": "w"},
                        {"role": "assistant", "content": "Sunny."}]}
    r = mmpipe.encode_row(row, processor_for("qwen2_vl"), idx=ROW)
    assert len(r.input_ids) > 10


# ---- 3. both messages and prompt --------------------------------------------------------------
def test_messages_and_prompt_together_are_refused():
    row = {"messages": [{"role": "user", "content": "describe"}], "prompt": "<image> what is this?",
           "images": [{"bytes": _png(), "path": None}]}
    e = _raises(ParseError, row, "messages", "drop one")
    assert "'prompt'" in str(e)


@pytest.mark.parametrize("prompt", [None, "", [], "describe"])  # unset, empty, or repeating a turn (UltraChat)
def test_messages_with_an_empty_or_repeating_prompt_encode(prompt):
    proc = processor_for("qwen2_vl")
    row = {"messages": [{"role": "user", "content": "describe"}], "prompt": prompt}
    assert mmpipe.encode_row(row, proc).input_ids.tolist() == \
        mmpipe.encode_row({"messages": row["messages"]}, proc).input_ids.tolist()


# ---- 4. option values -------------------------------------------------------------------------
@pytest.mark.parametrize("option, value", [
    ("max_length", 0), ("max_length", -5), ("max_length", 1.5), ("max_length", True), ("max_length", "64"),
    ("threads", -1), ("threads", "2"), ("min_pixels", -1), ("max_pixels", "big"), ("max_pixels", 0),
    ("images_column", None),
    ("tools_column", ""),
])
def test_bad_option_values_are_refused_at_construction(option, value):
    with pytest.raises(ArgumentError, match=option):
        Encoder(processor_for("qwen2_vl"), truncation="truncate_text", **{option: value})


def test_good_option_values_are_accepted():
    Encoder(processor_for("qwen2_vl"), max_length=1, threads=0, min_pixels=1, max_pixels=1e6)


def test_resize_bounds_that_cross_are_refused_and_zero_is_a_bound():
    """min_pixels above max_pixels (both given, or one against the processor's other bound) gave
    images over max_pixels without a word; max_pixels=0 and min_pixels=0 were read as 'not given'
    (the processor's bounds): both are refused now (transformers 5 refuses a bound of 0;
    tests/images/test_skip_routes_pixel_bounds.py), min_pixels=1 is no lower bound."""
    from mmpipe.images.spec import smart_resize

    proc = processor_for("qwen2_vl")
    for kw in ({"min_pixels": 10**6, "max_pixels": 1000}, {"min_pixels": 10**7}, {"max_pixels": 100}):
        with pytest.raises(ArgumentError, match=r"min_pixels \d+ is more than max_pixels"):
            Encoder(proc, **kw)
    tiny = np.full((20, 30, 3), 90, np.uint8)
    enc = Encoder(proc, min_pixels=1)
    want = smart_resize(20, 30, enc.spec.factor, 1, enc.spec.max_pixels)
    grid = enc.encode_one({"prompt": "<image> hi", "images": [tiny]})["image_grid_thw"].tolist()
    assert grid == [[1, want[0] // 14, want[1] // 14]] == [[1, 2, 2]]  # was [[1, 4, 6]] (the processor's 3136)


# ---- 5. a list-of-strings prompt under a per-row map --------------------------------------------
def test_per_row_list_of_strings_prompt_is_a_parse_error_not_a_batch():
    ds = datasets.Dataset.from_list([{"prompt": "fine"}, {"prompt": "also fine"}] * 4)
    ds = ds.cast_column("prompt", datasets.Value("string"))
    bad = datasets.Dataset.from_list([{"prompt": ["a", "b", "c"]}] * 8)
    kw = {"processor": processor_for("qwen2_vl")}
    with pytest.raises(ParseError) as info:
        bad.map(mmpipe.encode, fn_kwargs=kw, with_indices=True, load_from_cache_file=False)
    e = info.value
    assert (e.stage, e.column, e.row) == ("parse", "prompt", 0) and "join the strings" in e.fix
    skipped = bad.map(mmpipe.encode, fn_kwargs={**kw, "on_error": "skip"}, with_indices=True,
                      load_from_cache_file=False)
    out, errors = mmpipe.drop_failed(skipped)
    assert len(out) == 0 and {(r["stage"], r["column"]) for r in errors} == {("parse", "prompt")}
    assert len(ds.map(mmpipe.encode, fn_kwargs=kw, batched=True, batch_size=3)) == 8  # string batches still work


# ---- 6. lone surrogates -----------------------------------------------------------------------
@pytest.mark.parametrize("row, column, where", [
    ({"prompt": "ab\ud800c"}, "prompt", "character 2"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x\udfff"}]}]}, "messages", "character 1"),
    ({"prompt": "fine", "completion": "\ud83d oops"}, "completion", "character 0"),
])
def test_lone_surrogate_is_a_parse_error(row, column, where):
    e = _raises(ParseError, row, column, "encode(")
    assert where in str(e) and "surrogate" in str(e)


# ---- 7. a corrupt image in a decoded datasets.Image() column under a plain map -----------------
def _image_dataset() -> datasets.Dataset:
    good, bad = {"bytes": _png(1), "path": None}, {"bytes": b"\x89PNG not really", "path": None}
    rows = [{"prompt": "<image><image> compare", "images": [good, bad if i == 2 else good]} for i in range(4)]
    feats = datasets.Features({"prompt": datasets.Value("string"), "images": datasets.Sequence(datasets.Image())})
    return datasets.Dataset.from_list(rows, features=feats)


@pytest.mark.parametrize("batched", [False, True])
def test_corrupt_image_under_plain_map_is_an_image_error(batched):
    ds = _image_dataset()
    kw = {"processor": processor_for("qwen2_vl"), "pixels": "none"}
    with pytest.raises(ImageError) as info:
        ds.map(mmpipe.encode, fn_kwargs=kw, with_indices=True, batched=batched, batch_size=4,
               load_from_cache_file=False)
    e = info.value
    assert (e.stage, e.column, e.row, e.image) == ("image", "images", 2, 1), str(e)
    assert "undecoded_images" in e.fix and "encode_dataset" in e.fix
    skipped = ds.map(mmpipe.encode, fn_kwargs={**kw, "on_error": "skip"}, with_indices=True, batched=batched,
                     batch_size=4, remove_columns=ds.column_names, load_from_cache_file=False)
    out, errors = mmpipe.drop_failed(skipped)
    assert len(out) == 3 and [(r["row"], r["stage"], r["column"]) for r in errors] == [(2, "image", "images")]
    assert "not handled by mmpipe" not in json.dumps(errors)
