"""Model-family table: everything that differs between the model families (Qwen2/2.5/3-VL,
GLM-4.1V/4.6V, Gemma 3, InternVL, LLaVA-OneVision, plain decoder LLMs, and the generic path for
any other VLM processor) lives here, one `ModelFamily` row per family. Stages look a family up and
never branch on its name; what differs in how a family's media are laid out and stored is its
``kind`` (`ModelFamily.media`: one strategy per kind in `mmpipe.media`).

The family is found from the processor or model config CLASS, never asked of the user and
never guessed from attributes (`family_of`); other families raise `UnsupportedProcessorError`::

    >>> fam = family_of(processor)          # doctest: +SKIP
    >>> fam.name, fam.patch_size, fam.merge_size
    ('qwen2_vl', 14, 2)
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Optional

from mmpipe.errors import ArgumentError, NotAFamilyError, UnsupportedProcessorError
from mmpipe.family_fields import HALF, ModelFamily  # the row type (stages import it from here, with the rows)


QWEN2_VL = ModelFamily(
    name="qwen2_vl", model_types=("qwen2_vl",), rope="mrope",
    processor_classes=("Qwen2VLProcessor",), model_class="Qwen2VLForConditionalGeneration",
)
QWEN2_5_VL = ModelFamily(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), rope="mrope_tps", tokens_per_second=2.0,
    processor_classes=("Qwen2_5_VLProcessor",), model_class="Qwen2_5_VLForConditionalGeneration",
)
# Model types whose checkpoints load the Qwen3-VL processor and take its rope: Qwen3.5 (MoE), Qwen4-Exp (transformers
# 5.25's auto mapping), Cosmos3 Omni (its Reasoner is a Qwen3-VL model). The model then names the processor's family.
QWEN3_VL = ModelFamily(
    name="qwen3_vl",
    model_types=("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp", "cosmos3_omni"),
    rope="mrope_frames",
    patch_size=16,
    image_mean=HALF,
    image_std=HALF,
    min_pixels=65536,
    max_pixels=16777216,
    processor_classes=("Qwen3VLProcessor", "Qwen3VLMoeProcessor"),
    model_class="Qwen3VLForConditionalGeneration",
    mrope_section=(24, 20, 20),
)
# GLM-4.1V: Qwen-like patches ([N, 1176], merge 2); rope: Qwen3-VL's "frames" rule. Its videos
# (video_rule "glm4v"): each frame group an <|image|> block, then its time, in <|begin_of_video|>...
GLM4V = ModelFamily(
    name="glm4v",
    model_types=("glm4v", "glm4v_moe"),
    rope="mrope_frames",
    image_token="<|image|>",
    video_token="<|video|>",
    vision_start_token="<|begin_of_image|>",
    vision_end_token="<|end_of_image|>",
    min_pixels=112 * 112,
    max_pixels=28 * 28 * 15000,
    processor_classes=("Glm4vProcessor",),
    model_class="Glm4vForConditionalGeneration",
    mrope_section=(8, 12, 12),
    resize_rule="glm4v",
    processor_bounds="size",
    video_rule="glm4v", stop_token="<|endoftext|>",  # its template writes no end of turn
    turn_stops=("<|user|>", "<|observation|>"),  # generation_config eos_token_id [endoftext, user, observation]
)
# GLM-4.6V (transformers 5): GLM-4.1V's processor and model, derived; its videos (video_rule "glm46v"): its
# own sampling (a rate by duration) and times ("1.5 seconds"). Names only: resolves on 4.57 (no glm46v) too.
# GLM-OCR and GLM-GA checkpoints ship Glm46VProcessor (GLM-GA's model class is Glm46V's; GLM-OCR's GLM-4.1V's rope).
GLM46V = replace(GLM4V, name="glm46v", model_types=("glm46v", "glm_ocr", "glmga"),
                 processor_classes=("Glm46VProcessor",), video_rule="glm46v",
                 model_class="Glm46VForConditionalGeneration")
TEXT = ModelFamily(
    name="text", model_types=(), rope="1d", stop_token=None,
    image_token=None, video_token=None, vision_start_token=None, vision_end_token=None,
)

FAMILIES: dict[str, ModelFamily] = {
    f.name: f for f in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL, GLM4V, GLM46V, TEXT)}
VISION_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.is_vision)
DEFAULT_FAMILY = QWEN2_VL.name


# Gemma 3: each image one 896x896 SigLIP tile (pan-and-scan adds crops, each its own tile and text); attention
# both ways inside an image's tokens (token_type_ids), broken by packed rows (tests/batching/test_tiled_packing.py).
GEMMA3 = ModelFamily(
    name="gemma3", kind="tiles", rope="1d", model_types=("gemma3",), processor_classes=("Gemma3Processor",),
    model_class="Gemma3ForConditionalGeneration", image_token="<start_of_image>", feature_token="<image_soft_token>",
    module="mmpipe.images.gemma3", token_type_key="token_type_ids", vllm_tile_prompts=True, stop_token="<end_of_turn>",
    vllm_processor_kwargs=("do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
                           "pan_and_scan_min_ratio_to_activate"),
    no_packing="Gemma 3 attends both ways inside each image's tokens (token_type_ids), and transformers builds "
               "that mask wrong for packed rows: its sliding-window layers test the image blocks at each token's "
               "position within its row instead of its place in the pack, so from the second row on image "
               "tokens lose attention to later tokens of their image and text tokens see later tokens "
               "(measured: logits off by up to 0.41 vs each row alone; the global layers are right)")
# InternVL (transformers format): dynamic tiling + thumbnail, each tile image_seq_length
# <IMG_CONTEXT> tokens inside <img>...</img>; causal attention, 1-D positions.
INTERNVL = ModelFamily(
    name="internvl", kind="tiles", rope="1d", model_types=("internvl",), processor_classes=("InternVLProcessor",),
    model_class="InternVLForConditionalGeneration", image_token="<IMG_CONTEXT>", feature_token="<IMG_CONTEXT>",
    module="mmpipe.images.internvl", no_packing=None)  # packed rows: 1-D positions restarting per row, no mask
# LLaVA-OneVision: anyres tiles (base + pinpoint grid), unpadded feature count, image_sizes; causal, 1-D positions.
LLAVA_ONEVISION = ModelFamily(
    name="llava_onevision", kind="tiles", rope="1d", model_types=("llava_onevision",), processor_classes=("LlavaOnevisionProcessor",),
    model_class="LlavaOnevisionForConditionalGeneration", image_token="<image>", feature_token="<image>",
    module="mmpipe.images.onevision", no_packing=None)  # packed rows: as InternVL (image_sizes, pixels per image)
# The generic path: a VLM processor without a row of its own (Idefics3, LLaVA 1.5, Mllama, the Omni thinkers...):
# its rows hold what the processor's own call returns (kind "processor"); stored family "generic".
MASKED_AUDIO = ("Qwen3OmniMoeProcessor", "Gemma4Processor")  # audio encoders masking padded frames (no padding effect)
VLLM_FLOORED_TIME = {"Qwen3OmniMoeProcessor": 13.0}  # vLLM 0.32 floors a video's time positions (ids a second)
GENERIC = ModelFamily(
    name="generic", kind="processor", rope="1d", model_types=(), stop_token=None,
    image_token=None, video_token=None, vision_start_token=None, vision_end_token=None,
    no_packing="it has no mmpipe family table and takes the generic path (whether its model's attention "
               "allows packed rows is unknown)")

# The whole table, and views of it by kind (names kept by the stages that take one kind's rows).
ALL_FAMILIES: dict[str, ModelFamily] = {**FAMILIES, **{f.name: f for f in (GEMMA3, INTERNVL, LLAVA_ONEVISION, GENERIC)}}
TILED_FAMILIES: dict[str, ModelFamily] = {n: f for n, f in ALL_FAMILIES.items() if f.kind == "tiles"}
# Processor class name -> family (for processors that carry no model config); model type -> family.
_PROCESSOR_CLASSES = {cls: f for f in ALL_FAMILIES.values() for cls in f.processor_classes}
_MODEL_TYPES = {t: f for f in ALL_FAMILIES.values() for t in f.model_types}


def tiled_family_of(obj) -> Optional[ModelFamily]:
    """The family of a processor (by class), model or config (by ``model_type``), family name or `ModelFamily`
    of the tiles kind; None for anything else (no error)."""
    if isinstance(obj, ModelFamily):
        return obj if obj.kind == "tiles" else None
    if isinstance(obj, str):
        return TILED_FAMILIES.get(obj)
    if hasattr(obj, "image_processor"):
        fam = _PROCESSOR_CLASSES.get(processor_class_name(obj))
        return fam if fam is not None and fam.kind == "tiles" else None
    model_type = getattr(getattr(obj, "config", obj), "model_type", None)
    fam = _MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    return fam if fam is not None and fam.kind == "tiles" else None


# Where a processor without a table row goes (mmpipe.encode / encode_row / collate... take it there themselves).
GENERIC_PATH = "mmpipe.Encoder (kind processor: mmpipe.media.processor)"
GENERIC_FAMILY = GENERIC.name  # the stored ``family`` of rows encoded through the generic path


def get_family(name: str) -> ModelFamily:
    """The family named ``name`` (any row of `ALL_FAMILIES`, ``"generic"`` included)."""
    try:
        return ALL_FAMILIES[name]
    except (KeyError, TypeError):
        raise ArgumentError(f"unknown model family {name!r}; known: {sorted(ALL_FAMILIES)}") from None


def processor_class_name(processor) -> str:
    """The transformers class a processor is: its own class when transformers defines it, else
    the first transformers class in its MRO (a user's or mmpipe's subclass of a stock class).

    Only the class itself counts for a transformers class: a stock processor of another family
    that happened to derive from a Qwen processor is still that other family.
    """
    for cls in type(processor).__mro__:
        if cls.__module__.startswith("transformers."):
            return cls.__name__
    return type(processor).__name__


def _unsupported(kind: str, name: str, detail: str = "") -> UnsupportedProcessorError:
    known = sorted(_PROCESSOR_CLASSES if kind == "processor" else _MODEL_TYPES)
    return UnsupportedProcessorError(
        f"{kind} {name}{detail} is not a model family mmpipe encodes natively (known {kind}s: "
        f"{', '.join(known)}); it takes the generic path {GENERIC_PATH} (the processor's own chat "
        f"template and call, float pixel values, positions only where exact)", name)


def family_of(obj) -> ModelFamily:
    """Family of a processor, tokenizer, model, model config, family name or ModelFamily.

    From classes only, never from attributes: a processor by its transformers class
    (`processor_class_name`, `ModelFamily.processor_classes`), a model or config by ``model_type``
    (`ModelFamily.model_types`; the tiles kind first: `tiled_family_of`); a tokenizer alone is a text decoder.
    Raises `UnsupportedProcessorError` (naming the class and the generic path) for a processor with an image
    processor, or a config with a ``vision_config``, of any other family; `ArgumentError` for an unknown name.
    """
    if isinstance(obj, ModelFamily):
        return obj
    if isinstance(obj, str):  # a family name, or a native family's model type ("qwen3_5": qwen3_vl)
        return ALL_FAMILIES.get(obj) or _MODEL_TYPES.get(obj) or get_family(obj)
    if isinstance(obj, dict) and isinstance(obj.get("model_type"), str):  # a config.json read as a dict
        obj = SimpleNamespace(**obj)
    if (tiled := tiled_family_of(obj)) is not None:  # a tiled family (TILED_FAMILIES)
        return tiled
    if hasattr(obj, "image_processor"):
        name = processor_class_name(obj)
        if name in _PROCESSOR_CLASSES:
            return _PROCESSOR_CLASSES[name]
        ip = getattr(obj, "image_processor", None)
        if ip is None:  # a processor without an image processor: its tokenizer is a text decoder
            return TEXT
        raise _unsupported("processor", name, f" (image processor {type(ip).__name__})")
    config = getattr(obj, "config", obj)
    model_type = getattr(config, "model_type", None)
    if model_type is not None:
        if model_type in _MODEL_TYPES:
            return _MODEL_TYPES[model_type]
        if getattr(config, "vision_config", None) is not None or _encoder_vision(config):
            raise _unsupported("model type", repr(model_type), f" ({type(config).__name__})")
        return TEXT
    if hasattr(obj, "convert_tokens_to_ids"):
        return TEXT
    raise NotAFamilyError(f"cannot tell the model family of {type(obj).__name__}: pass a processor, model or name")


def _encoder_vision(config) -> bool:
    """Whether an encoder-decoder config's encoder has a ``vision_config`` (T5Gemma 2: not a text decoder)."""
    enc = getattr(config, "encoder", None)
    return (enc.get("vision_config") if isinstance(enc, dict) else getattr(enc, "vision_config", None)) is not None


def takes_generic_path(obj) -> bool:
    """Whether ``obj`` is a VLM processor of a family without a table row (`GENERIC_PATH`), as `family_of` finds."""
    if not hasattr(obj, "image_processor") or isinstance(obj, (str, ModelFamily)):
        return False
    try:
        family_of(obj)
    except UnsupportedProcessorError:
        return True
    return False


def resolve_family(obj) -> ModelFamily:
    """`family_of`, with the generic path resolved too: a VLM processor (or config) without a
    row of its own gives `GENERIC` instead of raising. The one lookup a stage makes."""
    try:
        return family_of(obj)
    except UnsupportedProcessorError:
        return GENERIC
