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

# The stage functions share their module's name (mmpipe/encode.py defines encode): importing
# the submodule would bind the *module* to mmpipe.encode, so bind them eagerly. These modules
# import only numpy/pyarrow/PIL at import time (torch and transformers load on use).
from . import _fork  # noqa: E402,F401  (registers the fork marker before any worker forks)
from .collate import ArrowRows, Collator, collate  # noqa: E402
from .encode import (  # noqa: E402
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
from .records import IGNORE_INDEX, BatchedMultiModalInputs, MultiModalInputs, rows_from_arrow  # noqa: E402
from .unbatch import unbatch  # noqa: E402
from . import errors  # noqa: E402  (mmpipe.errors.InputError and its subclasses)

# Names whose modules import torch: loaded on first use.
_LAZY = {
    "get_rope_index": "rope",
    "text_positions": "rope",
    "to_verl_positions": "rope",
    "family_of": "families",
    "ModelFamily": "families",
    "VisionSpec": "images",
    "write_schemas": "schemas",
    "validate_dataset": "validate",
    "check_dataset": "validate",
    "load_encoded": "validate",
    "ValidationReport": "validate",
    "PackingCollator": "packing",
    "PackedMultiModalInputs": "packing",
    "pack": "packing",
    "unpack": "packing",
    "TokenBudgetBatchSampler": "sampler",
    "token_counts": "sampler",
}

__all__ = sorted(
    ["ArrowRows", "rows_from_arrow", "Collator", "collate", "EncodeReport", "Encoder", "compact", "drop_failed", "errors", "encode", "encode_dataset", "encode_row",
     "parse_row", "rows_from_processor_output", "IGNORE_INDEX", "BatchedMultiModalInputs", "MultiModalInputs",
     "unbatch", "testing", *_LAZY]
)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name == "testing":
        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'mmpipe' has no attribute {name!r}")


def __dir__():
    return __all__
