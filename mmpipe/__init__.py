"""mmpipe: multimodal (vision-language) training and RL data through ``datasets``,
DataLoaders, transformers and vLLM without losing an image, a token or a position.

One folder per stage, in the order data flows::

    families.py  the ONE table of model-family rules (tokens, patch/merge sizes, rope variant)
    records/     every record type and its Arrow codec (row, batch, pack, rollout, ReMA, reward)
    images/      image loading, resize, compact uint8 patches <-> float32 pixel_values
    encoding/    raw row (chat messages + images) -> MultiModalInputs (the dataset.map function)
    batching/    rows -> BatchedMultiModalInputs (collate), and back (unbatch); packing, sampler
    rope.py      vectorised M-RoPE positions (get_rope_index)
    rollout/     batch -> engine inputs -> engines -> RolloutSample rows; multi-turn; packers
    rema/ reward/ multi-agent rollouts; VLM-judge rewards
    hosts/       inside host trainers: transformers Trainer / TRL (TrainerCollator), verl (verl_rows)
    view/ data/ cli/  HTML/text/plots; filters, validation, streaming, Ray; the mmpipe command
    offline/     tokenizer, processor and tiny model built locally (no download)
    testing/     the offline fixtures and the ONE invariant harness for tests

Public names of the README are bound here; torch-backed ones load on first use, so
``import mmpipe`` stays fast. Subpackages and their modules are attributes on first use too
(``mmpipe.processors.load_processor``, ``mmpipe.rollout.packers.QwenVLDataPacker`` after a plain
``import mmpipe``; `mmpipe._lazy`): nothing optional (vLLM, Ray, cosmos-rl) loads before it is used.
"""

from __future__ import annotations

import sys

__version__ = "0.1.0"

# These modules import only numpy/pyarrow/PIL at import time (torch and transformers load on use).
from mmpipe import _lazy  # noqa: E402
from mmpipe._lazy import lazy_exports  # noqa: E402

_lazy.install(sys.modules[__name__])  # every subpackage bound from here on reaches its modules by attribute
from mmpipe import _fork  # noqa: E402,F401  (registers the fork marker before any worker forks)
from mmpipe import errors  # noqa: E402  (mmpipe.errors.InputError and its subclasses)
from mmpipe.batching.collate import ArrowRows, Collator, collate  # noqa: E402
from mmpipe.batching.unbatch import unbatch  # noqa: E402
from mmpipe.encoding.dataset import EncodeReport, drop_failed, encode, encode_dataset, encode_row, map_kwargs  # noqa: E402
from mmpipe.encoding.encoder import Encoder  # noqa: E402
from mmpipe.encoding.parse import parse_row  # noqa: E402
from mmpipe.encoding.processor_rows import compact, rows_from_processor_output  # noqa: E402
from mmpipe.records.arrow import rows_from_arrow  # noqa: E402
from mmpipe.records.batch import BatchedMultiModalInputs  # noqa: E402
from mmpipe.records.columns import IGNORE_INDEX  # noqa: E402
from mmpipe.records.row import MultiModalInputs  # noqa: E402
from mmpipe import view  # noqa: E402,F401  (registers the records' Jupyter/text renderers; no matplotlib/torch)

# Names whose modules import torch (or are rarely needed): loaded on first use.
_EXPORTS = {
    "mmpipe.rope": ("get_rope_index", "text_positions", "to_verl_positions"),
    "mmpipe.families": ("family_of", "ModelFamily"),
    "mmpipe.images.spec": ("VisionSpec",),
    "mmpipe.data.schemas": ("write_schemas",),
    "mmpipe.data.validate": ("validate_dataset", "check_dataset", "load_encoded", "ValidationReport"),
    "mmpipe.batching.packing": ("PackingCollator", "pack", "unpack"),
    "mmpipe.records.packed": ("PackedMultiModalInputs",),
    "mmpipe.batching.sampler": ("TokenBudgetBatchSampler", "token_counts"),
}
_lazy_getattr, _, _LAZY_NAMES = lazy_exports(__name__, _EXPORTS, globals())

__all__ = sorted(
    ["ArrowRows", "rows_from_arrow", "Collator", "collate", "EncodeReport", "Encoder", "compact", "drop_failed", "errors",
     "encode", "encode_dataset", "encode_row", "map_kwargs", "parse_row", "rows_from_processor_output", "IGNORE_INDEX",
     "BatchedMultiModalInputs", "MultiModalInputs", "unbatch", "testing", *_LAZY_NAMES]
)


def __getattr__(name: str):
    try:
        return _lazy_getattr(name)
    except AttributeError:
        pass
    found = _lazy.submodule(__name__, name)  # mmpipe.rollout, mmpipe.processors, mmpipe.testing, ...
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found


def __dir__():
    return sorted(set(__all__) | set(_lazy.submodule_names(sys.modules[__name__])))
