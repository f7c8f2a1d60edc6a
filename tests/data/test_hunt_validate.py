"""validate_dataset / load_encoded(fix=True) on encoded datasets damaged the way later pipeline
steps damage them (hunt): each case failed (silent OK, or a wrong "fixed") on the old code."""

from __future__ import annotations

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data.validate import SchemaError, validate_dataset


def _encoded(name: str, counts=(1, 0, 2)) -> datasets.Dataset:
    proc = testing.build_processor(name)
    raw = datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"row {i}?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}],
         "images": [testing.tiny_image(40 + 8 * j, 56, seed=10 * i + j) for j in range(k)]}
        for i, k in enumerate(counts)])
    return raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)


@pytest.fixture(scope="module")
def qwen():
    return _encoded("qwen2_vl")


def _without_image_tokens(r: dict) -> dict:
    """A map that drops every token marked as an image from the token columns (as a truncation
    that cuts them does), keeping the images."""
    keep = [i for i, m in enumerate(r["mm_token_type_ids"]) if m != 1]
    return {k: [r[k][i] for i in keep] for k in ("input_ids", "attention_mask", "labels", "mm_token_type_ids")}


@pytest.mark.parametrize("name", ["gemma3", "internvl"])
def test_tiles_rows_whose_image_tokens_were_all_cut_are_errors(name):
    """No row marks a feature token, so the tiles check (which finds the feature token from the
    marked ones) had nothing to check: the rows validated OK and collate sent their tiles with
    no token for them (the model fails at the first batch)."""
    bad = _encoded(name).map(_without_image_tokens)
    report = validate_dataset(bad)
    assert [(i.column, i.rows) for i in report.errors] == [("input_ids", [0, 2])], str(report)
    assert "no image token" in str(report) and report.errors[0].fix
    with pytest.raises(SchemaError, match="no image token"):
        mmpipe.load_encoded(bad.data.table, fix=True)
    assert validate_dataset(_encoded(name)).ok  # the clean rows stay clean


def test_a_class_encoded_family_is_mapped_back_to_its_names(qwen):
    """class_encode_column("family") (stratify_by_column wants a ClassLabel) stores int64 class
    ids: fix=True cast them to the text "0", called that "fixed", and the rows then read as
    family '0'. The ClassLabel's names repair it losslessly; without them it is an error whose
    fix does not say fix=True."""
    enc = qwen.class_encode_column("family")
    report = validate_dataset(enc)
    assert [i.column for i in report.errors] == ["family"] and "fix=True" in report.errors[0].fix, str(report)
    fixed = mmpipe.load_encoded(enc, fix=True)
    assert fixed["family"] == qwen["family"] and fixed.features == qwen.features
    assert "ClassLabel's names ['qwen2_vl']" in str(validate_dataset(enc, fix=True))
    bare = enc.data.table.replace_schema_metadata(None)  # the ids without their names
    report = validate_dataset(bare, fix=True)
    assert not report.ok and not report.fixed and "fix=True" not in report.errors[0].fix, str(report)


def test_rows_without_a_trained_token_among_trained_rows_are_warned(qwen):
    """A row whose labels are all -100 (or null) next to rows with trained tokens trains
    nothing: a warning naming it; a prompt-only dataset (every row untrained) gets none."""
    def untrain(r, i):
        return {"labels": [-100] * len(r["labels"])} if i == 1 else {}

    report = validate_dataset(qwen.map(untrain, with_indices=True))
    assert report.ok and [(i.column, i.rows) for i in report.warnings] == [("labels", [1])], str(report)
    t = qwen.data.table
    nulls = pa.array([None if i == 2 else v for i, v in enumerate(t.column("labels").to_pylist())],
                     t.schema.field("labels").type)
    report = validate_dataset(t.set_column(t.column_names.index("labels"), "labels", nulls))
    assert [(i.column, i.rows) for i in report.warnings] == [("labels", [2])], str(report)
    prompts = qwen.map(lambda r: {"labels": [-100] * len(r["labels"])})
    assert not validate_dataset(prompts).issues
    assert not validate_dataset(qwen).issues


def test_an_empty_dataset_is_warned_not_silent(qwen):
    report = validate_dataset(qwen.filter(lambda r: False))
    assert report.ok and report.warnings and "no rows" in str(report), str(report)


@pytest.mark.parametrize("pixels", ["uint8", "source"])
def test_tiles_rows_that_lost_their_pixel_digest_warn_and_fix_adds_it(pixels):
    """select_columns / remove_columns dropping pixel_digest from stored tiles passed without a
    word (the patch grids warn: damaged bytes can no longer be detected); fix=True now stores the
    digests, the same the encoder wrote."""
    proc = testing.build_processor("gemma3")
    raw = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                    "text": "what?"}]}], "images": [testing.tiny_image(40, 56, seed=3)]}])
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": pixels}, remove_columns=raw.column_names)
    lost = enc.remove_columns(["pixel_digest"])
    report = validate_dataset(lost)
    assert report.ok and [w.column for w in report.warnings] == ["pixel_digest"], str(report)
    fixed = validate_dataset(lost, fix=True)
    assert fixed.ok and fixed.data["pixel_digest"] == enc["pixel_digest"], str(fixed)
    layout_only = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "none"}, remove_columns=raw.column_names)
    assert not validate_dataset(layout_only).issues  # no pixels stored: no digest to miss


@pytest.mark.parametrize("name, pixels", [("qwen2_vl", "uint8"), ("qwen2_vl", "source"), ("gemma3", "uint8")])
def test_a_null_pixel_digest_in_a_row_with_pixels_is_warned_and_fix_fills_it(name, pixels):
    """One row's pixel_digest nulled (an edit, a concatenated row) while it stores pixel data: its
    digest check was skipped and validate_dataset said OK, even with its pixel bytes changed.
    Now a warning names the row; fix=True stores the digest of its data."""
    proc = testing.build_processor(name)
    raw = datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"row {i}?"}]}],
         "images": [testing.tiny_image(40, 56, seed=i)] * k} for i, k in enumerate((1, 1, 0))])
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": pixels}, remove_columns=raw.column_names)
    digests = enc["pixel_digest"]
    nulled = enc.map(lambda r, i: {"pixel_digest": None if i == 1 else r["pixel_digest"]}, with_indices=True)
    report = validate_dataset(nulled)
    warned = [w for w in report.warnings if w.column == "pixel_digest"]
    assert report.ok and len(warned) == 1 and warned[0].rows == [1], str(report)
    fixed = validate_dataset(nulled, fix=True)
    assert fixed.ok and fixed.data["pixel_digest"] == digests, str(fixed)
    assert not [w for w in validate_dataset(enc).warnings if w.column == "pixel_digest"]
