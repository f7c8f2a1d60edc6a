"""Lazy re-exports for a package ``__init__``: a name resolves to its module's attribute on first
use, so importing the package does not import the heavy modules behind it (torch, datasets, Ray).

    _EXPORTS = {"mmpipe.data.validate": ("validate_dataset", "load_encoded")}
    __getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping, Sequence


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]], namespace: dict,
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``: ``exports`` maps a module path to the
    names it provides; a resolved name is cached in ``namespace`` (the package's globals)."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(where) | set(namespace))

    return __getattr__, __dir__, sorted(where)
