"""`ModelFamily`: the fields one row of the model-family table (`mmpipe.families`) sets, and what
follows from them (token counts per grid, the family's vision token ids, its media strategy).
The rows themselves and the lookups (`family_of`, `resolve_family`) are in `mmpipe.families`."""

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
    # tokens the checkpoints' generation_config also stops at (its eos_token_id list), beyond stop_token and the
    # eos: GLM-4.1V/4.6V stop at the next turn's header (`mmpipe.rollout.support.stop_ids`)
    turn_stops: tuple[str, ...] = ()
    video_rule: str = "qwen"  # video sampling/sizing/text: "qwen" (qwen-vl-utils), "glm4v" / "glm46v" (glm_videos)
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
