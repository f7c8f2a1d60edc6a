"""Seeded construction of the tiny offline models, in one place: every builder draws its random
weights from its ``seed`` without moving the caller's torch RNG (a fixture must not change a
test's random stream). `seeded_model` builds a transformers class from a config in float32;
`seeded` runs any builder so.

    >>> model = seeded_model("Glm4vForConditionalGeneration", config, 0, attn_implementation="eager")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")

__all__ = ["seeded", "seeded_model"]


def seeded(seed: int, build: Callable[..., T], *args, **kwargs) -> T:
    """``build(*args, **kwargs)`` with torch's CPU RNG seeded by ``torch.manual_seed(seed)``
    inside ``torch.random.fork_rng`` (the caller's RNG state is restored afterwards)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(*args, **kwargs)


def seeded_model(class_name: str, config, seed: int, **kwargs):
    """``transformers.<class_name>._from_config(config, dtype=float32, **kwargs)``, `seeded`:
    the same (config, seed) gives the same weights; the model is in train mode as
    ``_from_config`` leaves it."""
    import torch
    import transformers

    return seeded(seed, getattr(transformers, class_name)._from_config, config, dtype=torch.float32, **kwargs)
