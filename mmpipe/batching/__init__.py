"""Batching: stored rows -> model batches, and back.

One module per step, in the order rows flow::

    sampler.py  row lengths -> batches of row indices under a token/image budget
                (TokenBudgetBatchSampler, token_counts, token_efficiency)
    checks.py   stored rows -> validated records, typed errors naming row and column (checked_records)
    collate.py  MultiModalInputs rows -> padded BatchedMultiModalInputs (collate, Collator, ArrowRows)
    packing.py  rows -> one padding-free [1, T] PackedMultiModalInputs, and back
                (pack, unpack, to_padded, PackingCollator)
    tiled_packing.py  the same for tiled-family rows (InternVL, LLaVA-OneVision) -> PackedMultiModalInputs
    unbatch.py  BatchedMultiModalInputs -> the rows, exactly (unbatch)

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
    "TokenBudgetBatchSampler", "check_finite", "checked_records", "collator_constants", "pack", "to_padded", "token_counts", "token_efficiency", "unpack",
]
