"""The InternVL and LLaVA-OneVision offline builders by family name (`TILED2_FAMILIES`), for
code and tests that run over both families alike::

    >>> proc = build_tiled2_processor("internvl")           # doctest: +SKIP
    >>> model = build_tiled2_model("internvl")              # doctest: +SKIP

Each family's builders live in its own module (`mmpipe.offline.internvl`,
`mmpipe.offline.onevision`; their shared parts in `mmpipe.offline.tiny_towers`); this module
only picks one by name and refuses any other name. It sits above both so that neither family
module needs to import it.
"""

from __future__ import annotations

from mmpipe.errors import ArgumentError
from mmpipe.offline.internvl import (
    build_internvl_model,
    build_internvl_processor,
    save_internvl_checkpoint,
)
from mmpipe.offline.onevision import (
    build_onevision_model,
    build_onevision_processor,
    save_onevision_checkpoint,
)

__all__ = ["TILED2_FAMILIES", "build_tiled2_processor", "build_tiled2_model",
           "save_tiled2_checkpoint"]

_PROCESSORS = {"internvl": build_internvl_processor, "llava_onevision": build_onevision_processor}
_MODELS = {"internvl": build_internvl_model, "llava_onevision": build_onevision_model}
_CHECKPOINTS = {"internvl": save_internvl_checkpoint, "llava_onevision": save_onevision_checkpoint}
TILED2_FAMILIES = tuple(_PROCESSORS)  # ("internvl", "llava_onevision")


def build_tiled2_processor(name: str, **image_kwargs):
    """A real InternVL or LLaVA-OneVision processor (``name`` in `TILED2_FAMILIES`) with 32x32
    tiles; ``image_kwargs`` override the image processor's settings (e.g. ``max_patches=12``,
    ``image_grid_pinpoints=...``). A fresh object on every call."""
    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"unknown tiled offline processor {name!r}; use one of "
                            f"{TILED2_FAMILIES}")
    return _PROCESSORS[name](**image_kwargs)


def build_tiled2_model(name: str, seed: int = 0):
    """A tiny randomly initialised model matching `build_tiled2_processor(name)`: fp32, eval
    mode, eager attention; a deep copy of a cached model per call."""
    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"no tiled offline model for {name!r}; build_tiled2_model builds "
                            f"one of {TILED2_FAMILIES}")
    return _MODELS[name](seed)


def save_tiled2_checkpoint(name: str, path, *, seed: int = 0):
    """Write a tiny float32 checkpoint of ``name`` that vLLM loads (``vllm.LLM(model=path)``;
    see `mmpipe.offline.internvl.save_internvl_checkpoint`,
    `mmpipe.offline.onevision.save_onevision_checkpoint`). Returns the path."""
    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"no tiled checkpoint for {name!r}; save_tiled2_checkpoint saves "
                            f"one of {TILED2_FAMILIES}")
    return _CHECKPOINTS[name](path, seed=seed)
