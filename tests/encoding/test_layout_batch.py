"""The batched layout-only path (`mmpipe.encoding.layout_batch`, issue 18): a ``pixels="none"``
batch encodes to exactly the columns of the per-row path (same keys in the same order, same
types, dtypes, shapes and values), over varied rows - 0..3 images, system prompts, multi-turn,
tools, prompt-style ``<image>`` rows, completions, label merges, videos -, truncation at
``max_length`` under the three policies, bad rows under ``on_error="raise"`` / ``"skip"``, the
families of the table (GLM-4.1V included), through ``datasets.map`` and `encode_dataset`."""

from __future__ import annotations

import functools
import io
import json
from unittest import mock

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding import layout_batch
from mmpipe.encoding.backend_tokenize import backend_encode
from mmpipe.encoding.dataset import make_encoder
from mmpipe.encoding import mapping
from mmpipe.families import FAMILIES as TABLE
from mmpipe.offline.chat_templates import chat_template
from mmpipe.offline.processors import build_image_processor, image_only_processor_class

from conftest import FAMILIES, processor_for
from helpers import VIDEO_BOUNDS, mixed_media_raws

LAYOUT_FAMILIES = FAMILIES + tuple(f for f in ("glm4v",) if f in TABLE)
TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}]


@functools.lru_cache(maxsize=None)
def _proc(family: str, merges: str = "default"):
    if family not in FAMILIES or merges == "default":
        return processor_for(family)
    return image_only_processor_class(family)(image_processor=build_image_processor(family),
                                              tokenizer=testing.build_tokenizer(family, merges=merges),
                                              chat_template=chat_template(family))


def _img(w, h, seed, as_bytes=False):
    im = testing.tiny_image(w, h, seed=seed)
    if not as_bytes:
        return im
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def _user(n_images: int, text: str, seed: int = 0):
    content = [{"type": "text", "text": text}]
    for j in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" picture {j}."}]
    return {"role": "user", "content": content}


def varied_rows(family: str) -> list[dict]:
    """Good rows of many shapes; each row's images in its ``images`` column."""
    rows = []
    for n in range(4):  # 0..3 images, with and without an answer, some with a system prompt
        msgs = ([{"role": "system", "content": "Be brief."}] if n % 2 else []) + [_user(n, f"Row {n}: look.")]
        if n != 2:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "I see " * (n + 1)}]})
        rows.append({"messages": msgs, "images": [_img(40 + 8 * j, 36 + 12 * n, 3 * n + j, j % 2 == 1) for j in range(n)]})
    # multi-turn, images in two user turns
    rows.append({"messages": [_user(1, "First."), {"role": "assistant", "content": "One.\n\nTwo."},
                              _user(2, "Then."), {"role": "assistant", "content": "\nThree."}],
                 "images": [_img(64, 40, 11), _img(40, 64, 12), _img(56, 56, 13)]})
    # tools (a column value as JSON), a tool call and a tool turn with an image
    rows.append({"messages": [_user(0, "Zoom please."),
                              {"role": "assistant", "content": "Zooming.", "tool_calls": [
                                  {"type": "function", "function": {"name": "zoom", "arguments": json.dumps({"x": 2})}}]},
                              {"role": "tool", "name": "zoom", "content": [{"type": "image"}, {"type": "text", "text": "view"}]},
                              {"role": "assistant", "content": "Done."}],
                 "images": [_img(48, 48, 14)], "tools": json.dumps(TOOLS)})
    # a prompt-style row with <image> markers, and a prompt-completion row
    rows.append({"prompt": "Compare <image> and <image>.", "images": [_img(44, 60, 15), _img(60, 44, 16)]})
    rows.append({"prompt": [_user(1, "Caption:")], "completion": "a cat", "images": [_img(52, 36, 17)]})
    return rows


def _columns_per_row(enc, examples, idx) -> dict:
    """The reference: the same batch call with the batched layout path switched off (every row
    through `encode_or_drop`, as before it existed)."""
    with mock.patch.object(mapping, "takes_layout_batch", lambda enc: False):
        return enc(_as_batch(examples), list(idx))


def _as_batch(rows: list[dict]) -> dict:
    keys = sorted({k for r in rows for k in r})
    return {k: [r.get(k) for r in rows] for k in keys}


def assert_same_columns(got: dict, ref: dict) -> None:
    assert list(got) == list(ref)
    for k in ref:
        assert len(got[k]) == len(ref[k]), k
        for i, (a, b) in enumerate(zip(got[k], ref[k])):
            assert type(a) is type(b), (k, i, type(a), type(b))
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and a.shape == b.shape, (k, i, a.dtype, b.dtype, a.shape, b.shape)
                np.testing.assert_array_equal(a, b, err_msg=f"{k} row {i}")
            else:
                assert a == b, (k, i, a, b)


def _both(proc, rows, idx=None, **options):
    """(batched columns, per-row columns, the batch's fast rows) of ``rows`` under ``options``."""
    idx = list(range(len(rows))) if idx is None else idx
    batched_enc = make_encoder(proc, pixels="none", **options)
    _, fast = layout_batch.encode_layout(make_encoder(proc, pixels="none", **options), rows, idx)
    return batched_enc(_as_batch(rows), idx), _columns_per_row(make_encoder(proc, pixels="none", **options), rows, idx), fast


@pytest.mark.parametrize("family", LAYOUT_FAMILIES)
@pytest.mark.parametrize("labels", [False, True])
def test_batch_equals_rows(family, labels):
    proc = _proc(family)
    rows = varied_rows(family)
    got, ref, fast = _both(proc, rows, labels=labels)
    assert_same_columns(got, ref)
    assert fast == list(range(len(rows)))  # every good row took the batched path


@pytest.mark.parametrize("labels", [False, True])
def test_learned_merges_and_tools_option(labels):
    """A tokenizer that merges a reply's leading newline into its header (real Qwen vocabularies):
    the batched offsets place labels as the per-row path does; ``tools=`` for every row."""
    proc = _proc("qwen3_vl", "qwen-like")
    rows = varied_rows("qwen3_vl")
    got, ref, fast = _both(proc, rows, tools=TOOLS, labels=labels)
    assert_same_columns(got, ref)
    assert fast == list(range(len(rows)))


@pytest.mark.parametrize("policy", ["drop", "truncate_text", "raise"])
def test_truncation_at_max_length(policy):
    proc = _proc("qwen2_vl")
    rows = varied_rows("qwen2_vl")
    lens = [len(r) for r in _columns_per_row(make_encoder(proc, pixels="none"), rows, range(len(rows)))["input_ids"]]
    cap = sorted(lens)[len(lens) // 2]
    opts = dict(max_length=cap, truncation=policy)
    if policy == "raise":
        enc = make_encoder(proc, pixels="none", **opts)
        with pytest.raises(mmpipe.errors.TruncationError) as batched:
            enc(_as_batch(rows), list(range(len(rows))))
        first = next(i for i, n in enumerate(lens) if n > cap)
        with pytest.raises(mmpipe.errors.TruncationError) as one:
            make_encoder(proc, pixels="none", **opts).encode_row(rows[first], first)
        assert str(batched.value) == str(one.value)
        return
    if policy == "truncate_text":  # rows whose cut would reach an image raise: keep the others
        keep = []
        for i, r in enumerate(rows):
            try:
                make_encoder(proc, pixels="none", **opts).encode_row(r, i)
                keep.append(r)
            except mmpipe.errors.TruncationError:
                pass
        rows = keep
    got, ref, fast = _both(proc, rows, **opts)
    assert_same_columns(got, ref)
    assert all(len(x) <= cap for x in got["input_ids"])
    assert len(fast) == sum(n <= cap for n in lens) if policy == "drop" else len(fast) < len(rows)


def bad_rows(family: str) -> list[dict]:
    pad = "<|image_pad|>" if family != "glm4v" else "<|image|>"
    good = varied_rows(family)
    return [
        good[1],
        {"messages": [_user(1, "Broken.")], "images": [{"bytes": b"\x89PNG not an image", "path": None}]},  # image
        good[3],
        {"messages": [{"content": "no role"}]},  # parse
        {"messages": [_user(1, f"literal {pad} here")], "images": [_img(40, 40, 1)]},  # pads
        {"messages": [_user(0, "x")], "tools": "not json"},  # tools column
        {"messages": [_user(2, "two items")], "images": [_img(40, 40, 2)]},  # fewer images than items
        good[4],
        {"messages": [_user(1, "A sliver.")], "images": [_jpeg(1, 250)]},  # aspect ratio (Qwen refuses it)
    ]


def _jpeg(w, h) -> dict:
    buf = io.BytesIO()
    testing.tiny_image(w, h, seed=0).convert("RGB").save(buf, format="JPEG")
    return {"bytes": buf.getvalue(), "path": None}


@pytest.mark.parametrize("family", LAYOUT_FAMILIES)
def test_bad_rows_skip_and_raise(family):
    proc = _proc(family)
    rows = bad_rows(family)
    got, ref, fast = _both(proc, rows, on_error="skip")
    assert_same_columns(got, ref)
    errors = [json.loads(e) if e else None for e in got[mmpipe.encoding.ERROR_COLUMN]]
    assert [bool(e) for e in errors[:8]] == [False, True, False, True, True, True, True, False]
    assert [e["row"] for e in errors if e] == [i for i, e in enumerate(errors) if e]  # each names its own row
    assert fast == [i for i, e in enumerate(errors) if not e]  # every good row took the batched path
    with pytest.raises(mmpipe.errors.InputError) as batched:
        make_encoder(proc, pixels="none")(_as_batch(rows), list(range(len(rows))))
    with pytest.raises(mmpipe.errors.InputError) as one:
        make_encoder(proc, pixels="none").encode_row(rows[1], 1)
    assert type(batched.value) is type(one.value) and str(batched.value) == str(one.value)
    assert batched.value.row == 1


def test_first_row_left_out_and_all_rows_left_out():
    """The merge keeps the batch's column order when the first row (or every row) takes the
    per-row path; a batch whose rows are all dropped gives the per-row path's empty columns."""
    proc = _proc("qwen2_5_vl")
    rows = bad_rows("qwen2_5_vl")[1:4]
    got, ref, _ = _both(proc, rows, on_error="skip")
    assert_same_columns(got, ref)
    got, ref, fast = _both(proc, [rows[0], rows[2]], on_error="skip")
    assert_same_columns(got, ref) and fast == []
    enc = make_encoder(proc, pixels="none", max_length=4, truncation="drop")
    out = enc(_as_batch(varied_rows("qwen2_5_vl")[:3]), [0, 1, 2])
    assert all(v == [] for v in out.values()) and "input_ids" in out


def test_video_rows_take_the_per_row_path():
    proc = _proc("qwen2_5_vl")
    rows = mixed_media_raws(["I", "vI", "", "v"])
    got, ref, fast = _both(proc, rows, video_options=VIDEO_BOUNDS)
    assert_same_columns(got, ref)
    assert fast == [0, 2]
    assert any(len(g) for g in got["video_grid_thw"])


def test_packed_rope_in_several_chunks(monkeypatch):
    """Rows laid end to end over several M-RoPE calls (a chunk never splits a row) == per row."""
    proc = _proc("qwen3_vl")
    rows = varied_rows("qwen3_vl")
    whole, _, _ = _both(proc, rows)
    monkeypatch.setattr(layout_batch, "ROPE_CHUNK_TOKENS", 50)
    got, ref, _ = _both(proc, rows)
    assert_same_columns(got, ref)
    assert_same_columns(got, whole)


def test_datasets_map_and_encode_dataset(monkeypatch):
    """``ds.map(mmpipe.encode, batched=True, with_indices=True)`` and `encode_dataset` under
    ``pixels="none"`` store the same tables as with the per-row path; bad rows reported alike."""
    proc = _proc("qwen2_vl")
    rows = []
    for i in range(7):
        text = "literal <|image_pad|>" if i == 4 else f"Row {i}."
        images = [_img(40 + 4 * j, 48, i + j, as_bytes=True) for j in range(i % 3)]
        if i == 2:
            images[1] = {"bytes": b"not an image", "path": None}
        rows.append({"messages": [_user(len(images) - (i == 4), text),
                                  {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}."}]}],
                     "images": images})
    rows[4]["images"] = rows[4]["images"][:1]
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    kw = dict(fn_kwargs={"processor": proc, "pixels": "none", "on_error": "skip"}, with_indices=True,
              remove_columns=ds.column_names, batched=True, batch_size=3, load_from_cache_file=False)

    drop = dict(kw, fn_kwargs=dict(kw["fn_kwargs"], max_length=60, truncation="drop"))

    def run():
        enc_ds = ds.map(mmpipe.encode, **kw).with_format("arrow")[:]
        dropped = ds.map(mmpipe.encode, **drop).with_format("arrow")[:]  # rows left out of a batch
        out, report = mmpipe.encode_dataset(ds, proc, pixels="none", on_error="skip", batch_size=3)
        return enc_ds, out.with_format("arrow")[:], report, dropped

    fast = run()
    monkeypatch.setattr(mapping, "takes_layout_batch", lambda enc: False)
    slow = run()
    assert fast[0].equals(slow[0]) and fast[1].equals(slow[1]) and fast[3].equals(slow[3])
    assert 0 < fast[3].num_rows < fast[0].num_rows
    assert fast[2].errors == slow[2].errors and [e["row"] for e in fast[2].errors] == [2, 4]
    assert fast[1].num_rows == 5


def test_backend_ids_equal_the_tokenizer_call():
    """Without labels the ids come from the backend's ``encode_batch_fast``, with labels ids and
    offsets from its ``encode_batch``: the same as the tokenizer's call, and no fast path where the
    call would differ (split special tokens)."""
    texts = ["<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi  \n\n there<|im_end|>\n",
             "caf\u00e9 \u4f60\u597d\t\t x", "", "<|image_pad|><|image_pad|>   \n"]
    for proc in (_proc("qwen2_vl"), _proc("qwen3_vl", "qwen-like")):
        tok = proc.tokenizer
        assert backend_encode(tok, texts, False) == (tok(texts, add_special_tokens=False)["input_ids"], None)
        call = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = backend_encode(tok, texts, True)
        assert ids == call["input_ids"]
        assert [list(map(tuple, o)) for o in offsets] == [list(map(tuple, o)) for o in call["offset_mapping"]]
    split = testing.build_tokenizer("qwen2_vl")
    split.split_special_tokens = True
    assert backend_encode(split, texts, False) is None
    assert backend_encode(split, texts, True) is None


def test_empty_batch_gives_the_empty_columns():
    """A batch of no rows (a datasets batch can be empty) has the per-row path's columns."""
    enc = make_encoder(_proc("qwen2_vl"), pixels="none", on_error="skip")
    got = mapping._map_batch(enc, {"messages": [], "images": []}, None)
    with mock.patch.object(mapping, "takes_layout_batch", lambda enc: False):
        assert got == mapping._map_batch(enc, {"messages": [], "images": []}, None)
    assert "input_ids" in got and all(v == [] for v in got.values())
