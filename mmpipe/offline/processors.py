"""Offline fixtures: real Qwen-VL processors built locally - the family's real image processor
(patch / merge / mean / std from `mmpipe.families`, SMALL default pixel bounds so tests are
fast) and the offline tokenizer, in an image-only subclass of the family's stock processor
class (no video processor, so no torchvision needed)."""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.families import DEFAULT_FAMILY, get_family
from mmpipe.offline.chat_templates import chat_template
from mmpipe.offline.tf_lines import classes_by_name, image_only_subclass
from mmpipe.offline.tokenizer import FAMILY_NAMES, OWN_BUILDERS, build_tokenizer, check_family

if TYPE_CHECKING:  # pragma: no cover
    from transformers import ProcessorMixin

__all__ = [
    "default_pixel_bounds", "build_image_processor", "build_processor", "image_only_base_class_name",
    "image_only_class_name", "image_only_processor_class", "image_only_family",
]

_IMAGE_ONLY_PREFIX = "ImageOnly"


def default_pixel_bounds(family: str = DEFAULT_FAMILY) -> tuple[int, int]:
    """Small test defaults ``(min_pixels, max_pixels)`` = ``(4, 64) * factor**2``.

    factor = patch * merge (28, or 32 for Qwen3-VL): every image becomes 4 to 64 LLM tokens
    (16 to 256 patch rows). Real checkpoints use much larger bounds (see mmpipe.families).
    """
    factor = get_family(check_family(family)).factor
    return 4 * factor * factor, 64 * factor * factor


def image_only_base_class_name(family: str) -> str:
    """The stock transformers processor class the image-only processor of ``family`` derives
    from: the family's first `ModelFamily.processor_classes` entry."""
    return get_family(check_family(family)).processor_classes[0]


def image_only_class_name(family: str) -> str:
    """Class name of the image-only processor of ``family``, e.g. ``"ImageOnlyQwen2VLProcessor"``
    (what ``save_pretrained`` records as ``processor_class``). Imports nothing heavy."""
    return _IMAGE_ONLY_PREFIX + image_only_base_class_name(family)


def image_only_family(class_name: str | None) -> str | None:
    """The vision family whose image-only processor loads files saved by a processor of class
    ``class_name`` (its stock base class or the image-only class itself), or None."""
    for family in FAMILY_NAMES:
        if class_name in (image_only_base_class_name(family), image_only_class_name(family)):
            return family
    return None


def image_only_processor_class(family: str) -> type:
    """The image-only processor class of ``family`` (built once per family).

    ``ProcessorMixin`` takes its sub-processors from the ``__init__`` signature; the stock
    classes list ``video_processor``, whose class check fails without torchvision even for
    ``None``. Dropping the parameter (on transformers 4.x: the ``attributes`` list) gives a processor with ``image_processor`` and
    ``tokenizer`` only (``videos=`` is not supported). The class keeps the real class in the
    MRO, so :func:`mmpipe.families.family_of` recognises it.
    """
    return _image_only_classes()[check_family(family)]


@functools.lru_cache(maxsize=None)
def _image_only_classes() -> dict[str, type]:
    import transformers

    def make(base: type) -> type:
        doc = (
            f"``{base.__name__}`` without a video processor (works without torchvision); "
            "built by :func:`mmpipe.testing.build_processor`."
        )
        return image_only_subclass(base, module=__name__, doc=doc)

    return {f: make(getattr(transformers, image_only_base_class_name(f))) for f in FAMILY_NAMES}


def _class_named(name: str) -> type | None:
    family = image_only_family(name)
    return image_only_processor_class(family) if family is not None and name == image_only_class_name(family) else None


__getattr__ = classes_by_name(__name__, _class_named)  # the image-only classes pickle by name


def build_image_processor(family: str = DEFAULT_FAMILY, *, min_pixels: int | None = None,
                          max_pixels: int | None = None):
    """The real Qwen image processor with the family's settings.

    Always the PIL/numpy backend ``Qwen2VLImageProcessorPil`` (what ``Qwen2VLImageProcessor``
    resolves to without torchvision), so outputs do not depend on whether torchvision is
    installed. ``min_pixels`` / ``max_pixels`` default to :func:`default_pixel_bounds`.
    """
    try:
        from transformers import Qwen2VLImageProcessorPil as Qwen2VLImageProcessor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import Qwen2VLImageProcessor

    fam = get_family(check_family(family))
    lo, hi = default_pixel_bounds(family)
    lo = lo if min_pixels is None else int(min_pixels)
    hi = hi if max_pixels is None else int(max_pixels)
    if lo > hi:
        raise ArgumentError(f"min_pixels {lo} > max_pixels {hi}")
    # 4.x's __init__ replaces any ``size`` with its defaults; only min_pixels / max_pixels stick
    bounds = {} if is_transformers_5() else dict(min_pixels=lo, max_pixels=hi)
    return Qwen2VLImageProcessor(
        size={"shortest_edge": lo, "longest_edge": hi},
        **bounds,
        patch_size=fam.patch_size,
        temporal_patch_size=fam.temporal_patch_size,
        merge_size=fam.merge_size,
        image_mean=list(fam.image_mean),
        image_std=list(fam.image_std),
    )


def build_processor(
    family: str = DEFAULT_FAMILY, *, min_pixels: int | None = None, max_pixels: int | None = None
) -> "ProcessorMixin":
    """A real Qwen-VL processor (image processor + :func:`build_tokenizer`), offline.

    The class is a subclass of the family's stock processor (``Qwen2VLProcessor`` /
    ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``, see :func:`image_only_processor_class`);
    it has no video processor. ``min_pixels`` / ``max_pixels`` default to
    :func:`default_pixel_bounds` (small, for fast tests). ``proc(text=[...], images=[...],
    return_tensors="pt")`` returns ``input_ids``, ``attention_mask``, ``pixel_values``,
    ``image_grid_thw`` and ``mm_token_type_ids``. A fresh processor (with its own tokenizer
    copy) is returned on every call.
    """
    if family in OWN_BUILDERS:  # a family with a builder module of its own (mmpipe.offline.glm4v)
        own = importlib.import_module(OWN_BUILDERS[family])
        return own.offline_processor(family, min_pixels=min_pixels, max_pixels=max_pixels)
    cls = image_only_processor_class(family)
    return cls(
        image_processor=build_image_processor(family, min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=build_tokenizer(family),
        chat_template=chat_template(family),
    )
