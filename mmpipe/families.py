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

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Optional

from mmpipe.errors import ArgumentError, NotAFamilyError, UnsupportedProcessorError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ModelFamily:
    """Constants of one model family.

    ``rope`` names the position rule:

    - ``"mrope"``: Qwen2-VL 3-D rotary positions; video temporal index = frame-group index.
    - ``"mrope_tps"``: Qwen2.5-VL; video temporal index scaled by
      ``tokens_per_second * second_per_grid_ts``.
    - ``"mrope_frames"``: Qwen3-VL; every video frame group is its own ``t=1`` block
      (timestamps sit in the text between them).
    - ``"1d"``: text-only decoder, positions ``0..n-1``.
    """

    name: str
    model_types: tuple[str, ...]
    rope: str
    # how the family's images are laid out and stored (`mmpipe.media`): "patches" (patch grids, uint8 patches
    # expanded at collate), "tiles" (fixed-size tiles, a placeholder text per image) or "processor" (the generic
    # path: whatever the processor's own call returns)
    kind: str = "patches"
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    tokens_per_second: float = 1.0
    # the vision special tokens; None for a family without them (the text family)
    image_token: Optional[str] = "<|image_pad|>"
    video_token: Optional[str] = "<|video_pad|>"
    vision_start_token: Optional[str] = "<|vision_start|>"
    vision_end_token: Optional[str] = "<|vision_end|>"
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    max_aspect_ratio: float = 200.0  # the image processors refuse max(h, w) / min(h, w) above this
    # transformers classes: the stock processor(s) and the model class of the family
    processor_classes: tuple[str, ...] = ()
    model_class: str = ""
    mrope_section: tuple[int, int, int] = (16, 24, 24)  # real checkpoints' (t, h, w) split of head_dim / 2
    # the image resize rule (`mmpipe.images.spec.RESIZE_RULES`): "qwen" (Qwen's smart_resize) or "glm4v" (GLM-4.1V's:
    # the pixel bounds count temporal_patch_size frames of the image, a side below patch * merge first scaled up)
    resize_rule: str = "qwen"
    # how a processor call takes pixel bounds (vLLM's mm_processor_kwargs): "pixels" ({"min_pixels", "max_pixels"})
    # or "size" ({"size": {"shortest_edge", "longest_edge"}})
    processor_bounds: str = "pixels"
    encodes_videos: bool = True  # False: the encoder refuses video items (VideoError naming the family)
    stop_token: Optional[str] = "<|im_end|>"  # a reply's end (`mmpipe.encoding.spans`); None: the eos token
    video_rule: str = "qwen"  # video sampling/sizing/text: "qwen" (qwen-vl-utils) or "glm4v" (encoding.glm_videos)
    # ---- tiles kind (Gemma 3, InternVL, LLaVA-OneVision) ------------------------------------
    feature_token: Optional[str] = None  # the token the model fills with image features
    module: Optional[str] = None  # the image module: tile_count, image_tokens, tiles_u8, expand_placeholder
    token_type_key: Optional[str] = None  # model input holding 1 at feature tokens (Gemma 3: token_type_ids)
    # why packing is refused (None: the model takes packed rows)
    no_packing: Optional[str] = None
    vllm_processor_kwargs: tuple[str, ...] = ()  # image options vLLM's processor takes (mm_processor_kwargs)
    vllm_tile_prompts: bool = False  # a stored one-tile image re-creates its vLLM prompt (size-free text)

    @property
    def is_vision(self) -> bool:
        return self.rope != "1d" or self.kind != "patches"

    @property
    def media(self):
        """The family's media strategy (`mmpipe.media`: layout, storage, model tensors)."""
        from mmpipe.media import strategy

        return strategy(self.kind)

    def images(self):
        """The family's image module (tiles kind; imported on first use)."""
        import importlib

        if self.module is None:
            raise ArgumentError(f"family {self.name!r} has no image module")
        return importlib.import_module(self.module)

    def token_ids(self, tokenizer) -> dict[str, int]:
        """``{"image": id of image_token, "feature": id of feature_token}`` in ``tokenizer``."""
        return {"image": tokenizer.convert_tokens_to_ids(self.image_token),
                "feature": tokenizer.convert_tokens_to_ids(self.feature_token)}

    @property
    def takes_second_per_grid_ts(self) -> bool:
        """Whether the model's ``forward`` takes ``second_per_grid_ts`` [V] with videos (only
        the ``"mrope_tps"`` rule, Qwen2.5-VL, scales video time by it)."""
        return self.rope == "mrope_tps"

    @property
    def factor(self) -> int:
        """Side length that resized images are multiples of (patch * merge)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Width D of float32 ``pixel_values`` rows: C * temporal_patch * p * p."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    @property
    def patch_dim_u8(self) -> int:
        """Width of compact uint8 image patch rows: C * p * p (one temporal copy)."""
        return 3 * self.patch_size**2

    @property
    def merge_area(self) -> int:
        """Patches merged into one LLM token (merge_size ** 2)."""
        return self.merge_size**2

    def tokens_per_grid(self, grid):
        """LLM tokens of each (t, h, w) grid: ``t*h*w // merge_size**2``.

        ``grid``: int [..., 3] (numpy, torch, or nested lists) -> int [...] of the same kind
        (numpy for lists); an empty grid list gives an empty result.
        """
        if not hasattr(grid, "prod"):
            import numpy as np

            grid = np.asarray(grid, dtype=np.int64).reshape(-1, 3)
        return grid.prod(-1) // self.merge_area

    @property
    def video_frames_are_blocks(self) -> bool:
        """Whether the text lays out each video frame group as its own vision block (Qwen3-VL:
        a timestamp, then ``<|vision_start|>`` + ``h*w/merge^2`` pads + ``<|vision_end|>``,
        ``t`` times) instead of one block of ``t*h*w/merge^2`` pads per video."""
        return self.rope == "mrope_frames"

    def num_tokens(self, grid) -> int:
        """Total LLM tokens of a list of grids int [n, 3] (0 for none)."""
        return int(self.tokens_per_grid(grid).sum()) if len(grid) else 0

    def vision_token_ids(self, tokenizer) -> dict[str, Optional[int]]:
        """Ids of the family's vision tokens in ``tokenizer``: ``{"image": int, "video": int,
        "vision_start": int, "vision_end": int}``, None for each token the family does not have
        (all four for the text family, whose tokenizer may still know the Qwen-VL tokens)."""
        tokens = {"image": self.image_token, "video": self.video_token,
                  "vision_start": self.vision_start_token, "vision_end": self.vision_end_token}
        return {k: None if t is None else tokenizer.convert_tokens_to_ids(t) for k, t in tokens.items()}

    def model_positions(self, position_ids, axis: int = 0):
        """Position ids in the form the model's ``forward`` takes them.

        ``position_ids``: int64 numpy array or torch tensor with its 3 position rows on ``axis``:
        mmpipe's layout [3, L] / [3, B, L], or batch first [B, 3, L] with ``axis=1`` (ReMA).
        An M-RoPE family takes all three rows: returned as it is. The 1-D rule takes row 0
        alone (the text positions, which the layout repeats on every row): returned without
        ``axis`` ([L], [B, L]), a view.
        """
        if self.rope != "1d" or self.kind != "patches":  # other kinds store [1, L]: given as they are
            return position_ids
        return position_ids[(slice(None),) * axis + (0,)]

    def bounds_kwargs(self, min_pixels: int, max_pixels: int) -> dict:
        """Pixel bounds in the form the family's processor call takes them (``processor_bounds``):
        ``{"min_pixels", "max_pixels"}`` or ``{"size": {"shortest_edge", "longest_edge"}}``."""
        if self.processor_bounds == "size":
            return {"size": {"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)}}
        return {"min_pixels": int(min_pixels), "max_pixels": int(max_pixels)}

    def aspect_ok(self, height: int, width: int) -> bool:
        """Whether the image processor accepts an image of this size (aspect-ratio limit)."""
        return max(height, width) / min(height, width) <= self.max_aspect_ratio

    def accepts(self, family_name: str) -> bool:
        """Whether a row stored with ``family=family_name`` was encoded for this family (token
        ids, patch size and positions differ between families, so only its own rows)."""
        return family_name == self.name


QWEN2_VL = ModelFamily(
    name="qwen2_vl", model_types=("qwen2_vl",), rope="mrope",
    processor_classes=("Qwen2VLProcessor",), model_class="Qwen2VLForConditionalGeneration",
)
QWEN2_5_VL = ModelFamily(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), rope="mrope_tps", tokens_per_second=2.0,
    processor_classes=("Qwen2_5_VLProcessor",), model_class="Qwen2_5_VLForConditionalGeneration",
)
QWEN3_VL = ModelFamily(
    name="qwen3_vl",
    model_types=("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"),
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
)
# GLM-4.6V (transformers 5): GLM-4.1V's processor and model, derived; its videos differ (times "1.5 seconds",
# own sampling): refused. Names only: resolves on 4.57 (no glm46v) too.
GLM46V = replace(GLM4V, name="glm46v", model_types=("glm46v",),
                 processor_classes=("Glm46VProcessor",), encodes_videos=False,
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
        if getattr(config, "vision_config", None) is not None:
            raise _unsupported("model type", repr(model_type), f" ({type(config).__name__})")
        return TEXT
    if hasattr(obj, "convert_tokens_to_ids"):
        return TEXT
    raise NotAFamilyError(f"cannot tell the model family of {type(obj).__name__}: pass a processor, model or name")


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
