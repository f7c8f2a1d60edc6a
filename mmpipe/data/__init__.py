"""Dataset-level tools around the encode stage: choose rows, check stored rows, stream, scale out.

One module per step::

    filters.py    raw rows -> token counts, keep rows within a token range
                  (TokenCounter, token_lengths, filter_by_length)
    streaming.py  a stream per data-parallel rank, encoded on the fly
                  (shard_for_rank, encode_stream, undecoded_stream, exactly_once, load_loader_state)
    ray_data.py   encode with Ray Data: rows batches -> Arrow tables of stored rows (RayBatchEncoder,
                  encode_with_ray sized from the cluster's CPUs)
    object_store.py  encoded shards on S3-compatible object storage: write, stream into the Collator,
                  validate and load (write_shards, stream_encoded, open_table, DamagedShardError)
    loading.py    any stored dataset (directory, parquet, Arrow, table) -> one Arrow table
    validate.py   stored rows vs the schema and their invariants, every family (validate_dataset,
                  load_encoded); what differs per kind: ``fam.media`` (expected_columns,
                  dataset_checks, row_checks)
    column_rules.py   what a stored column must be (ExpectedColumn)
    validate_columns.py  the columns and their Arrow types (check_columns), with the safe repairs
    validate_rows.py  one family per dataset, then every row read as collate reads it
    report.py     what validation returns (ValidationReport, Issue, SchemaError)
    repair.py     the safe repairs of validate_dataset(fix=True): lossless casts, older layouts
    schemas.py    the stored-row schemas as JSON documents (write_schemas)

Names are re-exported lazily (``mmpipe.data.validate_dataset``): the modules import
``datasets``, Ray or the encoder on their own, only when used.
"""

from __future__ import annotations

from mmpipe._lazy import lazy_exports

_EXPORTS = {
    "mmpipe.data.filters": ("TokenCounter", "TokenLengths", "LengthFilterReport", "token_lengths",
        "filter_by_length"),
    "mmpipe.data.streaming": ("STRATEGIES", "Coverage", "shard_for_rank", "encode_stream", "undecoded_stream",
        "exactly_once", "epoch_shuffle", "load_loader_state"),
    "mmpipe.data.ray_data": ("RayBatchEncoder", "batch_rows", "rows_to_arrow", "cluster_workers", "encode_with_ray"),
    "mmpipe.data.object_store": ("stream_encoded", "write_shards", "open_table", "read_table", "list_shards",
        "DamagedShardError"),
    "mmpipe.data.loading": ("load_table", "dataset_table", "table_to_dataset"),
    "mmpipe.data.validate": ("BOOKKEEPING", "REENCODE", "SchemaError", "Issue", "ValidationReport",
        "validate_dataset", "check_dataset", "load_encoded", "dataset_family"),
    "mmpipe.data.column_rules": ("ExpectedColumn",),
    "mmpipe.data.repair": ("lossless_cast", "is_u8_list", "u8_list_to_binary", "add_empty_column",
        "recompute_rope_deltas"),
    "mmpipe.data.schemas": ("SCHEMA_VERSION", "schema_documents", "render", "write_schemas"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
