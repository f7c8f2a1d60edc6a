"""Lazy attribute access for mmpipe's packages: a name resolves on first use, so importing a
package does not import the heavy modules behind it (torch, datasets, Ray, vLLM).

Two mechanisms, both resolved once and cached in the package's namespace:

- re-exports (`lazy_exports`): a package ``__init__`` names which module provides which name::

      _EXPORTS = {"mmpipe.data.validate": ("validate_dataset", "load_encoded")}
      __getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())

- submodules (`SubmoduleAccess`, `with_submodules`): ``mmpipe.processors.load_processor`` and
  ``mmpipe.rollout.packers.QwenVLDataPacker`` work after a plain ``import mmpipe``: an attribute
  a package does not have, and that names one of its submodules, imports that submodule (as
  ``import mmpipe.rollout.packers`` would). ``mmpipe`` itself has the class `SubmoduleAccess`,
  which gives every mmpipe subpackage this fallback when the import system binds it on
  ``mmpipe`` (however it was first imported); a package's own ``__getattr__`` is asked first.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Callable, Mapping, Optional, Sequence


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


def submodule(package: str, name: str) -> Optional[types.ModuleType]:
    """``package.name`` imported when ``package`` has such a submodule, else None. Dunder and
    private probes (``__wrapped__``, ``_pytest...``) never import anything."""
    if name.startswith("_") or not name.isidentifier():
        return None
    full = f"{package}.{name}"
    try:
        found = importlib.util.find_spec(full) is not None
    except (ImportError, ValueError):
        return None
    return importlib.import_module(full) if found else None


def submodule_names(module: types.ModuleType) -> list[str]:
    """The public submodules of package ``module`` (from its directory; nothing imported)."""
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(getattr(module, "__path__", ()) or ())
                  if not m.name.startswith("_"))


def with_submodules(module: types.ModuleType) -> None:
    """Give package ``module`` the submodule fallback (module doc): its ``__getattr__`` (if any)
    first, then ``module.<name>`` as a submodule, else ``AttributeError``. Idempotent."""
    own = module.__dict__.get("__getattr__")
    if getattr(own, "_mmpipe_submodules", False) or not hasattr(module, "__path__"):
        return
    package = module.__name__

    def __getattr__(name: str):
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        found = submodule(package, name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return found

    __getattr__._mmpipe_submodules = True  # type: ignore[attr-defined]
    module.__getattr__ = __getattr__  # type: ignore[attr-defined]  (PEP 562 reads the module's dict)


class SubmoduleAccess(types.ModuleType):
    """The class of the ``mmpipe`` module: each subpackage the import system binds on it
    (``setattr(mmpipe, "rollout", module)``, however it was imported) gets `with_submodules`."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            with_submodules(value)
        super().__setattr__(name, value)

    def __reduce__(self):
        # pickled by reference, as pickle/dill/cloudpickle pickle a plain module (their tables
        # key on the exact type), with mmpipe's code stamp: datasets' fingerprint of a function
        # that reads `mmpipe` (``lambda b: mmpipe.encode(b, processor=p)``) moves with mmpipe's
        # version, code and the libraries it runs on, as ``ds.map(mmpipe.encode)``'s does
        from mmpipe.encoding.fingerprint import code_stamp

        return _import_stamped, (self.__name__, *code_stamp())


def _import_stamped(name: str, *stamp) -> types.ModuleType:
    """Unpickle a `SubmoduleAccess` module: imported by name (the stamp is only there to be hashed)."""
    return importlib.import_module(name)


def install(module: types.ModuleType) -> None:
    """Make package ``module`` (``sys.modules["mmpipe"]``, from its own ``__init__``) a
    `SubmoduleAccess`, and give the subpackages already bound on it the fallback."""
    module.__class__ = SubmoduleAccess
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType) and value.__name__.startswith(module.__name__ + "."):
            with_submodules(value)
