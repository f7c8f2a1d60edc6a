"""mmpipe: multimodal (vision-language) training and RL data through ``datasets``,
DataLoaders, transformers and vLLM without losing an image, a token or a position.

Stages, in the order data flows (one module each)::

    encode.py   raw row (chat messages + images)   -> MultiModalInputs      (dataset.map)
    collate.py  MultiModalInputs rows               -> BatchedMultiModalInputs (DataLoader)
    unbatch.py  BatchedMultiModalInputs             -> MultiModalInputs rows
    rope.py     vectorised M-RoPE positions (get_rope_index)
    records.py  the typed records and their Arrow schemas
    families.py per-family constants (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, text)
    images.py   image loading, resize, compact uint8 patches <-> float32 pixel_values
    testing.py  offline processors and tiny models for tests, demos and notebooks

Public names are imported lazily so ``import mmpipe`` stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# These modules import only numpy/pyarrow/PIL at import time (torch and transformers load on use).
from mmpipe import _fork  # noqa: E402,F401  (registers the fork marker before any worker forks)
from mmpipe import errors  # noqa: E402  (mmpipe.errors.InputError and its subclasses)
from mmpipe.batching.collate import ArrowRows, Collator, collate  # noqa: E402
from mmpipe.batching.unbatch import unbatch  # noqa: E402
from mmpipe.encoding.encoder import (  # noqa: E402
    EncodeReport,
    Encoder,
    compact,
    drop_failed,
    encode,
    encode_dataset,
    encode_row,
    parse_row,
    rows_from_processor_output,
)
from mmpipe.records.arrow import rows_from_arrow  # noqa: E402
from mmpipe.records.batch import BatchedMultiModalInputs  # noqa: E402
from mmpipe.records.columns import IGNORE_INDEX  # noqa: E402
from mmpipe.records.row import MultiModalInputs  # noqa: E402

# Names whose modules import torch (or are rarely needed): loaded on first use.
_LAZY = {
    "get_rope_index": "mmpipe.rope",
    "text_positions": "mmpipe.rope",
    "to_verl_positions": "mmpipe.rope",
    "family_of": "mmpipe.families",
    "ModelFamily": "mmpipe.families",
    "VisionSpec": "mmpipe.images.spec",
    "write_schemas": "mmpipe.data.schemas",
    "validate_dataset": "mmpipe.data.validate",
    "check_dataset": "mmpipe.data.validate",
    "load_encoded": "mmpipe.data.validate",
    "ValidationReport": "mmpipe.data.validate",
    "PackingCollator": "mmpipe.batching.packing",
    "PackedMultiModalInputs": "mmpipe.records.packed",
    "pack": "mmpipe.batching.packing",
    "unpack": "mmpipe.batching.packing",
    "TokenBudgetBatchSampler": "mmpipe.batching.sampler",
    "token_counts": "mmpipe.batching.sampler",
}

__all__ = sorted(
    ["ArrowRows", "rows_from_arrow", "Collator", "collate", "EncodeReport", "Encoder", "compact", "drop_failed", "errors", "encode", "encode_dataset", "encode_row",
     "parse_row", "rows_from_processor_output", "IGNORE_INDEX", "BatchedMultiModalInputs", "MultiModalInputs",
     "unbatch", "testing", *_LAZY]
)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "testing":
        return importlib.import_module("mmpipe.testing")
    raise AttributeError(f"module 'mmpipe' has no attribute {name!r}")


def __dir__():
    return __all__
