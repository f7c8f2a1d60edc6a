"""What the offline builders do differently on the two transformers lines mmpipe supports
(4.57.x and 5.x), in one place so every family module builds the same way on both:

- `pil_image_processor`: 5.x names the PIL/numpy image processors ``*ImageProcessorPil``
  (``Gemma3ImageProcessorPil``); 4.57 has the same backend under the plain name
  (``Gemma3ImageProcessor``; its ``*Fast`` class is the torchvision one).
- `image_only_subclass`: a stock processor class without its video processor. 5.x's
  ``ProcessorMixin`` reads the sub-processors from the ``__init__`` signature; 4.57's from the
  class's ``attributes`` list, so that list is overridden too (4.57 otherwise refuses the
  missing video processor: "Received a NoneType for argument video_processor").
- `classes_by_name`: a module ``__getattr__`` that finds such run-time classes by name, so their
  processors pickle (spawn DataLoader workers, ``IterableDataset.map(..., fn_kwargs=...)``).
- `rope_config_fields`: 5.x takes ``rope_parameters``; 4.57 takes ``rope_theta`` and
  ``partial_rotary_factor`` as config fields and the rest (``mrope_section``) as ``rope_scaling``.
"""

from __future__ import annotations

from typing import Callable, Optional

from mmpipe.compat import is_transformers_5

__all__ = ["pil_image_processor", "image_only_subclass", "classes_by_name", "rope_config_fields"]

_PIL_SUFFIX = "Pil"


def pil_image_processor(name: str) -> type:
    """``transformers.<name>`` (a 5.x ``*ImageProcessorPil`` name), or on 4.x the class of the
    same backend: ``name`` without its ``Pil`` suffix."""
    import transformers

    if is_transformers_5() or not name.endswith(_PIL_SUFFIX):
        return getattr(transformers, name)
    return getattr(transformers, name[: -len(_PIL_SUFFIX)])


def image_only_subclass(base: type, *, module: str, doc: str | None = None, **class_attrs) -> type:
    """``ImageOnly<base>``: ``base`` whose ``__init__`` takes no video processor (the stock one's
    class check fails without torchvision, even for None). ``base`` stays in the MRO, so
    `mmpipe.families.family_of` recognises it; ``class_attrs`` are set on the class (e.g. a
    looser ``tokenizer_class``)."""

    attrs = {"__init__": _image_only_init(base), "__module__": module, **class_attrs}
    if doc is not None:
        attrs["__doc__"] = doc
    if not is_transformers_5():  # 4.x's ProcessorMixin takes its sub-processors from this list
        attrs["attributes"] = ["image_processor", "tokenizer"]
    return type("ImageOnly" + base.__name__, (base,), attrs)


_SUB_PROCESSORS = ("self", "image_processor", "tokenizer", "video_processor", "chat_template")


def _image_only_init(base: type):
    """``__init__(self, image_processor=None, tokenizer=None, chat_template=None, <base's own
    settings>, **kwargs)`` calling ``base.__init__`` with no video processor. The settings (LLaVA-
    OneVision's ``num_image_tokens``, InternVL's ``image_seq_length``, ...) are real parameters,
    with ``base``'s defaults: transformers saves a processor's settings by its ``__init__``
    signature and loads only those named in ``__init__.__code__.co_varnames``, so behind a bare
    ``**kwargs`` a saved checkpoint's settings were dropped on load (LLaVA-OneVision: None, then a
    TypeError; InternVL: ``image_seq_length`` back to 256). Hence a generated function."""
    import inspect

    settings = [p for p in inspect.signature(base.__init__).parameters.values()
                if p.name not in _SUB_PROCESSORS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in settings if p.name.isidentifier()]
    src = ("def __init__(self, image_processor=None, tokenizer=None, chat_template=None, "
           + "".join(f"{n}=_DEFAULTS[{n!r}], " for n in names) + "**kwargs):\n"
           "    _BASE.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, "
           + "".join(f"{n}={n}, " for n in names) + "**kwargs)\n")
    namespace = {"_BASE": base, "_DEFAULTS": {p.name: None if p.default is p.empty else p.default for p in settings}}
    exec(compile(src, f"<image-only {base.__name__}.__init__>", "exec"), namespace)  # noqa: S102 - see above
    return namespace["__init__"]


def classes_by_name(module: str, find: Callable[[str], Optional[type]]) -> Callable[[str], type]:
    """A module-level ``__getattr__`` (PEP 562) for ``module``, whose processor classes are built at
    run time (`image_only_subclass`, ``type(...)``): pickle stores a class as ``module.name`` and
    loads it by that lookup, so without one a processor cannot cross a process boundary (spawn /
    forkserver DataLoader workers running ``IterableDataset.map(mmpipe.encode, fn_kwargs={"processor":
    p})``, a pickled `mmpipe.Encoder`). ``find(name)``: the class of that name (the one object the
    module builds: cached), or None."""

    def __getattr__(name: str) -> type:
        cls = None if name.startswith("__") else find(name)
        if cls is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return cls

    return __getattr__


def rope_config_fields(rope: dict) -> dict:
    """A text config's rope keyword arguments from 5.x's ``rope_parameters`` dict ``rope``
    (``rope_type``, ``rope_theta``, optional ``partial_rotary_factor``, ``mrope_section``, ...):
    ``{"rope_parameters": rope}`` on 5.x; on 4.x ``rope_theta`` and ``partial_rotary_factor``
    as fields and the rest as ``rope_scaling``."""
    rope = dict(rope)
    if is_transformers_5():
        return {"rope_parameters": rope}
    fields = {"rope_theta": rope.pop("rope_theta")}
    if "partial_rotary_factor" in rope:
        fields["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    return dict(fields, rope_scaling=rope)
