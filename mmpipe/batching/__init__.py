"""Batching: stored rows -> model batches, and back.

One module per step, in the order rows flow::

    token_counts.py  an encoded dataset -> each row's tokens and images (token_counts)
    sampler.py  row lengths -> batches of row indices under a token/image budget
                (TokenBudgetBatchSampler, token_efficiency; token_counts re-exported)
    batch_split.py  the sampler's batches split until every rank gets the same number
    checks.py   stored rows -> validated records, typed errors naming row and column (checked_records)
    text.py     the text part of a padded batch (ids, masks, positions, labels), and back
    media_fields.py  the per-item layout (grids, sizes, tile counts) and its offsets, and back
    collate.py  MultiModalInputs rows -> padded BatchedMultiModalInputs (collate, Collator, ArrowRows)
    attention_layers.py  a model's layer types -> whether its rows may share one sequence
    pack_batch.py  a batch's fields + its rows' tokens end to end -> one pack (and which families refuse packing)
    packing.py  rows -> one padding-free [1, T] PackedMultiModalInputs, and back
                (pack, unpack, to_padded, PackingCollator)
    unbatch.py  BatchedMultiModalInputs -> the rows, exactly (unbatch)

Every stage is the same for every family; what differs between patch grids, tiles and the
generic path's processor outputs is asked of the family's media strategy (``fam.media``:
``MEDIA_ITEMS``, ``ROW_FIELDS``, ``collator_state``, ``collate_media``, ``unbatch_media``; `mmpipe.media`).

The functions ``collate`` and ``unbatch`` are not re-exported here: those names are the
submodules (``mmpipe.batching.collate``); use ``mmpipe.collate`` / ``mmpipe.unbatch``.
"""

from __future__ import annotations

from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.batching.checks import check_finite, checked_records
from mmpipe.batching.collate import PADDING_SIDES, ArrowRows, Collator, collator_constants
from mmpipe.batching.packing import PackingCollator, pack, to_padded, unpack
from mmpipe.batching.sampler import COSTS, OVERSIZE, TokenBudgetBatchSampler, token_counts, token_efficiency

__all__ = [
    "COSTS", "ERROR_COLUMN", "OVERSIZE", "PADDING_SIDES", "ArrowRows", "Collator", "PackingCollator",
    "TokenBudgetBatchSampler", "check_finite", "checked_records", "collator_constants", "pack", "to_padded",
    "token_counts", "token_efficiency", "unpack",
]
