"""Offline fixtures for LLaVA-OneVision (`mmpipe.families` row ``"llava_onevision"``): its
real ``LlavaOnevisionProcessor`` with SMALL tiles (so tests are fast) and a tiny randomly
initialised ``LlavaOnevisionForConditionalGeneration`` matching it, built locally with no
download and no torchvision::

    >>> proc = build_onevision_processor()                  # doctest: +SKIP
    >>> model = build_onevision_model()                     # doctest: +SKIP

The processor is `mmpipe.offline.other_vlms.build_foreign_processor`'s (stock class, the
offline tokenizer with the ``<image>`` / ``<video>`` tokens, a chat template rendering each
image as ``<image>``) with its image processor swapped for
``LlavaOnevisionImageProcessorPil(size=32x32)`` with grid pinpoints up to 4x4 tiles (so
``anyres_max_9`` shrinks the largest grids, as with real checkpoints); 4 tokens per tile
(SigLIP 32x32 / patch 16, ``"full"`` strategy). Code that runs over InternVL and
LLaVA-OneVision by name uses `mmpipe.offline.tile_builders`.
"""

from __future__ import annotations


from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.offline.seeded import seeded_model
from mmpipe.offline.tf_lines import pil_image_processor
from mmpipe.offline.tiny_towers import (
    TILE,
    cached_model_copy,
    refuse_pixel_bounds,
    tiny_tower_configs,
    use_hub_vision_names,
    write_checkpoint,
)

__all__ = ["ONEVISION_PINPOINTS", "build_onevision_processor", "build_onevision_model",
           "save_onevision_checkpoint"]

# (height, width) pinpoints: every grid of 1..4 x 1..4 tiles of TILE pixels
ONEVISION_PINPOINTS = [[TILE * r, TILE * c] for r in range(1, 5) for c in range(1, 5)]
_MODEL_CLASS = "LlavaOnevisionForConditionalGeneration"


def build_onevision_processor(**image_kwargs):
    """A real LLaVA-OneVision processor with 32x32 tiles; ``image_kwargs`` override the image
    processor's settings (e.g. ``image_grid_pinpoints=...``). A fresh object on every call."""
    proc = build_foreign_processor("llava_onevision")
    kwargs = {"size": {"height": TILE, "width": TILE},
              "image_grid_pinpoints": ONEVISION_PINPOINTS, **image_kwargs}
    proc.image_processor = pil_image_processor("LlavaOnevisionImageProcessorPil")(**kwargs)
    return proc


def _config(head_dim: int = 16):
    """The tiny towers (`tiny_tower_configs`) with a SigLIP 16x16-patch vision tower: 4 tokens
    per tile, as `build_onevision_processor` counts them."""
    import transformers

    tok = build_onevision_processor().tokenizer
    text, vision = tiny_tower_configs(tok, head_dim)
    return transformers.LlavaOnevisionConfig(
        text_config=text,
        vision_config=dict(vision, model_type="siglip_vision_model", patch_size=16),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=ONEVISION_PINPOINTS, vision_feature_select_strategy="full",
        vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9")


def build_onevision_model(seed: int = 0):
    """A tiny randomly initialised model matching `build_onevision_processor()`: fp32, eval
    mode, eager attention; a deep copy of a cached model per call."""
    return cached_model_copy(_MODEL_CLASS, _config, seed)


def save_onevision_checkpoint(path, *, seed: int = 0):
    """Write a tiny float32 checkpoint vLLM loads (``vllm.LLM(model=path)``): the model with
    head_dim 64 (vLLM's CPU attention refuses less), its vision weights under the real
    checkpoints' names (``vision_tower.vision_model.*``, which vLLM reads), the STOCK
    ``LlavaOnevisionProcessor`` with its video processor (what ``AutoProcessor`` loads; needs
    torchvision's transforms: the vLLM environment, scripts/envs/vllm.sh) and the tokenizer,
    template and image settings of `build_onevision_processor`. Returns the path."""
    import transformers

    proc = build_onevision_processor()
    video = transformers.LlavaOnevisionVideoProcessor(size={"height": TILE, "width": TILE})
    stock = transformers.LlavaOnevisionProcessor(
        image_processor=proc.image_processor, tokenizer=proc.tokenizer,
        chat_template=proc.chat_template, video_processor=video,
        num_image_tokens=proc.num_image_tokens,
        vision_feature_select_strategy=proc.vision_feature_select_strategy)
    model = seeded_model(_MODEL_CLASS, _config(head_dim=64), int(seed))
    path = write_checkpoint(model, stock, path)
    use_hub_vision_names(path)
    return path


def offline_processor(family: str, *, min_pixels: int | None = None,
                      max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for LLaVA-OneVision
    (`mmpipe.offline.tokenizer.OWN_BUILDERS`): fixed-size tiles, so pixel bounds do not apply."""
    refuse_pixel_bounds(family, min_pixels, max_pixels)
    return build_onevision_processor()


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for LLaVA-OneVision."""
    return build_onevision_model(seed)
