"""A stored row's images back as the processor's resized images (rollout inputs stage).

Engines that take raw images (vLLM) get each row's images rebuilt from its compact uint8
patches (or, exactly inverted, its float32 ``pixel_values``), plus the ``mm_processor_kwargs``
under which re-processing them is the identity (see `mmpipe.rollout.inputs` for why). A tiled
family's rows give their original images instead (`original_images`; vLLM tiles them again) and
the image options their vLLM processor takes (`vllm_image_options`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, FamilyMismatchError, ImageError, InputError, PixelDataError
from mmpipe.families import DEFAULT_FAMILY, ModelFamily, family_of
from mmpipe.images.load import decoded_rgb
from mmpipe.images.pixels import pixel_values_to_u8, unpatchify_u8, video_pixel_values_to_u8
from mmpipe.images.spec import VisionSpec
from mmpipe.records.row import MultiModalInputs

__all__ = ["vision_spec_for", "row_images", "row_video_frames", "original_images", "vllm_processor_kwargs",
           "vllm_image_options"]


def vision_spec_for(processor_or_spec, fam: ModelFamily, *, index: Any = None) -> VisionSpec:
    """The `VisionSpec` to rebuild rows of family ``fam`` with.

    ``processor_or_spec``: a `VisionSpec` (used as is), a processor (its spec; it must be of
    the rows' family), a family name / `ModelFamily` (its defaults; it must be the rows'
    family) or None (``fam``'s defaults). Raises `FamilyMismatchError` (naming row ``index``
    when given) when the processor, name or spec belongs to another family, `ArgumentError`
    for anything else.
    """
    def mismatch(other: str) -> FamilyMismatchError:
        return FamilyMismatchError(
            f"the row was encoded for {fam.name!r} but the processor is {other!r}", row=index, column="family",
            stage="rollout", expected=f"a {fam.name} processor", found=f"a {other} processor",
            fix="use the processor the rows were encoded with",
        )

    if isinstance(processor_or_spec, VisionSpec):
        spec = processor_or_spec
    elif processor_or_spec is None or isinstance(processor_or_spec, (str, ModelFamily)):
        named = family_of(processor_or_spec) if processor_or_spec is not None else fam
        if not fam.accepts(named.name):
            raise mismatch(named.name)
        spec = VisionSpec.from_family(named)
    else:
        try:
            other = family_of(processor_or_spec)
        except TypeError:  # not a processor at all (family_of: "cannot tell the model family of ...")
            where = "" if index is None else f"row {index}: "
            raise ArgumentError(
                f"{where}the processor must be the one the rows were encoded with, its VisionSpec, a family name "
                f"or None, got {type(processor_or_spec).__name__}") from None
        if not fam.accepts(other.name):
            raise mismatch(other.name)
        spec = VisionSpec.from_processor(processor_or_spec)
    if fam.is_vision and spec.patch_size != fam.patch_size:
        raise FamilyMismatchError(
            f"VisionSpec patch size {spec.patch_size} does not match {fam.name} ({fam.patch_size})", row=index,
            stage="rollout", expected=f"patch size {fam.patch_size}", found=f"patch size {spec.patch_size}",
            fix="pass the processor (or its VisionSpec) the rows were encoded with",
        )
    return spec


def _image_u8(r: MultiModalInputs, spec: VisionSpec, index: Any) -> np.ndarray:
    """The row's image patches as compact uint8 [N, 3*p*p] (inverting float32 pixel_values;
    ``pixels="source"``: its files decoded and resized as collate does)."""
    if r.pixel_values_u8 is not None:
        return r.pixel_values_u8
    if r.image_sources is not None:
        from mmpipe.encoding.sources import decode_sources

        return decode_sources(r.image_sources, r.image_grid_thw, spec.for_rows([r.image_backend]), row=index)
    if r.pixel_values is not None:
        try:
            return pixel_values_to_u8(r.pixel_values, spec.lut(), spec.temporal_patch_size)
        except ValueError as e:
            # only the inner reason: this error carries the one location, fix and stage tag
            reason = e.message_body() if isinstance(e, InputError) else str(e)
            raise PixelDataError(
                f"cannot recover the images from float32 pixel_values ({reason}); were they made "
                "with other normalisation constants?", row=index, stage="rollout",
                column="pixel_values", expected="float32 pixel_values of this processor's normalisation",
                found=getattr(e, "found", None) or f"{reason:.80}", fix="pass the processor the row was encoded with",
            ) from None
    raise PixelDataError(
        f"holds {r.num_images} image(s) but no pixel data (encoded with pixels='none', layout only); "
        "a rollout engine needs the images", row=index, stage="rollout",
        column="pixel_values_u8", expected=f"pixel data for {r.num_images} image(s)", found="none",
        fix="re-encode with pixels='uint8' (the default)",
    )


def row_images(row, spec: VisionSpec, *, index: Any = None) -> list:
    """The row's images as PIL RGB images, exactly the processor's resized images.

    Each image ``i`` is ``W = gw*p`` by ``H = gh*p`` (its ``image_grid_thw`` (1, gh, gw)), from
    compact ``pixel_values_u8`` [N, 3*p*p] or, exactly inverted, from float32
    ``pixel_values`` [N, 3*T*p*p]. Re-processing them under `vllm_processor_kwargs` gives
    the stored grid and ``pixel_values`` bit for bit. Raises `PixelDataError` (stage
    "rollout") when the row has no pixel data or its patches do not fit ``spec``.
    """
    from PIL import Image

    r = MultiModalInputs.from_dict(row, row=index)
    if not r.num_images:
        return []
    u8 = _image_u8(r, spec, index)
    p = spec.patch_size
    if u8.shape[1] != 3 * p * p:
        raise PixelDataError(
            "image patches do not fit this VisionSpec", row=index, stage="rollout",
            column="pixel_values_u8", expected=f"rows 3*{p}*{p} = {3 * p * p} wide", found=f"{u8.shape[1]} wide",
            fix="pass the processor (or VisionSpec) the row was encoded with",
        )
    out, start = [], 0
    for i, (t, h, w) in enumerate(r.image_grid_thw.tolist()):
        if t != 1:
            raise PixelDataError(
                f"grid {(t, h, w)} has t != 1; images have one temporal step", row=index, image=i,
                stage="rollout", column="image_grid_thw", expected="t == 1", found=f"t == {t}", fix="re-encode the row",
            )
        arr = unpatchify_u8(u8[start:start + h * w], h, w, spec)
        out.append(Image.fromarray(arr, "RGB"))
        start += h * w
    return out


def row_video_frames(row, spec: VisionSpec, *, index: Any = None) -> list[np.ndarray]:
    """The row's videos as uint8 frame arrays [t*T, gh*p, gw*p, 3] (T = temporal patch size).

    Compact video storage ``pixel_values_videos_u8`` is uint8 [Nv, 3*T*p*p] in the video
    processor's layout: rows ordered (frame group, h/merge, w/merge, merge_h, merge_w), each
    row (channel, frame-in-group, patch_y, patch_x). Frame ``g*T + k`` is frame ``k`` of group
    ``g``; a video whose frame count was odd carries its last frame twice (the processor pads).
    """
    r = MultiModalInputs.from_dict(row, row=index)
    if not r.num_videos:
        return []
    if r.pixel_values_videos_u8 is not None:
        u8 = r.pixel_values_videos_u8
    elif r.pixel_values_videos is not None:
        u8 = _video_u8(r.pixel_values_videos, spec, index)
    else:
        raise PixelDataError(
            f"holds {r.num_videos} video(s) but no pixel data", row=index, stage="rollout",
            column="pixel_values_videos_u8", expected=f"pixel data for {r.num_videos} video(s)", found="none",
            fix="re-encode with pixels",
        )
    p, m, T = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    out, start = [], 0
    for t, h, w in r.video_grid_thw.tolist():
        x = u8[start:start + t * h * w].reshape(t, h // m, w // m, m, m, 3, T, p, p)
        x = x.transpose(0, 6, 1, 3, 7, 2, 4, 8, 5)  # (t, T, h/m, m, p, w/m, m, p, C)
        out.append(np.ascontiguousarray(x).reshape(t * T, h * p, w * p, 3))
        start += t * h * w
    return out


def _video_u8(pixel_values_videos: np.ndarray, spec: VisionSpec, index: Any) -> np.ndarray:
    """float32 video patches -> uint8, exactly. The stock video processors exist only as
    torchvision implementations (fused rescale + normalise), and mmpipe's video floats follow
    them whatever the image backend: they invert with ``spec.for_videos().lut()``."""
    try:
        return video_pixel_values_to_u8(pixel_values_videos, spec.for_videos().lut(), stage="rollout")
    except PixelDataError as e:
        raise PixelDataError(
            "cannot recover the video frames from float32 pixel_values_videos; were they made with other "
            "normalisation constants?", row=index, stage="rollout", column="pixel_values_videos",
            expected="float32 pixel_values_videos of this processor's video normalisation",
            found=e.found or f"{e.message_body():.80}",
            fix="pass the processor the row was encoded with") from None


def original_images(r: MultiModalInputs, given: Optional[list], i: int) -> list:
    """A tiled-family row's ORIGINAL images (vLLM tiles them again), as vLLM takes them: upright
    RGB PIL, each checked against the row's ``image_hw``. From ``given`` (the images the row was
    encoded from: PIL, bytes, ``{"bytes"}``, paths), else the row's stored files
    (``pixels="source"``), else - where the family's ``vllm_tile_prompts`` says the stored tile
    re-creates the prompt (Gemma 3 without pan-and-scan: one tile per image, the whole image
    resized) - its uint8 tiles; else an `InputError` (stage "rollout") saying what to pass."""
    from PIL import Image

    fam = r.fam
    if given is not None:
        one = isinstance(given, (str, bytes, dict))
        if one or len(given) != r.num_images:
            raise InputError(f"images= gives {1 if one else len(given)} image(s) for a row of {r.num_images}",
                             row=i, column="images", stage="rollout", expected=f"a list of {r.num_images}",
                             fix="pass each row's images as a list, in order")
        values = list(given)
    elif r.image_sources is not None:
        values = [{"bytes": bytes(b), "path": None} for b in r.image_sources]
    elif fam.vllm_tile_prompts and r.pixel_values_u8 is not None and bool((r.tiles_per_image == 1).all()):
        # one tile per image, the whole image resized: vLLM resizes it again to its own size (no change)
        return [Image.fromarray(np.ascontiguousarray(t)) for t in r.pixel_values_u8]
    else:
        held = "uint8 tiles" if r.pixel_values_u8 is not None else "no pixels (layout-only)"
        raise InputError(f"vLLM tiles each {fam.name} image again from the original image, and this row "
                         f"holds {held}, not its images ({r.tiles_per_image.tolist()} tile(s) per image)",
                         row=i, column="image_sources", stage="rollout", expected="the row's source images",
                         found=held, fix="encode rollout rows with pixels='source', or pass images= (each "
                                         "row's images, as encoded) to to_vllm_prompts; a collated "
                                         "BatchedMultiModalInputs holds tiles only: pass the rows")
    out = []
    for k, value in enumerate(values):
        where = f"row {i}, image {k}"
        rgb = decoded_rgb(value, where=where)  # a truncated file: this row's ImageError, not PIL's OSError
        want = tuple(int(x) for x in r.image_hw[k])
        if (rgb.height, rgb.width) != want:
            raise ImageError(f"image {k} is {rgb.height}x{rgb.width} (upright) but the row was encoded from a "
                             f"{want[0]}x{want[1]} image", where=where, expected=str(want),
                             found=str((rgb.height, rgb.width)), fix="pass the images each row was encoded "
                                                                     "from, in order")
        out.append(rgb)
    return out


# ---- vLLM ------------------------------------------------------------------------------
def vllm_image_options(r: MultiModalInputs, image_processor, i: int) -> dict:
    """A tiled-family row's ``mm_processor_kwargs``: the image options its family's vLLM processor
    takes (`ModelFamily.vllm_processor_kwargs`: Gemma 3's pan-and-scan settings; none for
    InternVL / LLaVA-OneVision, whose vLLM processors take the checkpoint's own settings), as
    the row was encoded (``image_processor``: the processor's, with the row's ``images_kwargs``)."""
    fam = r.fam
    extra = sorted(set(r.images_kwargs or {}) - set(fam.vllm_processor_kwargs))
    if extra:
        raise InputError(f"the row was encoded with images_kwargs {extra}, which vLLM's {fam.name} processor "
                         "does not take (it uses the checkpoint's image processor settings)", row=i,
                         column="images_kwargs", stage="rollout", expected=f"only {sorted(fam.vllm_processor_kwargs)}",
                         found=str(extra),
                         fix="put these settings in the checkpoint's preprocessor_config.json and encode "
                             "without images_kwargs")
    return {k: getattr(image_processor, k) for k in fam.vllm_processor_kwargs if hasattr(image_processor, k)}


def vllm_processor_kwargs(grids, spec: VisionSpec, *, index: Any = None, family=DEFAULT_FAMILY) -> dict:
    """``mm_processor_kwargs`` under which the processor re-creates these stored images as-is.

    grids: int [I, 3] image grids of one prompt. Returns ``{"min_pixels", "max_pixels"}`` (GLM-4.1V:
    ``{"size": {"shortest_edge", "longest_edge"}}``, `ModelFamily.bounds_kwargs`): the spec's bounds
    widened to contain every stored image's area (times `VisionSpec.bound_frames`; so the resize
    rule is the identity for each), plus ``"do_resize": False`` when a stored image's aspect ratio
    exceeds the family's limit (``fam.max_aspect_ratio``, 200: the processor would refuse it;
    the stored image needs no resize anyway). ``family``: the rows' family (name,
    `ModelFamily` or processor).
    """
    fam = family_of(family)
    g = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    p = spec.patch_size
    hw = [(h * p, w * p) for _, h, w in g.tolist()]
    areas = [H * W * spec.bound_frames for H, W in hw]
    bounded = replace(spec, min_pixels=int(min([spec.min_pixels, *areas])), max_pixels=int(max([spec.max_pixels, *areas])))
    kw: dict = fam.bounds_kwargs(bounded.min_pixels, bounded.max_pixels)
    for i, (H, W) in enumerate(hw):
        if not fam.aspect_ok(H, W):
            kw["do_resize"] = False
            continue
        got = bounded.target_size(H, W)
        if got != (H, W):  # cannot happen for sides that are multiples of the factor; keep the guard
            raise ImageError(
                "re-processing the stored image would resize it", row=index, image=i, stage="rollout",
                column="image_grid_thw",
                expected=f"{H}x{W} (unchanged)", found=f"{got[0]}x{got[1]}", fix="re-encode the row",
            )
    return kw
