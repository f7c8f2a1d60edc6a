"""Seeded construction of the tiny offline models, in one place: every builder draws its random
weights from its ``seed`` without moving the caller's torch RNG (a fixture must not change a
test's random stream), in float32.

    >>> model = seeded_model("Glm4vForConditionalGeneration", config, 0, attn_implementation="eager")  # doctest: +SKIP
"""

from __future__ import annotations

__all__ = ["seeded_model"]


def seeded_model(class_name: str, config, seed: int, **kwargs):
    """``transformers.<class_name>._from_config(config, dtype=float32, **kwargs)`` with its
    weights drawn from ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the
    caller's CPU RNG state is restored afterwards). The same (config, seed) gives the same
    weights; the model is in train mode as ``_from_config`` leaves it."""
    import torch
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(transformers, class_name)._from_config(config, dtype=torch.float32, **kwargs)
