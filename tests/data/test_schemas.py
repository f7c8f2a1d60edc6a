"""schemas/ are generated from the code; fail when they drift."""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa

import mmpipe
from mmpipe.data.schemas import render, schema_documents

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "schemas"


def test_schema_files_match_the_code():
    docs = schema_documents()
    on_disk = sorted(p.name for p in SCHEMAS.glob("*.json"))
    assert on_disk == sorted(docs), "run: python -m mmpipe.data.schemas"
    for name, doc in docs.items():
        assert (SCHEMAS / name).read_text() == render(doc), f"{name} drifted from the code; run: python -m mmpipe.data.schemas"


def test_schema_files_are_language_neutral_json():
    doc = json.loads((SCHEMAS / "multimodal_inputs.json").read_text())
    names = [f["name"] for f in doc["fields"]]
    for col in ("input_ids", "position_ids", "image_grid_thw", "pixel_values", "pixel_values_u8",
                "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "rope_delta"):
        assert col in names
    bdoc = json.loads((SCHEMAS / "batched_multimodal_inputs.json").read_text())
    assert "sample_to_image_indices" in [f["name"] for f in bdoc["fields"]]
    assert all(f["doc"] for f in doc["fields"] + bdoc["fields"])


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
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                               "images": [testing.tiny_image(40, 50)]}, proc),
            mmpipe.encode_row({"messages": [{"role": "user", "content": "no image"}]}, proc)]
    batch = mmpipe.collate(rows, processor=proc)
    table = batch.to_arrow()
    assert table.schema.equals(mmpipe.BatchedMultiModalInputs.arrow_schema())
    rec = table.to_pylist()[0]
    assert rec["sample_to_image_indices"] == [[0], []]
    assert rec["input_ids"] == batch.input_ids.tolist()
    assert len(rec["position_ids"]) == 3
