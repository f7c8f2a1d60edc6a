"""Model-family table: everything that differs between Qwen2-VL, Qwen2.5-VL, Qwen3-VL and
plain decoder LLMs lives here, one small record per family. Stages look a family up and
never branch on its name.

The family is found from the processor (or model config), never asked of the user::

    >>> fam = family_of(processor)          # doctest: +SKIP
    >>> fam.name, fam.patch_size, fam.merge_size
    ('qwen2_vl', 14, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mmpipe.errors import ArgumentError

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

    @property
    def is_vision(self) -> bool:
        return self.rope != "1d"

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
        if self.rope != "1d":
            return position_ids
        return position_ids[(slice(None),) * axis + (0,)]

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
    model_types=("qwen3_vl", "qwen3_vl_moe"),
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
TEXT = ModelFamily(
    name="text", model_types=(), rope="1d",
    image_token=None, video_token=None, vision_start_token=None, vision_end_token=None,
)

FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL, TEXT)}
VISION_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.is_vision)
DEFAULT_FAMILY = QWEN2_VL.name

# Processor class name -> family, for processors that carry no model config.
_PROCESSOR_CLASSES = {cls: f.name for f in FAMILIES.values() for cls in f.processor_classes}


def get_family(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ArgumentError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}") from None


def family_of(obj) -> ModelFamily:
    """Family of a processor, tokenizer, model, model config, family name or ModelFamily.

    A processor is matched by its class (walking the MRO, so subclasses count); a tokenizer
    alone is a text-only decoder; a model or config by ``model_type``.
    """
    if isinstance(obj, ModelFamily):
        return obj
    if isinstance(obj, str):
        return get_family(obj)
    explicit = getattr(obj, "mmpipe_family", None)
    if isinstance(explicit, str):
        return get_family(explicit)
    config = getattr(obj, "config", obj)
    model_type = getattr(config, "model_type", None)
    if model_type is not None and not hasattr(obj, "image_processor"):
        for fam in FAMILIES.values():
            if model_type in fam.model_types:
                return fam
        return TEXT
    for cls in type(obj).__mro__:
        if cls.__name__ in _PROCESSOR_CLASSES:
            return FAMILIES[_PROCESSOR_CLASSES[cls.__name__]]
    if hasattr(obj, "image_processor"):
        ip = obj.image_processor
        # An unknown processor with a Qwen-style image processor: decide by patch size.
        if getattr(ip, "merge_size", None) is not None:
            return QWEN3_VL if getattr(ip, "patch_size", 14) == 16 else QWEN2_VL
        raise ArgumentError(
            f"cannot tell the model family of processor {type(obj).__name__}; "
            f"set processor.mmpipe_family to one of {sorted(FAMILIES)}"
        )
    if hasattr(obj, "convert_tokens_to_ids"):
        return TEXT
    raise TypeError(f"cannot tell the model family of {type(obj).__name__}")
