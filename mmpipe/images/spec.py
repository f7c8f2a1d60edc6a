"""`VisionSpec`: a family's image-processor settings (patch, merge, temporal sizes, bounds,
mean/std, backend) and the per-channel uint8 -> float32 table; `smart_resize`: the Qwen resize rule,
`glm4v_smart_resize`: GLM-4.1V's; `VisionSpec.target_size` applies the spec's own rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError, ImageError, PixelDataError
from mmpipe.images.backends import engine_transparency, lut as backend_lut, resolve_backend
from mmpipe.images.settings import size_field
from mmpipe.images.transparency import check_transparency
from mmpipe.families import ModelFamily, family_of


@dataclass(frozen=True)
class VisionSpec:
    """Image-processing constants, read from a processor (or a family's defaults).
    ``max_aspect_ratio``: the family's limit on ``max(h, w) / min(h, w)``. ``backend``: the
    transformers image-processor backend whose resize and float values are reproduced,
    ``"pil"`` or ``"torchvision"`` (`mmpipe.images.backends`). ``transparency``: how images
    with transparency become RGB, None (the installed transformers' rule, looked up when such an
    image is met: `mmpipe.images.transparency.transparency_rule`) or a fixed rule, ``"white"`` /
    ``"drop"`` (an engine's: ``image_backend="vllm"`` gives ``"white"``)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple
    image_std: tuple
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = 3  # PIL.Image.BICUBIC, the Qwen processors' filter
    max_aspect_ratio: float = ModelFamily.max_aspect_ratio  # the family table's default
    backend: str = "pil"
    resize_rule: str = "qwen"  # `RESIZE_RULES`: the family's ``ModelFamily.resize_rule``
    transparency: Optional[str] = None  # `mmpipe.images.transparency.TRANSPARENCY_RULES`; None: the installed one
    family: str = ""  # the family's name (`ModelFamily.name`): what refusals name ("" when built by hand)
    do_resize: bool = True  # False: the image processor's own do_resize=False (images kept at their size)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def bound_frames(self) -> int:
        """How many copies of an image the pixel bounds count: 1 (Qwen), ``temporal_patch_size``
        (GLM-4.1V, whose rule bounds ``t * h * w``). An image of area A fits bounds [lo, hi]
        unchanged when ``lo <= bound_frames * A <= hi``."""
        return self.temporal_patch_size if self.resize_rule == "glm4v" else 1

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(H', W') an image of ``height`` x ``width`` is resized to under this spec's bounds and
        its family's resize rule (`smart_resize` or `glm4v_smart_resize`); ImageError when refused.
        ``do_resize=False`` (the image processor's): the image's own size, as the processor keeps it
        (no bounds, no aspect limit); sides that are not multiples of `factor` are an ImageError
        (the processor cannot cut such an image into merge windows either)."""
        if not self.do_resize:
            return _unresized(height, width, self.factor, self.family)
        if self.resize_rule == "glm4v":
            return glm4v_smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels,
                                      temporal_factor=self.temporal_patch_size, max_ratio=self.max_aspect_ratio,
                                      family=self.family)
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels,
                            max_ratio=self.max_aspect_ratio, family=self.family)

    @classmethod
    def from_family(cls, fam: ModelFamily, backend: str = "pil", transparency: Optional[str] = None) -> "VisionSpec":
        return cls(
            fam.patch_size, fam.temporal_patch_size, fam.merge_size, fam.min_pixels, fam.max_pixels,
            tuple(fam.image_mean), tuple(fam.image_std), max_aspect_ratio=fam.max_aspect_ratio,
            backend=resolve_backend(backend), resize_rule=fam.resize_rule,
            transparency=check_transparency(transparency) or engine_transparency(backend), family=fam.name,
        )

    @classmethod
    def from_processor(cls, processor, min_pixels=None, max_pixels=None, backend: str = "auto",
                       transparency: Optional[str] = None) -> "VisionSpec":
        """``backend``: ``"auto"`` (the processor's, `backends.processor_backend`), ``"pil"``,
        ``"torchvision"``, or an engine's, ``"vllm"`` (torchvision, with vLLM's transparency
        rule, white). ``transparency``: None / ``"auto"`` (the engine's when ``backend`` names
        one, else the installed transformers'), ``"white"`` or ``"drop"``."""
        ip = getattr(processor, "image_processor", None)
        fam = family_of(processor)
        option, backend = backend, resolve_backend(backend, processor)
        transparency = check_transparency(transparency) or engine_transparency(option)
        if ip is None:
            return cls.from_family(fam, backend, transparency)
        mn, mx = _pixel_bounds(ip, fam, min_pixels, max_pixels)
        _check_patch_sizes(ip, fam)
        mean = getattr(ip, "image_mean", None) or fam.image_mean
        std = getattr(ip, "image_std", None) or fam.image_std
        mean = tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * 3
        std = tuple(std) if isinstance(std, (list, tuple)) else (std,) * 3
        return cls(
            int(getattr(ip, "patch_size", fam.patch_size)),
            int(getattr(ip, "temporal_patch_size", fam.temporal_patch_size)),
            int(getattr(ip, "merge_size", fam.merge_size)),
            int(mn), int(mx), mean, std,
            float(getattr(ip, "rescale_factor", 1 / 255)),
            bool(getattr(ip, "do_rescale", True)),
            bool(getattr(ip, "do_normalize", True)),
            int(getattr(ip, "resample", None) if getattr(ip, "resample", None) is not None else 3),
            fam.max_aspect_ratio,
            backend,
            fam.resize_rule,
            transparency,
            fam.name,
            getattr(ip, "do_resize", None) is not False,
        )

    def for_rows(self, backends: Sequence[Optional[str]]) -> "VisionSpec":
        """This spec with the backend the rows' pixels were made with: the rows win over the
        processor, since their stored uint8 pixels are that backend's resize and expand to its
        floats with its table. ``backends``: each row's ``image_backend`` (None: no image pixels;
        videos do not depend on it, `for_videos`).
        Rows of different backends in one batch are a `PixelDataError` naming the first odd row."""
        found = _rows_value(backends, self.backend, "image backends", "image_backend",
                            "encode every row with the same Encoder(image_backend=...): the engine's backend")
        return self if found is None else replace(self, backend=found)

    def for_transparency(self, rules: Sequence[Optional[str]]) -> "VisionSpec":
        """This spec with the transparency rule the rows were encoded with (each row's recorded
        rule, `mmpipe.images.transparency.TRANSPARENCY_RULES`; None: not recorded, e.g. no image with
        transparency): rows decoded again from their files (``pixels="source"``) must convert
        as they were encoded, whatever transformers the collator runs on. Rows of different
        rules in one batch are a `PixelDataError` naming the first odd row."""
        found = _rows_value(rules, self.transparency, "transparency rules", "image_transparency",
                            "re-encode the rows on one transformers line (or all with image_backend='vllm'): "
                            "their transparent pixels differ")
        return self if found is None else replace(self, transparency=check_transparency(found))

    def for_videos(self) -> "VisionSpec":
        """The spec videos are made with: this one with ``backend="torchvision"``, whatever
        the image backend. transformers has only torchvision video processors
        (``Qwen2VLVideoProcessor``, ``Qwen3VLVideoProcessor``; no PIL one), so the stock video
        path always resizes with torchvision's rule (`backends.resize_u8_torch`) and expands
        with its fused float32 table; ``backend`` governs images only. Cached."""
        if self.backend == "torchvision":
            return self
        try:
            return _video_spec(self)
        except TypeError:  # unhashable (list constants)
            return replace(self, backend="torchvision")

    def lut(self) -> np.ndarray:
        """float32 [3, 256], read-only and cached: the processor's value for each uint8 value
        of each channel, computed with the backend's own float ops (`mmpipe.images.backends.lut`;
        PIL: float64 rescale, float32 normalise; torchvision: fused float32 rescale + normalise).
        Videos: ``spec.for_videos().lut()``."""
        try:
            hash(self)
        except TypeError:  # built by hand with list constants: not cacheable
            return _make_lut(self)
        return _lut(self)


def _pixel_bounds(ip, fam: ModelFamily, min_pixels, max_pixels) -> tuple:
    """(min_pixels, max_pixels) of image processor ``ip``: a bound given here wins; else the
    processor's own (``size`` ``shortest_edge`` / ``longest_edge``, or 4.x's ``min_pixels`` /
    ``max_pixels`` attributes; a 0 there is the processor's value, not "unset"), else the family's.
    `ArgumentError` naming the setting, the value, where it came from and the fix for bounds that
    cross and for a bound the processor refuses or mmpipe could not reproduce (`_check_bound`)."""
    size = getattr(ip, "size", None) or {}
    name = type(ip).__name__
    found = {}
    for arg, key, given, default in (("min_pixels", "shortest_edge", min_pixels, fam.min_pixels),
                                     ("max_pixels", "longest_edge", max_pixels, fam.max_pixels)):
        own = next((v for v in (size_field(size, key), getattr(ip, arg, None)) if v is not None), None)
        if given is not None:
            found[arg] = (_check_bound(arg, given, None, default, fam), f"{arg}={given} given")
        elif own is None and _resize_needs(ip):
            raise ArgumentError(
                f"the processor's image processor {name} has no size {key} ({arg}): its size is {size!r}, which "
                "transformers 5 refuses when it resizes an image ('size dict must contain shortest_edge and "
                f"longest_edge'); expected size {{'shortest_edge': ..., 'longest_edge': ...}}, found {size!r}; set "
                f"both in its preprocessor_config.json \"size\" (e.g. {key}={default}, the {fam.name or 'family'} "
                f"default), or pass {arg}=")
        elif own is None:
            found[arg] = (default, f"the {fam.name or 'family'} default {default}")
        else:
            found[arg] = (_check_bound(arg, own, f"the processor's image processor {name} has size {key}", default,
                                       fam), f"{name}'s size {key}={own}")
    (mn, mn_from), (mx, mx_from) = found["min_pixels"], found["max_pixels"]
    if mn > mx:  # smart_resize would then give sizes over max_pixels, whichever bound came from where
        raise ArgumentError(f"min_pixels {mn} is more than max_pixels {mx} (min_pixels: {mn_from}; max_pixels: "
                            f"{mx_from}); pass min_pixels <= max_pixels (--min-pixels / --max-pixels), or fix the "
                            f"image processor's size in its preprocessor_config.json")
    return mn, mx


def _resize_needs(ip) -> bool:
    """Whether the image processor's own resize needs both size bounds: transformers 5 resizing
    (``do_resize``) with a ``size`` set (its resize raises without ``shortest_edge`` / ``longest_edge``;
    mmpipe took the family's defaults, another size than the processor's intent, e.g. a fixed
    ``{"height": 448, "width": 448}``)."""
    return is_transformers_5() and getattr(ip, "size", None) is not None and getattr(ip, "do_resize", True) is not False


def _check_bound(arg: str, value, own: Optional[str], default: int, fam: ModelFamily) -> int:
    """``value`` of pixel bound ``arg`` as an int, refused (`ArgumentError`: the setting, expected, found,
    the fix) when it is not a whole number, or is one the processor refuses. ``own``: None for a bound
    given to mmpipe (what the rollout then sends as the processor's call keywords, ``mm_processor_kwargs``),
    else where the processor's own value was read.

    What transformers does with the same values (5.25 / 4.57, the Qwen2-VL image processor): 0 as a
    bound: 5.x refuses it (``size dict must contain 'shortest_edge' and 'longest_edge'``); 4.x divides by
    a max of 0, and with a min of 0 resizes a side under ``factor / 2`` pixels to 0 and fails (mmpipe took
    a given min of 0 as one window a side: sizes no processor makes). A negative max: both fail (math
    domain error); a negative min: both ignore it, mmpipe refuses it. A fraction (3136.5): 5.x refuses it
    as a call keyword, both take it in ``size``, mmpipe would round it down (another size at the bound). A
    string: both fail with a TypeError. Bounds that cross: both resize, mmpipe refuses (`_pixel_bounds`).
    A processor's own min of 0 on 4.x stays its "no lower bound", as 4.x takes it."""
    whole = isinstance(value, (int, np.integer)) or (isinstance(value, (float, np.floating)) and math.isfinite(value)
                                                     and float(value).is_integer())
    zero_ok = own is not None and arg == "min_pixels" and not is_transformers_5()
    if whole and not isinstance(value, bool) and (value > 0 or (value == 0 and zero_ok)):
        return int(value)
    where = own or arg
    if not whole or isinstance(value, bool):
        why, expected = "not a whole number of pixels", "an int"
    elif value == 0:
        why = ("a bound of 0, which transformers 5 refuses when it resizes ('size dict must contain "
               "shortest_edge and longest_edge') and 4.x " + ("takes as no lower bound until an image's side "
                                                              "rounds to 0 pixels and its resize fails"
                                                              if arg == "min_pixels" else "divides by it"))
        expected = "an int >= 1"
    else:
        why, expected = "a negative number of pixels", "an int >= 1"
    if own:
        fix = (f"set {own.split()[-1]} in its preprocessor_config.json \"size\" to {expected} (e.g. {default}, the "
               f"{fam.name or 'family'} default), or pass {arg}=")
    elif not whole or isinstance(value, bool):
        number = isinstance(value, (float, np.floating)) and math.isfinite(value)
        fix = f"pass a whole number, e.g. {arg}={int(value) if number else default}"
    else:
        fix = f"pass {arg}=" + ("1 for no lower bound (transformers' own resize rule then)" if arg == "min_pixels"
                                else f"{default} (the {fam.name or 'family'} default)")
    fix += f", or leave it out for the processor's own {arg}" if not own else ""
    raise ArgumentError(f"{where}={value!r}" + (f" ({arg}), which" if own else "") + f" is {why}; expected "
                        f"{expected}, found {value!r}; {fix}")


def _check_patch_sizes(ip, fam: ModelFamily) -> None:
    """The image processor's ``patch_size`` and ``merge_size`` must be its family's (the table
    counts each image's tokens as ``t*h*w // merge**2`` and sizes its pixel rows by the patch):
    a processor edited to other sizes would give encode, collate and rollout other token counts
    and pixel widths than its own call and its model. `ArgumentError` naming both."""
    if not fam.is_vision:
        return
    for key in ("patch_size", "merge_size"):
        own, want = getattr(ip, key, None), getattr(fam, key)
        if own is not None and int(own) != want:
            raise ArgumentError(
                f"the processor's image processor {type(ip).__name__} has {key}={own}, but {fam.name} models take "
                f"{key}={want} (the family table, by which mmpipe counts image tokens and sizes pixel rows); "
                f"rows made with it would disagree with the processor's own call and the model: set {key} to "
                f"{want} in its preprocessor_config.json, or load the checkpoint's own processor")
    expand = getattr(ip, "patch_expand_factor", None)  # GLM-GA's image processors: the resize factor's extra term
    if expand is not None and int(expand) != 1:
        raise ArgumentError(
            f"the processor's image processor {type(ip).__name__} has patch_expand_factor={expand}: its torchvision "
            f"backend then resizes to multiples of patch_size * merge_size * {expand} (its PIL backend ignores it), "
            f"while {fam.name} rows are sized to multiples of patch_size * merge_size; rows made with it would "
            f"disagree with the processor's own call; expected patch_expand_factor=1 (every published config), "
            f"set it to 1 in its preprocessor_config.json")


def _unresized(height: int, width: int, factor: int, family: str) -> tuple[int, int]:
    """(height, width) of an image the processor does not resize (its ``do_resize=False``), refused
    as an ImageError when a side is not a multiple of ``factor`` (patch * merge)."""
    if min(height, width) <= 0 or height % factor or width % factor:
        who = f"the {family} image processor" if family else "the image processor"
        raise ImageError(
            f"image has size {height}x{width} (height x width), but {who} has do_resize=False: it keeps each image's "
            f"size and cuts it into {factor}x{factor} merge windows, so both sides must be multiples of {factor}",
            where="", expected=f"height and width multiples of {factor}", found=f"{height}x{width}",
            fix="resize the image to multiples of the window first, or set do_resize=True on the image processor "
                "(its preprocessor_config.json) so that it is resized within its pixel bounds")
    return height, width


@lru_cache(maxsize=64)
def _video_spec(spec: VisionSpec) -> VisionSpec:
    return replace(spec, backend="torchvision")


@lru_cache(maxsize=64)
def _lut(spec: VisionSpec) -> np.ndarray:
    return _make_lut(spec)


def _make_lut(spec: VisionSpec) -> np.ndarray:
    table = backend_lut(spec.backend, spec.rescale_factor, spec.do_rescale, spec.do_normalize,
                        spec.image_mean, spec.image_std)
    table.flags.writeable = False  # shared by every caller
    return table


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, *,
                 max_ratio: float = ModelFamily.max_aspect_ratio, family: str = "",
                 size: Optional[tuple[int, int]] = None) -> tuple[int, int]:
    """Qwen's resize target: both sides multiples of ``factor``, area within bounds,
    aspect ratio kept as closely as possible. ``max_ratio``: the largest accepted
    ``max(h, w) / min(h, w)`` (`VisionSpec.max_aspect_ratio`; default the family table's
    200, what every Qwen-VL image processor enforces); ImageError beyond it, naming the
    processor of ``family`` (`VisionSpec.family`) and the image's ``size`` (height, width; default
    ``height`` x ``width``: a caller that scaled the image first passes the original's)."""
    if min(height, width) <= 0:
        raise ImageError(
            f"image has size {height}x{width}; an image needs at least one pixel each way",
            where="", expected="height >= 1 and width >= 1", found=f"{height}x{width}",
            fix="drop the row or replace the empty image",
        )
    if max(height, width) / min(height, width) > max_ratio:
        h, w = size or (height, width)
        ratio = max(height, width) / min(height, width)
        who = f"{family} processors need" if family else "the processor needs"
        raise ImageError(
            f"image {h}x{w} (height x width) has aspect ratio {ratio:.1f}; {who} it to be at most {max_ratio:g}",
            where="", expected=f"max(h, w) / min(h, w) <= {max_ratio:g} (transformers smart_resize)",
            found=f"{ratio:.1f}", fix="crop or pad the image",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    # min_pixels <= 0 only: a side under factor / 2 rounds to 0, where transformers' rule gives 0 and
    # its resize fails; one window a side instead ("no lower bound but the one patch window")
    return max(factor, h_bar), max(factor, w_bar)


RESIZE_RULES = ("qwen", "glm4v")  # the values of ModelFamily.resize_rule / VisionSpec.resize_rule


def glm4v_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, *,
                       temporal_factor: int = 2, max_ratio: float = ModelFamily.max_aspect_ratio,
                       family: str = "") -> tuple[int, int]:
    """GLM-4.1V's resize target (transformers ``glm4v`` ``smart_resize`` with an image's
    ``num_frames = temporal_factor``): a side below ``factor`` first scales the image up (``int``
    of the scaled sides; an ImageError on transformers 4.x, whose rule raises), then Qwen's rounding,
    with the bounds applied to ``temporal_factor`` frames of the image (``t * h * w``, so an image
    may hold half the pixels of the bound)."""
    if min(height, width) <= 0:
        return smart_resize(height, width, factor, min_pixels, max_pixels, max_ratio=max_ratio)  # its ImageError
    size = (height, width)
    if height < factor or width < factor:
        if not is_transformers_5():  # 4.x's rule raises (5.x scales up)
            raise ImageError(f"image {height}x{width} (height x width) has a side below {factor}, which transformers "
                             f"4.x's {family or 'glm4v'} image processor refuses", where="", found=f"{height}x{width}",
                             expected=f"height >= {factor} and width >= {factor}",
                             fix=f"resize or pad the image to at least {factor}x{factor}, or install transformers>=5")
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    # the aspect check only, on the scaled sides (as transformers), naming the image's own size
    smart_resize(height, width, factor, max_pixels, max_pixels, max_ratio=max_ratio, family=family, size=size)
    t = temporal_factor  # an image is num_frames = temporal_factor frames: round(t / t) * t
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if t * h_bar * w_bar > max_pixels:
        beta = math.sqrt((temporal_factor * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (temporal_factor * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _rows_value(values: Sequence[Optional[str]], current: Optional[str], what: str, column: str,
                fix: str) -> Optional[str]:
    """The one setting the rows recorded (``values``: each row's, None: not recorded) when it
    differs from ``current``, else None (nothing to change); rows that disagree are a
    `PixelDataError` naming the first odd row."""
    found = [(i, v) for i, v in enumerate(values) if v is not None]
    if all(v == current for _, v in found):
        return None
    odd = next((i for i, v in found if v != found[0][1]), None)
    if odd is not None:
        raise PixelDataError(f"rows encoded with different {what} in one batch ({found[0][1]!r} and {values[odd]!r})",
                             where="", row=odd, column=column, stage="collate", expected=repr(found[0][1]),
                             found=repr(values[odd]), fix=fix)
    return found[0][1]
