"""Dataset-level tools around the encode stage: choose rows, check stored rows, stream, scale out.

One module per step::

    filters.py    raw rows -> token counts, keep rows within a token range
                  (TokenCounter, token_lengths, filter_by_length)
    streaming.py  a stream per data-parallel rank, encoded on the fly
                  (shard_for_rank, encode_stream, exactly_once)
    ray_data.py   encode with Ray Data: rows batches -> Arrow tables of stored rows (RayBatchEncoder)
    loading.py    any stored dataset (directory, parquet, Arrow, table) -> one Arrow table
    validate.py   stored rows vs the schema and their invariants (validate_dataset, load_encoded)
    repair.py     the safe repairs of validate_dataset(fix=True): lossless casts, older layouts
    schemas.py    the stored-row schemas as JSON documents (write_schemas)

Names are re-exported lazily (``mmpipe.data.validate_dataset``): the modules import
``datasets``, Ray or the encoder on their own, only when used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "filters": ("TokenCounter", "TokenLengths", "LengthFilterReport", "token_lengths", "filter_by_length"),
    "streaming": ("STRATEGIES", "Coverage", "shard_for_rank", "encode_stream", "exactly_once"),
    "ray_data": ("RayBatchEncoder", "batch_rows", "rows_to_arrow"),
    "loading": ("load_table", "dataset_table", "table_to_dataset"),
    "validate": ("REQUIRED", "DEFAULTABLE", "BOOKKEEPING", "REENCODE", "SchemaError", "Issue", "ValidationReport",
                 "validate_dataset", "check_dataset", "load_encoded"),
    "repair": ("lossless_cast", "is_u8_list", "u8_list_to_binary", "add_empty_column", "recompute_rope_deltas"),
    "schemas": ("SCHEMA_VERSION", "schema_documents", "render", "write_schemas"),
}
_LAZY = {name: f"mmpipe.data.{module}" for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpipe.data' has no attribute {name!r}")


def __dir__():
    return sorted(set(__all__) | set(globals()))
