"""One validate path for every family (issue 26): `mmpipe.data.validate` does the common checks
once and asks the rows' media strategy (``fam.media``) only what differs per kind. Each kind
answers the same functions; a table without a family is told by its kind's column; the types
of the tiles and processor kinds read as any type of the same shape; a processor of another
family is refused for every kind."""

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
