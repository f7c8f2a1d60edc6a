"""schemas/ are generated from the code; fail when they drift. Every record has one schema with
an example of every family of the table and of the generic path, and each example fits it."""

from __future__ import annotations

import functools
import json
import pathlib

import datasets
import numpy as np
import pyarrow as pa
import pytest

import mmpipe
from mmpipe.data.schema_examples import example_records
from mmpipe.data.schemas import render, schema_documents
from mmpipe.families import ALL_FAMILIES, get_family
from mmpipe.media.processor import LAYOUT_COLUMN, ProcessorLayout
from mmpipe.testing.invariants import assert_roundtrip

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "schemas"
RECORD_FILES = ("multimodal_inputs.json", "batched_multimodal_inputs.json", "packed_multimodal_inputs.json")


@functools.lru_cache(maxsize=None)
def _docs() -> dict:
    return schema_documents()


def _published(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def test_schema_files_match_the_code():
    docs = _docs()
    on_disk = sorted(p.name for p in SCHEMAS.glob("*.json"))
    assert on_disk == sorted(docs), "run: python -m mmpipe.data.schemas"
    for name, doc in docs.items():
        assert (SCHEMAS / name).read_text() == render(doc), \
            f"{name} drifted from the code; run: python -m mmpipe.data.schemas"


def test_schema_files_are_language_neutral_json():
    doc = _published("multimodal_inputs.json")
    names = [f["name"] for f in doc["fields"]]
    for col in ("input_ids", "position_ids", "image_grid_thw", "pixel_values", "pixel_values_u8",
                "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "rope_delta"):
        assert col in names
    bdoc = _published("batched_multimodal_inputs.json")
    assert "sample_to_image_indices" in [f["name"] for f in bdoc["fields"]]
    assert all(f["doc"] for f in doc["fields"] + bdoc["fields"])


def test_every_record_shows_every_family():
    for name in RECORD_FILES:
        assert sorted(_published(name)["examples"]) == sorted(ALL_FAMILIES), name


def test_features_and_pyarrow_agree():
    for fmt in ("uint8", "float32", "none", None):
        feats = mmpipe.MultiModalInputs.features(fmt)
        assert isinstance(feats.arrow_schema, pa.Schema)
        assert feats.arrow_schema.names == mmpipe.MultiModalInputs.arrow_schema(fmt).names
    assert "sample_to_image_indices" in mmpipe.BatchedMultiModalInputs.features()


def test_batch_serialises_to_its_declared_schema():
    from conftest import processor_for
    from mmpipe import testing

    proc = processor_for("qwen2_vl")
    content = [{"type": "image"}, {"type": "text", "text": "hi"}]
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": content}],
                               "images": [testing.tiny_image(40, 50)]}, proc),
            mmpipe.encode_row({"messages": [{"role": "user", "content": "no image"}]}, proc)]
    batch = mmpipe.collate(rows, processor=proc)
    table = batch.to_arrow()
    assert table.schema.equals(mmpipe.BatchedMultiModalInputs.arrow_schema())
    rec = table.to_pylist()[0]
    assert rec["sample_to_image_indices"] == [[0], []]
    assert rec["input_ids"] == batch.input_ids.tolist()
    assert len(rec["position_ids"]) == 3


@pytest.mark.parametrize("name", list(ALL_FAMILIES))
def test_each_family_example_row_fits_the_published_row_schema(name):
    """Every column the example row stores is a published column, of a type its values cast to
    (the type of the family's kind where one is given), or, on the generic path, one of the
    processor's own columns named by the row's layout, of the layout's dtype."""
    fields = {f["name"]: f for f in _published("multimodal_inputs.json")["fields"]}
    kind = get_family(name).kind
    stored = example_records(name)[0][0].to_dict()
    layout = ProcessorLayout.from_json(stored[LAYOUT_COLUMN]) if LAYOUT_COLUMN in stored else None
    own = {k: dtype for k, dtype, _ in layout.vision} if layout else {}
    own.update({k: "int32" for k in (layout.sequence if layout else ())})
    table = datasets.Dataset.from_list([stored]).data.table
    for col in stored:
        if col in own:
            typ = table.schema.field(col).type
            want = pa.from_numpy_dtype(np.dtype(own[col]))
            assert pa.types.is_list(typ) and typ.value_type == want, (col, typ)
            continue
        assert col in fields, f"{name}: stored column {col!r} is not in schemas/multimodal_inputs.json"
        want = fields[col].get("arrow_type_by_kind", {}).get(kind, fields[col]["arrow_type"])
        typ = mmpipe.MultiModalInputs.arrow_schema(kind=kind).field(col).type
        assert str(typ) == want, (name, col)
        table.column(col).cast(typ)  # raises when the stored values do not cast


@pytest.mark.parametrize("name", list(ALL_FAMILIES))
def test_each_family_batch_has_sample_to_image_indices(name):
    rows, batch, packed = example_records(name)
    want = [list(range(r.num_images)) for r in rows]  # one image at most, in the first row
    assert batch.sample_to_image_indices == want
    rec = batch.to_arrow()
    assert rec.schema.equals(mmpipe.BatchedMultiModalInputs.arrow_schema())
    assert rec.column("sample_to_image_indices").to_pylist() == [want]
    assert _published("batched_multimodal_inputs.json")["examples"][name]["sample_to_image_indices"] == want
    if not isinstance(packed, str):
        prec = packed.to_arrow()
        assert prec.schema.equals(mmpipe.PackedMultiModalInputs.arrow_schema())
        assert prec.column("sample_to_image_indices").to_pylist() == [want]
    assert_roundtrip(rows, batch=batch)


def test_optional_columns_and_the_generic_pixels_are_published():
    """The optional stored columns (a row carries them only when it needs them) are published
    with their Arrow types, and the generic path's flat pixel_values has its kind's type; every
    column a pixels="source" row stores is published with the type it is stored with."""
    from conftest import processor_for
    from mmpipe import testing
    from mmpipe.records.columns import OPTIONAL_ROW_COLUMNS

    fields = {f["name"]: f for f in _published("multimodal_inputs.json")["fields"]}
    want = {"image_sources": "list<item: binary>", "audio_sources": "list<item: binary>", "image_backend": "string"}
    assert set(OPTIONAL_ROW_COLUMNS) == set(want)
    for name, typ in want.items():
        assert fields[name]["arrow_type"] == typ and fields[name]["nullable"], name
        assert fields[name]["doc"].startswith("optional: ")
    assert fields["pixel_values"]["arrow_type_by_kind"] == {"processor": "list<item: float>"}
    stored = _published("multimodal_inputs.json")["examples"]["generic"]["pixel_values"]
    assert len(stored["shape"]) == 1  # the generic example's pixels are flat, as published
    raw = datasets.Dataset.from_list([{
        "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
        "images": [testing.tiny_image(56, 56)]}]).cast_column("images", datasets.List(datasets.Image(decode=False)))
    for name in ("qwen2_vl", "internvl"):
        enc = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(name), "pixels": "source"},
                      remove_columns=raw.column_names)
        kind = get_family(name).kind
        assert "image_sources" in enc.column_names
        for f in enc.data.table.schema:
            assert f.name in fields, (name, f.name)
            assert str(f.type) == fields[f.name].get("arrow_type_by_kind", {}).get(kind, fields[f.name]["arrow_type"]), \
                (name, f.name, str(f.type))
