"""Loading a processor offline: from a directory, ``testing:FAMILY``, a factory or an object.

One loader for every place that takes a processor by name (``mmpipe encode --processor``,
`mmpipe.data.ray_data.RayBatchEncoder` on each Ray worker)::

    load_processor("/models/Qwen2.5-VL-3B-Instruct")   # AutoProcessor, local files only
    load_processor("testing:qwen3_vl")                  # the offline processors of mmpipe.offline
    load_processor("testing:gemma3")                    # ... also internvl, llava_onevision
    load_processor(lambda: build_my_processor())        # a zero-argument factory, called here
    load_processor(processor)                           # a processor / tokenizer, returned as is

A Qwen-VL directory whose stock processor class cannot be built here (transformers 5.x also
builds a video processor, which may need torchvision), or one saved from a ``testing:``
processor (a class name AutoProcessor cannot resolve), loads as the image-only subclass of
`mmpipe.offline` from the same files: the same tokenizer, chat template and image processor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from mmpipe.errors import ArgumentError
from mmpipe.families import DEFAULT_FAMILY

TESTING_PREFIX = "testing:"


class ProcessorLoadError(ArgumentError):
    """The processor could not be loaded; the message says what is missing and what to pass."""


def _processor_class_name(path: Path) -> Optional[str]:
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = path / name
        if f.is_file():
            try:
                cls = json.loads(f.read_text()).get("processor_class")
            except (OSError, ValueError):
                continue
            if cls:
                return str(cls)
    return None


def _image_only(family: str, path: Path):
    from mmpipe.offline import image_only_processor_class

    return image_only_processor_class(family).from_pretrained(str(path), local_files_only=True)


def load_processor(spec: Any, *, log: Optional[Callable[[str], None]] = None):
    """A processor (or a tokenizer, for text models) from ``spec`` (see the module doc).

    Raises `ProcessorLoadError` for an unknown ``testing:`` family, a path that is not a
    directory (nor a hub name already in the local cache), or a directory AutoProcessor
    cannot load; ``TypeError`` for anything that is not a path, factory or processor.
    ``log`` receives notes (default: stderr), e.g. when a directory loads images-only.
    """
    if hasattr(spec, "apply_chat_template") or hasattr(spec, "convert_tokens_to_ids"):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        if callable(spec):
            return spec()
        raise TypeError(f"expected a processor path, a zero-argument processor factory or a processor, "
                        f"found {type(spec).__name__}")
    log = log or (lambda msg: print(msg, file=sys.stderr))
    spec = os.fspath(spec)
    if spec.startswith(TESTING_PREFIX):
        return _load_testing(spec)
    path = Path(spec).expanduser()
    if not path.is_dir():
        return _load_cached_hub_name(spec)
    return _load_directory(spec, path, log)


def _load_testing(spec: str):
    """``testing:NAME``: an offline processor by any name `mmpipe.offline.builders` knows (the
    native families, the Qwen3.5 lines, the generic path's Idefics3, LLaVA, Mllama, ...)."""
    from mmpipe.offline.builders import PROCESSOR_NAMES, build_processor

    name = spec[len(TESTING_PREFIX):]
    if name not in PROCESSOR_NAMES:
        raise ProcessorLoadError(f"processor {spec!r}: unknown offline processor {name!r}; use one of "
                                 + ", ".join(TESTING_PREFIX + f for f in PROCESSOR_NAMES))
    return build_processor(name)


def _load_cached_hub_name(spec: str):
    """A spec that is not a directory: a hub name (``org/name``) already in the local cache."""
    from transformers import AutoProcessor

    if "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1:
        try:
            return AutoProcessor.from_pretrained(spec, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear message
            raise ProcessorLoadError(
                f"processor {spec!r}: not a directory, and not in the local Hugging Face cache "
                f"({type(e).__name__}); download the model first or pass its directory") from None
    raise ProcessorLoadError(
        f"processor {spec!r} is not a directory; pass a directory written by processor.save_pretrained "
        f"(or a model checkpoint), or {TESTING_PREFIX}{DEFAULT_FAMILY} for the offline test processor")


def _tiled_image_only(cls_name: Optional[str]) -> Optional[str]:
    """The tiled family whose offline image-only processor class (``ImageOnly`` + its stock
    class, `mmpipe.offline.other_vlms`) saved these files, else None."""
    from mmpipe.families import TILED_FAMILIES
    from mmpipe.offline.tokenizer import OWN_BUILDERS

    return next((name for name, fam in TILED_FAMILIES.items() if name in OWN_BUILDERS and cls_name in
                 {"ImageOnly" + c for c in fam.processor_classes}), None)


def _load_directory(spec: str, path: Path, log: Callable[[str], None]):
    """A processor directory: AutoProcessor, or the image-only offline class of its family
    when that is what was saved or AutoProcessor cannot build the stock class here."""
    from transformers import AutoProcessor

    from mmpipe.offline import image_only_class_name, image_only_family

    cls_name = _processor_class_name(path)
    # the family whose image-only offline processor can load these files: the class recorded
    # is that family's stock processor class (ModelFamily.processor_classes) or the image-only
    # subclass a `testing:` processor saves as
    family = image_only_family(cls_name)
    if family is not None and cls_name == image_only_class_name(family):
        return _image_only(family, path)
    tiled = _tiled_image_only(cls_name)
    if tiled is not None:  # saved from testing:internvl / testing:llava_onevision (image-only subclasses)
        return type(_load_testing(TESTING_PREFIX + tiled)).from_pretrained(str(path), local_files_only=True)
    try:
        proc = AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001
        if family is None:
            hint = (" (this processor class needs torchvision: pip install torchvision, or load a processor "
                    "whose image processor does not)") if "torchvision" in str(e).lower() else ""
            raise ProcessorLoadError(
                f"processor {spec!r}: AutoProcessor.from_pretrained failed: {type(e).__name__}: {e}{hint}") from None
        log(f"note: AutoProcessor could not build {cls_name} ({type(e).__name__}: {str(e)[:160]}); "
            f"loading it without a video processor (images only)")
        return _image_only(family, path)
    if getattr(proc, "image_processor", None) is None and family is not None:
        return _image_only(family, path)
    return proc
