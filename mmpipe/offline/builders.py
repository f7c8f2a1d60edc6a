"""`build_processor` / `build_model` by any name the offline builders know: one entry point over
`mmpipe.offline`'s modules (what ``mmpipe.testing.build_processor`` and ``mmpipe.load_processor("testing:NAME")`` build).

=====================================  =========================================================
names                                  built by
=====================================  =========================================================
qwen2_vl, qwen2_5_vl, qwen3_vl         `mmpipe.offline.processors` / `mmpipe.offline.models`
glm4v, glm46v, gemma3, internvl,       their own modules (`mmpipe.offline.tokenizer.OWN_BUILDERS`)
llava_onevision
qwen3_5, qwen3_5_moe, qwen3_vl_moe     `mmpipe.offline.qwen3_5` (the Qwen3-VL processor)
idefics3, llava, mllama, paligemma,    `mmpipe.offline.other_vlms` (no family-table row: the
minicpmv4_6, minicpmv4_7, ovis2        generic path), `mmpipe.offline.minicpmv`, `mmpipe.offline.ovis2`
qwen2_5_omni, qwen3_omni_moe           the Omni thinkers with audio (generic path, no video processor):
                                       `mmpipe.offline.qwen_omni`, `mmpipe.offline.qwen3_omni`
=====================================  =========================================================

An unknown name raises `ArgumentError` listing every name.
"""

from __future__ import annotations

from typing import Optional

from mmpipe.errors import ArgumentError
from mmpipe.families import DEFAULT_FAMILY
from mmpipe.offline import build_model as _native_model
from mmpipe.offline import build_processor as _native_processor
from mmpipe.offline.other_vlms import (FOREIGN_PROCESSORS, MINICPMV_NAMES, MODELS, MORE_MODELS, OVIS2_NAMES,
                                       build_foreign_model, build_foreign_processor)
from mmpipe.offline.qwen3_5 import MODEL_LINES, build_qwen3_5_processor
from mmpipe.offline.seeded import seeded
from mmpipe.offline.tokenizer import FAMILY_NAMES, OWN_BUILDERS

__all__ = ["PROCESSOR_NAMES", "MODEL_NAMES", "build_processor", "build_model"]

NATIVE = tuple(FAMILY_NAMES) + tuple(OWN_BUILDERS)  # families with a family-table row
_FOREIGN = tuple(dict.fromkeys(n for n in (*FOREIGN_PROCESSORS, *MORE_MODELS, *MINICPMV_NAMES, *OVIS2_NAMES)
                               if n not in NATIVE))
_FOREIGN_MODELS = tuple(dict.fromkeys(n for n in (*MODELS, *MORE_MODELS, *MINICPMV_NAMES, *OVIS2_NAMES)
                                      if n not in NATIVE))
OMNI = {"qwen2_5_omni": "mmpipe.offline.qwen_omni", "qwen3_omni_moe": "mmpipe.offline.qwen3_omni"}  # audio thinkers
PROCESSOR_NAMES = NATIVE + tuple(MODEL_LINES) + _FOREIGN + tuple(OMNI)
MODEL_NAMES = NATIVE + tuple(MODEL_LINES) + _FOREIGN_MODELS + tuple(OMNI)


def _omni(name: str):
    import importlib

    return importlib.import_module(OMNI[name])


def build_processor(family: str = DEFAULT_FAMILY, *, min_pixels: Optional[int] = None,
                    max_pixels: Optional[int] = None):
    """A real processor of ``family`` (any of `PROCESSOR_NAMES`), built offline; a fresh object
    on every call. ``min_pixels`` / ``max_pixels`` apply to the resizing families (the Qwen-VL
    and GLM lines); the others refuse them (set sizes on ``processor.image_processor``)."""
    if family in NATIVE:
        return _native_processor(family, min_pixels=min_pixels, max_pixels=max_pixels)
    if family in MODEL_LINES:  # the models that load with the Qwen3-VL processor
        return build_qwen3_5_processor(min_pixels=min_pixels, max_pixels=max_pixels)
    if family in _FOREIGN or family in OMNI:
        if min_pixels is not None or max_pixels is not None:
            raise ArgumentError(f"build_processor({family!r}): min_pixels / max_pixels apply to the resizing families "
                                "(Qwen-VL, GLM); set the size on the processor's image_processor instead")
        return _omni(family).build_processor() if family in OMNI else build_foreign_processor(family)
    raise ArgumentError(f"unknown offline processor {family!r}; build_processor builds one of {list(PROCESSOR_NAMES)}")


def build_model(family: str = DEFAULT_FAMILY, seed: int = 0):
    """A tiny randomly initialised model matching `build_processor(family)` (any of
    `MODEL_NAMES`): fp32, eval mode; the same ``(family, seed)`` gives the same weights."""
    if family in NATIVE or family in MODEL_LINES:
        return _native_model(family, seed)
    if family in _FOREIGN_MODELS:
        return build_foreign_model(family, seed)
    if family in OMNI:
        return seeded(seed, _omni(family).build_model)
    raise ArgumentError(f"no offline model for {family!r}; build_model builds one of {list(MODEL_NAMES)}")
