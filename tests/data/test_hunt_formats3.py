"""Records, batches and validation as users' datasets hold them (hunt): a tiled family's
layout-only text row batched with uint8 rows, null labels in a labelled dataset, attention masks
with holes and labels no encoder writes, and the generic path's error for a processor that takes
no row without an image. The cases marked "old code" failed before their fix."""

from __future__ import annotations

import functools

import datasets
import numpy as np
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.offline import build_processor
from mmpipe.testing.invariants import assert_roundtrip

TILED = ("gemma3", "internvl", "llava_onevision")


@functools.lru_cache(maxsize=None)
def _proc(name: str):
    return build_processor(name)


def _raw(n_images: int, k: int) -> dict:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": [testing.tiny_image(40 + 8 * i, 36 + 5 * k, seed=k + i) for i in range(n_images)]}


# ---- 1. a layout-only text row among uint8 rows --------------------------------------------------
@pytest.mark.parametrize("name", TILED + ("qwen2_vl",))
@pytest.mark.parametrize("order", ["pixels_first", "text_first"])
def test_layout_only_text_row_among_uint8_rows_round_trips(name, order):
    """A text-only row encoded with pixels="none" batches with uint8 rows (it loses nothing): the
    model gets the uint8 rows' pixels, and unbatch gives each row back as it came. Old code (tiled
    families): the text row came back with an empty uint8 tile block [0, S, S, 3] instead of no
    pixels (pixel_format "uint8", not "none"); the patch grids already gave it back as it was."""
    proc = _proc(name)
    image_row = mmpipe.encode_row(_raw(2, 0), proc, pixels="uint8")
    text_row = mmpipe.encode_row(_raw(0, 1), proc, pixels="none")
    rows = [image_row, text_row] if order == "pixels_first" else [text_row, image_row]
    batch = mmpipe.collate(rows, processor=proc)
    alone = mmpipe.collate([image_row], processor=proc).model_inputs()
    got = batch.model_inputs()
    assert np.array_equal(np.asarray(got["pixel_values"]), np.asarray(alone["pixel_values"]))
    assert_roundtrip(rows, batch)  # the text row comes back without pixels, as it came
    # through Arrow, as users store them: two encodes (pixels="uint8" and "none") concatenated
    parts = [mmpipe.encode_dataset(datasets.Dataset.from_list([raw]), proc, pixels=pixels)[0]
             for raw, pixels in ((_raw(2, 0), "uint8"), (_raw(0, 1), "none"))]
    stored = datasets.concatenate_datasets(parts if order == "pixels_first" else parts[::-1])
    for given in (list(stored), stored.with_format("arrow")[:]):
        assert_roundtrip(rows, mmpipe.collate(given, processor=proc))


@pytest.mark.parametrize("name", TILED)
def test_layout_only_row_with_images_among_uint8_rows_is_refused(name):
    """A layout-only row WITH images next to rows with pixels is refused by name (unchanged: a
    text-only batch would drop the others' pixels)."""
    proc = _proc(name)
    rows = [mmpipe.encode_row(_raw(1, 0), proc, pixels="uint8"), mmpipe.encode_row(_raw(1, 1), proc, pixels="none")]
    with pytest.raises(mmpipe.errors.PixelDataError, match=r"rows \[1\] hold images but no pixel data"):
        mmpipe.collate(rows, processor=proc)


# ---- 2. null labels in a labelled dataset -------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _encoded(name: str) -> datasets.Dataset:
    raw = datasets.Dataset.from_list([_raw(1, k) for k in range(4)])
    return mmpipe.encode_dataset(raw, _proc(name), pixels="uint8")[0]


def _edited(name: str, **rows) -> pa.Table:
    """The encoded table with ``column=[(row, value), ...]`` edits (value None: null)."""
    t = _encoded(name).data.table
    for column, edits in rows.items():
        values = t.column(column).to_pylist()
        for i, v in edits:
            values[i] = v(values[i]) if callable(v) else v
        field = t.schema.field(column)
        t = t.set_column(t.column_names.index(column), field, pa.array(values, field.type))
    return t


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3"])
def test_null_labels_are_warned_apart_from_untrained_rows(name):
    """Old code: a null labels value was one more "every label -100, or null" row, with the fix
    "re-encode them with a longer max_length" (no truncation lost those labels). Now its own
    warning names the rows and says how they read; rows of all -100 keep theirs."""
    table = _edited(name, labels=[(1, lambda v: [-100] * len(v)), (2, None)])
    report = mmpipe.validate_dataset(table)
    assert report.ok, str(report)
    by_rows = {tuple(w.rows): w for w in report.warnings if w.column == "labels"}
    assert sorted(by_rows) == [(1,), (2,)], str(report)
    assert "null labels" in str(by_rows[(2,)]) and "is not None" in by_rows[(2,)].fix
    assert "null" not in str(by_rows[(1,)]) and "max_length" in by_rows[(1,)].fix


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3"])
def test_labelled_and_null_labels_rows_collate_as_ignored(name):
    """Collate of a labelled row and a null-labels row: the null row's labels are all -100 (no
    loss), it is marked unlabelled, and unbatch gives it no labels (unchanged behaviour)."""
    ds = datasets.Dataset(_edited(name, labels=[(1, None)]))
    batch = assert_roundtrip([ds[0], ds[1]], processor=_proc(name))
    labels = np.asarray(batch.labels)
    assert (labels[1] == -100).all() and (labels[0] != -100).any()
    assert np.asarray(batch.row_has_labels).tolist() == [True, False]


# ---- 4. token values no encoder writes ----------------------------------------------------------
def _hole(v):
    return v[:3] + [0] + v[4:]


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3"])
@pytest.mark.parametrize("column, edit, match", [
    ("attention_mask", _hole, "holds 0 at token 3"),
    ("attention_mask", lambda v: [2] + v[1:], "holds 2 at token 0"),
    ("labels", lambda v: v[:-1] + [-5], "holds -5 at token"),
    ("input_ids", lambda v: [-100] + v[1:], "holds -100 at token 0"),
])
def test_token_values_no_encoder_writes_are_errors(name, column, edit, match):
    """Old code: an attention_mask with a 0 (or a 2) inside a stored row, a label of -5 or a token
    id of -100 validated OK and collated silently (the model would not attend to the token; the
    loss / the embedding lookup fails on the value, on a GPU as a device-side assert). Now validate
    names the row, collate refuses it."""
    table = _edited(name, **{column: [(2, edit)]})
    report = mmpipe.validate_dataset(table)
    assert [(e.column, e.rows) for e in report.errors] == [(column, [2])], str(report)
    ds = datasets.Dataset(table)
    with pytest.raises(InputError, match=match) as info:
        mmpipe.collate([ds[i] for i in range(len(ds))], processor=_proc(name))
    assert info.value.row == 2 and info.value.column == column


@pytest.mark.parametrize("column", ["input_ids", "labels"])
def test_ids_beyond_the_processors_tokenizer_are_warned_given_the_processor(column):
    """Old code: validate_dataset(..., processor=) passed rows holding ids the processor's tokenizer
    does not have (rows of another tokenizer) without a word. Now a warning naming the rows, with the
    processor only (not an error: sampled rollout ids may lie in the model's larger embedding)."""
    proc = _proc("qwen2_vl")
    table = _edited("qwen2_vl", **{column: [(1, lambda v: v[:-1] + [len(proc.tokenizer) + 5])]})
    assert not mmpipe.validate_dataset(table).warnings
    report = mmpipe.validate_dataset(table, processor=proc)
    assert report.ok and [(w.column, w.rows) for w in report.warnings] == [(column, [1])], str(report)
    assert f">= {len(proc.tokenizer)}" in str(report)


def test_all_zero_attention_row_is_a_warning_and_still_collates():
    """A dummy row (attention all 0: data-parallel padding) is taken by collate, as documented;
    stored in a dataset it is warned about (the model attends to none of its tokens)."""
    table = _edited("qwen2_vl", attention_mask=[(1, lambda v: [0] * len(v))])
    report = mmpipe.validate_dataset(table)
    assert report.ok and [(w.column, w.rows) for w in report.warnings] == [("attention_mask", [1])], str(report)
    ds = datasets.Dataset(table)
    mmpipe.collate([ds[0], ds[1]], processor=_proc("qwen2_vl"))


# ---- 3. the generic path: a processor that needs an image per row -------------------------------
def _needs_images(proc):
    """``proc`` as a processor class that refuses every call without images (as PaliGemma's
    processor does on transformers 4.x)."""
    base = type(proc)

    def __call__(self, *args, images=None, **kwargs):
        if images is None:
            raise ValueError("`images` are expected as arguments to this processor")
        return base.__call__(self, *args, images=images, **kwargs)

    proc.__class__ = type("NeedsImagesProcessor", (base,), {"__call__": __call__})
    return proc


def test_generic_path_names_a_missing_image_for_a_processor_that_needs_one():
    """Old code: the row's error said "check the row's image items against its images and the
    chat template" for a text-only row (it has none). Now: the processor's message is kept, and
    the error names the images column and the fix (give an image, or filter text-only rows)."""
    proc = _needs_images(testing.build_processor("llava"))
    enc = mmpipe.Encoder(proc, family="generic")
    row = enc.encode_row(_raw(1, 0))  # a row with an image encodes
    assert row.input_ids.size
    with pytest.raises(InputError) as info:
        enc.encode_row(_raw(0, 1))
    e = info.value
    assert e.column == "images" and "`images` are expected" in str(e)
    assert "filter the text-only rows" in e.fix and "image items" not in e.fix
