"""Media strategies: what differs between the kinds of model family (`ModelFamily.kind`), and
nothing else. Every stage (encode, collate, pack, unbatch, validate, the views) works on the one
record type, `mmpipe.records.MultiModalInputs`, and asks the row's family's strategy
(``fam.media``) for the part that differs:

=============  ===================================================================================
kind           strategy
=============  ===================================================================================
``patches``    `mmpipe.media.patches`: patch grids ``image_grid_thw`` [I, 3], uint8 patches
               [N, 3*p*p] expanded to ``pixel_values`` [N, 3*T*p*p] at collate (Qwen-VL, GLM-4.1V,
               the text family)
``tiles``      `mmpipe.media.tiles`: fixed-size uint8 tiles [N, S, S, 3] per image (``image_hw``,
               ``tiles_per_image``), the processor's normalisation at collate (Gemma 3, InternVL,
               LLaVA-OneVision)
``processor``  `mmpipe.media.processor`: whatever the processor's own call returns, typed by its
               `ProcessorLayout` (the generic path)
=============  ===================================================================================

A strategy (`Strategy`) is a kind's modules, one per stage (`KINDS`): its stored columns and
rollout answers, encode, collate, validate, view; what a kind does not define is the shared
answer of `mmpipe.media.defaults` (a kind without the feature).
"""

from __future__ import annotations

import functools
import importlib

from mmpipe.errors import ArgumentError

# each kind's modules, in lookup order: a name is the first module's that defines it, else
# `mmpipe.media.defaults`'s (stage by stage: rollout / storage, encode, collate, validate, view)
KINDS = {kind: (kind, f"{kind}_encode", f"{kind}_collate", f"{kind}_validate", f"{kind}_view")
         for kind in ("patches", "tiles")}
KINDS["processor"] = ("processor", "processor_encode", "processor_probe", "processor_collate", "processor_view")


_NONE = object()


class Strategy:
    """One kind of family: the names of its modules (`KINDS`), first found first, over
    `mmpipe.media.defaults`. The stages ask it (``fam.media.<name>``); one object per kind."""

    def __init__(self, kind: str):
        self.kind = kind
        names = [f"mmpipe.media.{m}" for m in KINDS[kind]] + ["mmpipe.media.defaults"]
        self._modules = [importlib.import_module(n) for n in names]

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for module in self._modules:
            value = vars(module).get(name, _NONE)
            # a function a module imported from elsewhere is not its answer
            if value is not _NONE and getattr(value, "__module__", module.__name__) in (module.__name__, None):
                setattr(self, name, value)  # found once
                return value
        raise AttributeError(f"the {self.kind} kind (mmpipe.media) has no {name!r}")

    def __repr__(self) -> str:
        return f"<mmpipe.media strategy {self.kind!r}>"


@functools.lru_cache(maxsize=None)
def _strategy(kind: str) -> Strategy:
    return Strategy(kind)


def strategy(kind: str) -> Strategy:
    """The strategy of a family kind (its modules imported on first use)."""
    if kind not in KINDS:
        raise ArgumentError(f"unknown family kind {kind!r}; known: {sorted(KINDS)}")
    return _strategy(kind)
