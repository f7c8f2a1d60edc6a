"""Language-neutral schema files in ``schemas/``, generated from the records.

Each record type is written as JSON: every column with its Arrow type (as Arrow prints
it), nullability, and the shape/dtype doc, then ``examples``: one tiny encoded example of every
family of the table and of the generic path (`mmpipe.data.schema_examples`: the row as stored,
the batch of it and a text-only row, their pack). A test regenerates them and fails on drift::

    python -m mmpipe.data.schemas          # rewrite schemas/*.json
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Optional

import pyarrow as pa

SCHEMA_VERSION = 2  # 2: one batch/packed schema for every family kind, examples


def _kind_types(schema: pa.Schema) -> dict[str, dict[str, str]]:
    """Column -> {kind: Arrow type} where a family kind (`mmpipe.media.KINDS`) stores a column of
    the union row schema with another type (the tiles' flat ``list<uint8>`` pixels)."""
    from mmpipe.media import KINDS
    from mmpipe.records.row import MultiModalInputs

    out: dict[str, dict[str, str]] = {}
    for kind in KINDS:
        for f in MultiModalInputs.arrow_schema(kind=kind):
            if f.name in schema.names and not f.type.equals(schema.field(f.name).type):
                out.setdefault(f.name, {})[kind] = str(f.type)
    return out


# The optional stored columns (`mmpipe.records.columns.OPTIONAL_ROW_COLUMNS`: a row carries them
# only when it needs them) with their Arrow types, published after the columns every row has.
def _optional_types() -> dict[str, pa.DataType]:
    from mmpipe.records.columns import SOURCE_LIST_TYPE

    return {"image_backend": pa.string(), "image_sources": SOURCE_LIST_TYPE, "audio_sources": SOURCE_LIST_TYPE}


# Columns the generic path (kind processor) stores under a row-schema name with its own type:
# the processor's own outputs (named by generic_layout), flat, their shapes in generic_shapes.
PROCESSOR_OUTPUT_TYPES = {"pixel_values": (pa.list_(pa.float32()), "kind processor: float32 [prod(shape)] the "
                                            "processor's own pixel_values, flat; its shape in generic_shapes")}


def row_schema() -> pa.Schema:
    """The published stored-row schema: every kind's columns (`MultiModalInputs.arrow_schema`
    with ``kind=None``), then the optional ones (`OPTIONAL_ROW_COLUMNS`), each with its doc."""
    from mmpipe.records.columns import OPTIONAL_ROW_COLUMNS
    from mmpipe.records.row import MultiModalInputs

    schema = MultiModalInputs.arrow_schema(kind=None)
    fields = []
    for f in schema:
        extra = PROCESSOR_OUTPUT_TYPES.get(f.name)
        if extra is not None:
            f = f.with_metadata({"doc": (f.metadata or {}).get(b"doc", b"").decode() + "; " + extra[1]})
        fields.append(f)
    types = _optional_types()
    fields += [pa.field(name, types[name], nullable=True, metadata={"doc": "optional: " + doc})
               for name, doc in OPTIONAL_ROW_COLUMNS.items()]
    return pa.schema(fields)


def _row_kind_types(schema: pa.Schema) -> dict[str, dict[str, str]]:
    """`_kind_types` of the row schema, plus the generic path's own outputs under row-schema
    names (`PROCESSOR_OUTPUT_TYPES`)."""
    out = _kind_types(schema)
    for name, (typ, _) in PROCESSOR_OUTPUT_TYPES.items():
        out.setdefault(name, {})["processor"] = str(typ)
    return out


def _document(name: str, schema: pa.Schema, doc: str, examples: Optional[dict] = None,
              kind_types: Optional[dict] = None) -> dict:
    kind_types = kind_types or {}
    out = {
        "name": name,
        "schema_version": SCHEMA_VERSION,
        "description": doc,
        "fields": [
            {
                "name": f.name,
                "arrow_type": str(f.type),
                "nullable": f.nullable,
                "doc": (f.metadata or {}).get(b"doc", b"").decode(),
                **({"arrow_type_by_kind": kind_types[f.name]} if f.name in kind_types else {}),
            }
            for f in schema
        ],
    }
    if examples is not None:
        out["examples"] = examples
    return out


def schema_documents() -> dict[str, dict]:
    """File name -> JSON document, for every record type."""
    from mmpipe.data.schema_examples import batch_examples, packed_examples, row_examples
    from mmpipe.records.batch import BatchedMultiModalInputs
    from mmpipe.records.packed import PackedMultiModalInputs
    from mmpipe.records.row import MultiModalInputs
    from mmpipe.rema import rema_arrow_schema

    return {
        "multimodal_inputs.json": _document(
            "MultiModalInputs",
            row_schema(),
            "One encoded row of any family as stored in Arrow (the union of the columns every "
            "family kind writes; each field's doc names the kinds that write it where not all: "
            "patches = Qwen2/2.5/3-VL, GLM-4.1V, text; tiles = Gemma 3, InternVL, LLaVA-OneVision; "
            "processor = the generic path, whose processor outputs are further columns named by "
            "generic_layout). A dataset holds the pixel columns of one pixel format only: uint8 "
            "(pixel_values_u8, pixel_values_videos_u8), float32 (pixel_values, pixel_values_videos), "
            "source (image_sources) or none (layout only). Examples: per family, one row with one "
            "28x28 image (the text family: text only) as stored, long values shortened to their shape "
            "and first values. A field's arrow_type_by_kind gives the type a family kind stores "
            "where it differs. Fields whose doc starts with 'optional:' are stored only by the rows "
            "that need them (image_sources with pixels=source, image_backend, audio_sources).",
            row_examples(),
            _row_kind_types(row_schema()),
        ),
        "batched_multimodal_inputs.json": _document(
            "BatchedMultiModalInputs",
            BatchedMultiModalInputs.arrow_schema(),
            "One padded batch of any family as a single Arrow record; torch dtypes as stated per field. "
            "Examples: per family, the batch of its example row and a text-only row (left padding), "
            "shortened as in multimodal_inputs.json.",
            batch_examples(),
        ),
        "packed_multimodal_inputs.json": _document(
            "PackedMultiModalInputs",
            PackedMultiModalInputs.arrow_schema(),
            "n rows of one family packed into one padding-free [1, T] sequence, as a single Arrow record: "
            "the pack's token columns, then its rows' batch (pixels, layouts, offsets). Examples: per "
            "family, the pack of the batch example's two rows, or why the family's rows are not packed.",
            packed_examples(),
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


INLINE_WIDTH = 88


def render(doc: dict) -> str:
    """The JSON text of a document: indented by 2; a list, or a dict without a ``name`` (not a
    field entry), that fits in `INLINE_WIDTH` characters on one line (so the examples' shapes
    and first values read at a glance)."""
    return _render(doc, 0) + "\n"


def _render(value, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    flat = json.dumps(value)
    if len(flat) <= INLINE_WIDTH and not (isinstance(value, dict) and "name" in value):
        return flat
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_render(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) and v for v in value):
        return "[\n" + ",\n".join(f"{inner}{_render(v, depth + 1)}" for v in value) + f"\n{pad}]"
    return json.dumps(value)


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
    repo_schemas = pathlib.Path(__file__).resolve().parents[2] / "schemas"
    for p in write_schemas(sys.argv[1] if len(sys.argv) > 1 else repo_schemas):
        print(p)
