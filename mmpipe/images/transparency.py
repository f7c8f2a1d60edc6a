"""How an image with transparency becomes RGB: the two rules the processors mmpipe reproduces
follow, which one the installed transformers follows (found by running its ``convert_to_rgb``
on a probe pixel, not from its version), and the rule an engine applies (vLLM: white).

An image has transparency when it has an alpha band (RGBA, LA, PA) or a ``transparency`` entry
(a tRNS colour or palette index). The rules differ by the whole value range wherever a pixel is
transparent:

- ``"white"``: composited onto opaque white (``PIL.Image.alpha_composite``): transformers >= 5.21's
  ``image_transforms.convert_to_rgb`` (every image processor, PIL and torchvision backends), and
  vLLM, which converts every image this way before its processor runs
  (``vllm.multimodal.image.convert_image_mode``: the same bytes as alpha_composite).
- ``"drop"``: ``img.convert("RGB")``: the alpha band dropped, the colours under it kept (a palette
  image's transparent index keeps its colour): transformers 4.x up to 5.20.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
from PIL import Image

from mmpipe.errors import ArgumentError, ImageError

__all__ = ["TRANSPARENCY_RULES", "TRANSPARENCY_ENV", "ENGINE_TRANSPARENCY", "has_transparency", "apply_rule",
           "rule_of", "installed_transparency", "check_transparency", "transparency_rule"]

TRANSPARENCY_RULES = ("white", "drop")
TRANSPARENCY_ENV = "MMPIPE_TRANSPARENCY"
ENGINE_TRANSPARENCY = {"vllm": "white"}  # the rule an engine applies to the images it is given


def has_transparency(img: Image.Image) -> bool:
    """Whether ``img`` carries transparency: an alpha band or a ``transparency`` entry (what
    transformers and vLLM both test)."""
    return "A" in img.getbands() or img.info.get("transparency") is not None


def apply_rule(img: Image.Image, rule: str) -> Image.Image:
    """``img`` as RGB under ``rule`` (one of `TRANSPARENCY_RULES`)."""
    if rule == "white" and has_transparency(img):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


# two pixels whose RGB results tell the rules apart: fully transparent, and half transparent
_PROBE = ((10, 20, 30, 0), (200, 100, 50, 128))


def rule_of(convert) -> Optional[str]:
    """The `TRANSPARENCY_RULES` entry a converter ``convert(PIL RGBA image) -> RGB image or
    uint8 array`` follows, found by running it on two RGBA pixels; None when it follows
    neither (or fails)."""
    probe = Image.new("RGBA", (len(_PROBE), 1))
    probe.putdata(list(_PROBE))
    try:
        out = np.asarray(convert(probe.copy()))
    except Exception:
        return None
    for rule in TRANSPARENCY_RULES:
        want = np.asarray(apply_rule(probe, rule))
        if out.shape == want.shape and np.array_equal(out, want):
            return rule
    return None


_INSTALLED: list = []  # the detected rule, once per process


def installed_transparency() -> Optional[str]:
    """The rule the installed transformers' image processors apply to transparent PIL images:
    its ``image_transforms.convert_to_rgb`` (which every image processor calls on PIL input, in
    every transformers release mmpipe supports) run once on a probe pixel (`rule_of`) and cached.
    ``"white"`` without transformers (the rule of vLLM and of transformers >= 5.21); None when
    the installed function follows neither rule. Decided by what the function does, not by
    the version string."""
    if not _INSTALLED:
        try:
            import inspect

            from transformers.image_transforms import convert_to_rgb
        except Exception:  # no transformers (or no PIL support in it)
            _INSTALLED.append("white")
        else:
            try:
                takes_numpy = "return_numpy" in inspect.signature(convert_to_rgb).parameters
            except (TypeError, ValueError):
                takes_numpy = False
            kw = {"return_numpy": True} if takes_numpy else {}  # 5.21+: the PIL return is deprecated
            _INSTALLED.append(rule_of(lambda im: convert_to_rgb(im, **kw)))
    return _INSTALLED[0]


def check_transparency(rule: Optional[str], what: str = "transparency") -> Optional[str]:
    """``rule`` when it is None, ``"auto"`` (both: the installed processor's) or one of
    `TRANSPARENCY_RULES`; else `ArgumentError`."""
    if rule is None or rule == "auto":
        return None
    if rule not in TRANSPARENCY_RULES:
        raise ArgumentError(f"{what} must be 'auto' or one of {TRANSPARENCY_RULES}, got {rule!r}")
    return rule


def transparency_rule(rule: Optional[str] = None) -> str:
    """The rule to convert with: ``rule`` when given; else ``$MMPIPE_TRANSPARENCY`` when set
    (``white`` / ``drop`` / ``auto``); else the installed transformers' (`installed_transparency`).
    An installed rule mmpipe does not know raises `ImageError` (only images with transparency
    ask for it)."""
    rule = check_transparency(rule)
    if rule is None:
        rule = check_transparency(os.environ.get(TRANSPARENCY_ENV, "").strip() or None, f"${TRANSPARENCY_ENV}")
    if rule is None:
        rule = installed_transparency()
    if rule is None:
        raise ImageError(
            "the installed transformers converts transparent images to RGB by a rule mmpipe does not "
            "reproduce", where="", expected=f"its convert_to_rgb to follow one of {TRANSPARENCY_RULES}",
            found="another result on a probe pixel",
            fix=f"set ${TRANSPARENCY_ENV}=white (transformers >= 5.21, vLLM) or =drop (transformers <= 5.20), "
                "or install a transformers release mmpipe supports")
    return rule
