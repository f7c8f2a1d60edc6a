"""One validate path for every family (issue 26): `mmpipe.data.validate` does the common checks
once and asks the rows' media strategy (``fam.media``) only what differs per kind. Each kind
answers the same functions; a table without a family is told by its kind's column; the
published schema's columns are typed exactly and losslessly repaired for every kind (the generic
path's own outputs by shape); a processor of another family is refused for every kind; rows of
several families are checked each against its own family."""

from __future__ import annotations

import inspect

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data.column_rules import ExpectedColumn, same_shape
from mmpipe.data.validate import dataset_family, validate_dataset
from mmpipe.families import ALL_FAMILIES
from mmpipe.media import KINDS, strategy
from mmpipe.records.processor_layout import ProcessorLayout
from mmpipe.testing.invariants import assert_rows_from_arrow

VALIDATE_FUNCTIONS = ("expected_columns", "dataset_checks", "row_checks")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_answers_the_same_functions(kind):
    media, patches = strategy(kind), strategy("patches")
    assert isinstance(media.KIND_COLUMN, str) and isinstance(media.IMAGE_LAYOUT_COLUMN, str)
    for name in VALIDATE_FUNCTIONS:
        got = list(inspect.signature(getattr(media, name)).parameters)
        assert got == list(inspect.signature(getattr(patches, name)).parameters), (kind, name)


@pytest.mark.parametrize("found, want, ok", [
    (pa.list_(pa.int64()), pa.list_(pa.int32()), True),
    (pa.large_list(pa.int8()), pa.list_(pa.int32()), True),
    (pa.list_(pa.float32()), pa.list_(pa.int64()), False),
    (pa.list_(pa.int32()), pa.list_(pa.uint8()), False),  # pixel bytes stay bytes
    (pa.list_(pa.list_(pa.int32())), pa.list_(pa.int64()), False),
    (pa.large_string(), pa.string(), True),
    (pa.int32(), pa.string(), False),
])
def test_same_shape(found, want, ok):
    assert same_shape(found, want) is ok


def test_expected_column_refuses_an_unknown_rule():
    with pytest.raises(ValueError, match="if_missing"):
        ExpectedColumn("input_ids", if_missing="guess")


@pytest.mark.parametrize("column, kind", [("tiles_per_image", "tiles"), ("generic_layout", "processor"),
                                          ("image_grid_thw", "patches"), ("input_ids", "patches")])
def test_a_table_without_rows_is_told_by_its_kind_column(column, kind):
    table = pa.table({column: pa.array([], pa.string())})
    assert dataset_family(table).media is strategy(kind)
    assert all(dataset_family(pa.table({"family": [name]})) is f for name, f in ALL_FAMILIES.items())


def _qwen_rows():
    proc = testing.build_processor("qwen2_vl")
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
                        {"role": "assistant", "content": "a cat"}], "images": [testing.tiny_image(40, 60, seed=1)]}
    return [mmpipe.encode_row(raw, proc, idx=0)]


def test_a_processor_of_another_family_is_refused_for_every_kind():
    """It was checked for tiled rows only; a patch-grid dataset took any processor silently."""
    rows = _qwen_rows()
    table = datasets.Dataset.from_list([r.to_dict() for r in rows]).data.table
    assert_rows_from_arrow(table, rows)
    assert validate_dataset(table, processor=testing.build_processor("qwen2_vl")).ok
    report = validate_dataset(table, processor=testing.build_processor("gemma3"))
    assert [(i.kind, i.column) for i in report.errors] == [("family", "family")], str(report)
    assert "rows of qwen2_vl but the processor is" in str(report)


def _names(columns, rule):
    return [c.name for c in columns if c.if_missing == rule]


def test_tiles_and_processor_columns_are_derived_from_their_declarations():
    """The tiles and processor kinds' expected columns come from their declared ``COLUMNS``
    (`declared_columns`): required what the reader needs, ``tile_hw`` only beside stored tiles,
    every other declared column optional; the processor kind adds its layout's keys."""
    from mmpipe.data.validate_columns import declared_columns

    tiles = strategy("tiles")
    layout_only = pa.table({"input_ids": [[1]], "family": ["gemma3"]})
    with_tiles = layout_only.append_column("pixel_values_u8", pa.array([[0]], pa.list_(pa.uint8())))
    required = ["input_ids", "attention_mask", "mm_token_type_ids", "image_hw", "tiles_per_image", "family"]
    assert _names(tiles.expected_columns(layout_only, labels=True, pixel_format="none"), "error") == required
    assert _names(tiles.expected_columns(with_tiles, labels=True, pixel_format="uint8"), "error") == \
        required + ["tile_hw"]
    assert {"labels", "pixel_values_u8", "images_kwargs", "pixel_digest"} <= \
        set(_names(declared_columns(layout_only, tiles.COLUMNS, "tiles"), "optional"))
    proc = strategy("processor").expected_columns(pa.table({"generic_layout": [ProcessorLayout(
        "LlavaProcessor", ("token_type_ids",), (("pixel_values", "float32", 4),)).to_json()]}),
        labels=False, pixel_format="float32")
    assert _names(proc, "error") == ["input_ids", "attention_mask", "generic_shapes", "family", "generic_layout"]
    assert {"labels", "image_hw", "pixel_values", "token_type_ids"} <= set(_names(proc, "optional"))


def _encoded(name: str, counts=(1, 0, 2)) -> datasets.Dataset:
    """A ``datasets.map`` encoding of ``name`` (``"generic"``: the generic path on Idefics3)."""
    if name == "generic":
        from mmpipe.offline.other_vlms import build_foreign_processor

        proc, kw = build_foreign_processor("idefics3"), {"family": "generic"}
    else:
        proc, kw = testing.build_processor(name), {}
    raw = datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"row {i}?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}],
         "images": [testing.tiny_image(40 + 8 * j, 56, seed=10 * i + j) for j in range(k)]}
        for i, k in enumerate(counts)])
    return raw.map(mmpipe.encode, fn_kwargs={"processor": proc, **kw}, remove_columns=raw.column_names)


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3", "internvl", "generic"])
def test_token_column_types_are_checked_and_repaired_for_every_kind(name):
    """list<int64> token columns (the published schema says list<int32> / list<int8> for every
    kind) are type errors for every kind, and fix=True casts them back losslessly: the repaired
    dataset has a fresh encoding's features (so it concatenates with one) and the same rows."""
    enc = _encoded(name)
    wide = {"input_ids": "int64", "attention_mask": "int64", "labels": "int64"}
    if "mm_token_type_ids" in enc.column_names:
        wide["mm_token_type_ids"] = "int64"
    bad = enc
    for col, dtype in wide.items():
        bad = bad.cast_column(col, datasets.List(datasets.Value(dtype)))
    report = validate_dataset(bad)
    assert sorted(i.column for i in report.errors) == sorted(wide), str(report)
    assert all(i.kind == "type" and "found list<item: int64>" in str(i) and "fix=True" in i.fix
               for i in report.errors), str(report)
    fixed = mmpipe.load_encoded(bad.data.table, fix=True)
    assert fixed.features == enc.features
    assert fixed.to_list() == enc.to_list()
    datasets.concatenate_datasets([fixed, enc])  # the features match a fresh encoding's
    if name in ("gemma3", "internvl"):  # the previous release's int32 token types: read the same, accepted
        old = enc.cast_column("mm_token_type_ids", datasets.List(datasets.Value("int32")))
        assert validate_dataset(old).ok and not validate_dataset(old).issues
        assert mmpipe.load_encoded(old.data.table, fix=True).features == enc.features


def test_an_all_empty_list_null_column_is_repaired_by_a_lossless_cast():
    """A pandas round trip gives an all-empty video_grid_thw back as list<null>; the cast to
    list<list<int32>> changes no value, so fix=True repairs it (not "re-encode")."""
    from mmpipe.data.repair import lossless_cast

    enc = _encoded("qwen2_vl", counts=(1, 0))
    back = datasets.Dataset.from_pandas(enc.to_pandas())
    assert str(back.data.table.schema.field("video_grid_thw").type) == "list<item: null>"
    report = validate_dataset(back)
    err = [i for i in report.errors if i.column == "video_grid_thw"]
    assert err and "change values" not in str(err[0]) and "fix=True" in err[0].fix, str(report)
    fixed = mmpipe.load_encoded(back.data.table, fix=True)
    assert fixed.features == enc.features and fixed.to_list() == enc.to_list()
    nulls = pa.chunked_array([pa.array([None, None])])
    assert lossless_cast(nulls, pa.list_(pa.int32())).to_pylist() == [None, None]
    assert lossless_cast(pa.chunked_array([pa.array([[None], []])]), pa.list_(pa.int32())).to_pylist() == [[None], []]


def test_rows_of_several_families_are_checked_against_their_own_family():
    """InternVL + LLaVA-OneVision rows (same features): the mixed family is the one error; no
    correct row is blamed for another family's feature token. A family of another kind is not
    called unknown; a name no family has is."""
    mixed = datasets.concatenate_datasets([_encoded("internvl", (1, 0)), _encoded("llava_onevision", (0, 1))])
    report = validate_dataset(mixed)
    assert [(i.column, i.rows) for i in report.errors] == [("family", [2, 3])], str(report)
    assert "several model families ['internvl', 'llava_onevision']" in str(report)
    qwen, generic = _encoded("qwen2_vl", (1,)), _encoded("generic", (1,))
    rows = [mmpipe.MultiModalInputs.from_dict(r).to_dict() for r in (generic[0], qwen[0])]
    report = validate_dataset(datasets.Dataset.from_list(rows))
    assert [(i.column, i.rows) for i in report.errors] == [("family", [1])], str(report)
    assert "unknown" not in str(report) and "'qwen2_vl' (patches)" in str(report)
    report = validate_dataset(datasets.Dataset.from_list([rows[0], dict(rows[0], family="qwen9")]))
    assert [(i.column, i.rows) for i in report.errors] == [("family", [1])], str(report)
    assert "unknown model family ['qwen9']" in str(report)
