"""Language-neutral schema files in ``schemas/``, generated from the records.

Each record type is written as JSON: every column with its Arrow type (as Arrow prints
it), nullability, and the shape/dtype doc. A test regenerates them and fails on drift::

    python -m mmpipe.data.schemas          # rewrite schemas/*.json
"""

from __future__ import annotations

import json
import pathlib
import sys

import pyarrow as pa

SCHEMA_VERSION = 1


def _document(name: str, schema: pa.Schema, doc: str) -> dict:
    return {
        "name": name,
        "schema_version": SCHEMA_VERSION,
        "description": doc,
        "fields": [
            {
                "name": f.name,
                "arrow_type": str(f.type),
                "nullable": f.nullable,
                "doc": (f.metadata or {}).get(b"doc", b"").decode(),
            }
            for f in schema
        ],
    }


def schema_documents() -> dict[str, dict]:
    """File name -> JSON document, for every record type."""
    from mmpipe.records.batch import BatchedMultiModalInputs
    from mmpipe.records.row import MultiModalInputs
    from mmpipe.rema import rema_arrow_schema

    return {
        "multimodal_inputs.json": _document(
            "MultiModalInputs",
            MultiModalInputs.arrow_schema(kind=None),
            "One encoded row of any family as stored in Arrow (the union of the columns every "
            "family kind writes; each field's doc names the kinds that write it where not all: "
            "patches = Qwen2/2.5/3-VL, GLM-4.1V, text; tiles = Gemma 3, InternVL, LLaVA-OneVision; "
            "processor = the generic path, whose processor outputs are further columns named by "
            "generic_layout). A dataset holds the pixel columns of one pixel format only: uint8 "
            "(pixel_values_u8, pixel_values_videos_u8), float32 (pixel_values, pixel_values_videos), "
            "source (image_sources) or none (layout only).",
        ),
        "batched_multimodal_inputs.json": _document(
            "BatchedMultiModalInputs",
            BatchedMultiModalInputs.arrow_schema(),
            "One padded batch as a single Arrow record; torch dtypes as stated per field.",
        ),
        "rema_batch.json": _document(
            "ReMABatch",
            rema_arrow_schema(),
            "A multi-agent turn-taking rollout batch (mmpipe.rema), one Arrow row per question. "
            "Columns named {role}_... repeat for every agent role; tensor columns are stored "
            "right-padded to the batch's common length. Schema metadata: mmpipe.agent_roles "
            "(JSON list, turn order), mmpipe.max_num_turns, mmpipe.family.",
        ),
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def write_schemas(directory: str | pathlib.Path = "schemas") -> list[pathlib.Path]:
    out_dir = pathlib.Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, doc in schema_documents().items():
        path = out_dir / fname
        path.write_text(render(doc))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_schemas(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2] / "schemas"):
        print(p)
