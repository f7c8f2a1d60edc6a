"""Loading a processor offline: from a directory, ``testing:FAMILY``, a factory or an object.

One loader for every place that takes a processor by name (``mmpipe encode --processor``,
`mmpipe.data.ray_data.RayBatchEncoder` on each Ray worker)::

    load_processor("/models/Qwen2.5-VL-3B-Instruct")   # AutoProcessor, local files only
    load_processor("testing:qwen3_vl")                  # the offline processors of mmpipe.offline
    load_processor("testing:gemma3")                    # ... also internvl, llava_onevision
    load_processor(lambda: build_my_processor())        # a zero-argument factory, called here
    load_processor(processor)                           # a processor / tokenizer, returned as is

A Qwen-VL or GLM-4.1V / GLM-4.6V directory whose stock processor class cannot be built here
(transformers 5.x also builds a video processor, which may need torchvision), or one saved from a
``testing:`` processor (a class name AutoProcessor cannot resolve), loads as the image-only
subclass of `mmpipe.offline` from the same files: the same tokenizer, chat template and image
processor.
"""

from __future__ import annotations

import difflib
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


def _config_processor_class(path: Path) -> Optional[str]:
    """No ``processor_class`` recorded: the stock processor class of the vision family that
    ``config.json``'s ``model_type`` names (what AutoProcessor would pick), else None."""
    from mmpipe.offline.processors import FAMILY_NAMES, image_only_base_class_name

    f = path / "config.json"
    model_type = json.loads(f.read_text(encoding="utf-8")).get("model_type") if f.is_file() else None
    return image_only_base_class_name(model_type) if model_type in FAMILY_NAMES else None


def _image_only_class(cls_name: Optional[str]) -> tuple[Optional[type], bool]:
    """``(cls, saved_as_it)``: the image-only offline class that loads the files a processor of class
    ``cls_name`` saved (its family's stock class, or the image-only class itself: ``saved_as_it``),
    else ``(None, False)``. The Qwen families' (`mmpipe.offline.processors`) and those of builder
    modules of their own that have one (glm4v, glm46v: ``image_only_processor_class()``)."""
    import importlib

    from mmpipe.families import FAMILIES
    from mmpipe.offline import image_only_class_name, image_only_family, image_only_processor_class
    from mmpipe.offline.tokenizer import OWN_BUILDERS

    family = image_only_family(cls_name)
    if family is not None:
        return image_only_processor_class(family), cls_name == image_only_class_name(family)
    for name, module in OWN_BUILDERS.items():
        stock = FAMILIES[name].processor_classes if name in FAMILIES else ()
        if cls_name in stock or cls_name in {"ImageOnly" + c for c in stock}:
            own = importlib.import_module(module)
            if hasattr(own, "image_only_processor_class") and getattr(own, "available", lambda: True)():
                cls = own.image_only_processor_class()
                return cls, cls_name == cls.__name__
    return None, False


# the generic-path builders whose image-only / no-video classes (LLaVA-OneVision-1.5, Ovis2.5,
# MiniCPM-V 4.6 / 4.7, the Omni thinkers) are found by name (their modules' ``__getattr__``)
_NO_VIDEO_MODULES = ("mmpipe.offline.other_vlms", "mmpipe.offline.minicpmv", "mmpipe.offline.qwen_omni",
                     "mmpipe.offline.qwen3_omni")


def _no_video_class(cls_name: Optional[str]) -> tuple[Optional[type], bool]:
    """``(cls, saved_as_it)`` for a family of no family-table row whose stock processor needs
    torchvision (its video processor): the class of that name a `_NO_VIDEO_MODULES` module builds,
    or its ``ImageOnly`` / ``NoVideo`` subclass of the stock class ``cls_name``; else ``(None, False)``."""
    import importlib

    from mmpipe.families import FAMILIES

    native = {c for fam in FAMILIES.values() for c in fam.processor_classes}
    if not cls_name or cls_name in native or cls_name in {"ImageOnly" + c for c in native}:
        return None, False
    for module in _NO_VIDEO_MODULES:
        own = importlib.import_module(module)
        for name in (cls_name, "ImageOnly" + cls_name, "NoVideo" + cls_name):
            cls = getattr(own, name, None)
            if isinstance(cls, type) and cls.__module__ == module and cls.__name__ == name:
                return cls, name == cls_name
    return None, False


def _image_only(cls: type, path: Path):
    return cls.from_pretrained(str(path), local_files_only=True)


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
    if not spec.strip():  # Path("") is the working directory: never load that by accident
        raise ProcessorLoadError(f"processor {spec!r} is empty; pass a processor directory, a cached hub name "
                                 f"(org/name) or {TESTING_PREFIX}{DEFAULT_FAMILY}")
    if spec.startswith(TESTING_PREFIX):
        return _load_testing(spec)
    path = Path(spec).expanduser()
    if not path.is_dir():
        path = _cached_hub_snapshot(spec)
    return _load_directory(spec, path, log)


def _load_testing(spec: str):
    """``testing:NAME``: an offline processor by any name `mmpipe.offline.builders` knows (the
    native families, the Qwen3.5 lines, the generic path's Idefics3, LLaVA, Mllama, ...)."""
    from mmpipe.offline.builders import PROCESSOR_NAMES, build_processor

    name = spec[len(TESTING_PREFIX):]
    if name not in PROCESSOR_NAMES:
        key = name.strip().lower().replace("-", "_").replace(".", "_")
        close = [key] if key in PROCESSOR_NAMES else difflib.get_close_matches(key, PROCESSOR_NAMES, n=1)
        hint = f"did you mean {TESTING_PREFIX}{close[0]}? " if close else ""
        raise ProcessorLoadError(f"processor {spec!r}: unknown offline processor {name!r}; {hint}use one of "
                                 + ", ".join(TESTING_PREFIX + f for f in PROCESSOR_NAMES))
    return build_processor(name)


def _cached_hub_snapshot(spec: str) -> Path:
    """A spec that is not a directory: a hub name (``org/name``) already in the local cache ->
    its snapshot directory (loaded like any directory, images-only fallback included). Never
    touches the network."""
    if "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(spec, local_files_only=True))
        except Exception as e:  # noqa: BLE001 - any lookup failure becomes one clear message
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
    when that is what was saved or AutoProcessor cannot build the stock class here. Damaged
    or incomplete directories raise `ProcessorLoadError` naming the file and the fix."""
    try:
        cls_name = _processor_class_name(path) or _config_processor_class(path)
        proc = _build_from_directory(spec, path, cls_name, log)
    except ProcessorLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' OSError / ValueError / KeyError become one message
        _check_json_files(spec, path)  # a damaged file, named (parsed only on failure: tokenizer.json is MBs)
        cls_name = _processor_class_name(path)
        missing = _missing_files(path)
        raise ProcessorLoadError(f"processor {spec!r}: " + (missing or (
            f"loading {cls_name or 'the processor'} failed: {type(e).__name__}: {str(e)[:300]}"))) from None
    return _checked(spec, path, proc, log)


def _build_from_directory(spec: str, path: Path, cls_name: Optional[str], log: Callable[[str], None]):
    from transformers import AutoProcessor

    # the image-only offline class that can load these files: the class recorded is its family's
    # stock processor class (ModelFamily.processor_classes) or the image-only subclass a
    # `testing:` processor saves as
    image_only, saved_as_it = _image_only_class(cls_name)
    if saved_as_it:
        return _image_only(image_only, path)
    tiled = _tiled_image_only(cls_name)
    if tiled is not None:  # saved from testing:internvl / testing:llava_onevision (image-only subclasses)
        return type(_load_testing(TESTING_PREFIX + tiled)).from_pretrained(str(path), local_files_only=True)
    if image_only is None:  # LLaVA-OneVision-1.5, Ovis2.5, MiniCPM-V 4.6 / 4.7, the Omni thinkers
        image_only, saved_as_it = _no_video_class(cls_name)
        if saved_as_it:
            return _image_only(image_only, path)
    try:
        proc = AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001
        if image_only is None:
            hint = (" (this processor class needs torchvision: pip install torchvision, or load a processor "
                    "whose image processor does not)") if "torchvision" in str(e).lower() else ""
            raise ProcessorLoadError(f"processor {spec!r}: " + (_missing_files(path) or (
                f"AutoProcessor.from_pretrained failed: {type(e).__name__}: {e}{hint}"))) from None
        log(f"note: AutoProcessor could not build {cls_name} ({type(e).__name__}: {str(e)[:160]}); "
            f"loading it without a video processor (images only)")
        return _image_only(image_only, path)
    if getattr(proc, "image_processor", None) is None and image_only is not None:
        return _image_only(image_only, path)
    return proc


_JSON_FILES = ("config.json", "processor_config.json", "preprocessor_config.json", "tokenizer_config.json",
               "tokenizer.json", "special_tokens_map.json", "chat_template.json", "added_tokens.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _check_json_files(spec: str, path: Path) -> None:
    """Raise `ProcessorLoadError` naming the first unreadable or non-JSON processor file
    (transformers raises a bare OSError / JSONDecodeError without saying which file)."""
    for name in _JSON_FILES:
        f = path / name
        if not f.is_file():
            continue
        try:
            json.loads(f.read_text(encoding="utf-8"))
        except OSError as e:
            raise ProcessorLoadError(f"processor {spec!r}: cannot read {f} ({e.strerror or e}); "
                                     "fix its permissions") from None
        except ValueError as e:
            raise ProcessorLoadError(f"processor {spec!r}: {f} is not valid JSON ({e}); the file is truncated "
                                     "or damaged: copy it again from the original checkpoint") from None


def _has_image_config(path: Path) -> bool:
    """Whether the directory holds an image processor's config (``preprocessor_config.json`` of an
    image processor, or ``processor_config.json`` with an ``image_processor`` entry)."""
    for name, key in (("preprocessor_config.json", "image_processor_type"), ("processor_config.json", "image_processor")):
        f = path / name
        try:
            if f.is_file() and key in json.loads(f.read_text(encoding="utf-8")):
                return True
        except (OSError, ValueError):  # a damaged file is named by _check_json_files
            continue
    return False


def _missing_files(path: Path) -> str:
    """What a processor directory lacks ('' when nothing obvious): the tokenizer files or,
    when a processor class is recorded, the image processor's config."""
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return (f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); copy them from the base "
                "model's checkpoint")
    cls_name = _processor_class_name(path) or _config_processor_class(path)
    if cls_name and not _has_image_config(path):
        return (f"{path} records processor_class {cls_name!r} but has no image processor "
                "config (preprocessor_config.json, or processor_config.json with an 'image_processor' entry); "
                "copy preprocessor_config.json from the base model's checkpoint")
    return ""


def _checked(spec: str, path: Path, proc, log: Callable[[str], None]):
    """Refuse what AutoProcessor returns for an incomplete directory instead of handing it on
    (a bare image processor, or a bare tokenizer that silently drops the image processor); give
    a processor without its own chat template the tokenizer's (older checkpoints keep it in
    tokenizer_config.json only, or as a list of named templates there)."""
    tok = getattr(proc, "tokenizer", proc)
    if not hasattr(tok, "convert_tokens_to_ids"):
        raise ProcessorLoadError(f"processor {spec!r}: loaded only a {type(proc).__name__}: "
                                 + (_missing_files(path) or "no tokenizer"))
    if getattr(proc, "image_processor", None) is None and tok is proc and _has_image_config(path):
        raise ProcessorLoadError(
            f"processor {spec!r}: {path} has an image processor config but AutoProcessor built only the "
            f"tokenizer ({type(proc).__name__}): no processor_class is recorded and config.json does not name "
            "a known model_type; add \"processor_class\": \"<Model>Processor\" (e.g. \"Qwen2_5_VLProcessor\") to "
            "preprocessor_config.json")
    if tok is not proc and getattr(proc, "chat_template", None) is None and getattr(tok, "chat_template", None):
        proc.chat_template = tok.chat_template
        log(f"note: {path} has no chat_template.jinja / chat_template.json; using the chat template of "
            "tokenizer_config.json")
    return proc
