"""The `Encoder`'s option checks: accepted policies and the values refused before any work."""

from __future__ import annotations

import numpy as np

from mmpipe.errors import ArgumentError

TRUNCATION_POLICIES = ("raise", "drop", "truncate_text")
ERROR_POLICIES = ("raise", "skip")


def check_choice(name: str, value, accepted: tuple) -> None:
    if value not in accepted:
        raise ArgumentError(f"{name} must be one of {accepted}, got {value!r}")


def check_options(o: dict) -> None:
    """Refuse option values that silently do the wrong thing (max_length <= 0 cuts every token), before any work."""
    for name, low, kinds in (("max_length", 1, (int, np.integer)), ("threads", 0, (int, np.integer)),
                             ("min_pixels", 0, (int, float, np.number)), ("max_pixels", 0, (int, float, np.number))):
        if o[name] is not None and (isinstance(o[name], bool) or not isinstance(o[name], kinds) or o[name] < low):
            raise ArgumentError(f"{name} must be a number >= {low} (an int for counts) or None, got {o[name]!r}")
    for name in ("images_column", "tools_column"):
        if not isinstance(o[name], str) or not o[name]:
            raise ArgumentError(f"{name} must be a column name (a non-empty str), got {o[name]!r}")
