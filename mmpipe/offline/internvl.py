"""Offline fixtures for InternVL (`mmpipe.families` row ``"internvl"``): its real
``InternVLProcessor`` with SMALL tiles (so tests are fast) and a tiny randomly initialised
``InternVLForConditionalGeneration`` matching it, built locally with no download and no
torchvision::

    >>> proc = build_internvl_processor()                   # doctest: +SKIP
    >>> model = build_internvl_model()                      # doctest: +SKIP

The processor is `mmpipe.offline.other_vlms.build_foreign_processor`'s (stock class, the
offline tokenizer with InternVL's image tokens, a chat template rendering each image as
``<IMG_CONTEXT>``) with its image processor swapped for ``GotOcr2ImageProcessorPil(size=32x32,
max_patches=6)``; the processor turns ``crop_to_patches`` on (its default). 4 tokens per tile
(vision 32x32 / patch 8 = 4x4 patches, pixel-shuffled by 0.5 to 2x2). Code that runs over
InternVL and LLaVA-OneVision by name uses `mmpipe.offline.tile_builders`.
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
    write_checkpoint,
)

__all__ = ["build_internvl_processor", "build_internvl_model", "save_internvl_checkpoint"]

_MODEL_CLASS = "InternVLForConditionalGeneration"


def build_internvl_processor(**image_kwargs):
    """A real InternVL processor with 32x32 tiles; ``image_kwargs`` override the image
    processor's settings (e.g. ``max_patches=12``). A fresh object on every call."""
    proc = build_foreign_processor("internvl")
    kwargs = {"size": {"height": TILE, "width": TILE}, "max_patches": 6, **image_kwargs}
    proc.image_processor = pil_image_processor("GotOcr2ImageProcessorPil")(**kwargs)
    return proc


def _config(head_dim: int = 16):
    """The tiny towers (`tiny_tower_configs`) with a 8x8-patch vision tower pixel-shuffled to
    4 tokens per tile, as `build_internvl_processor` counts them."""
    import transformers

    tok = build_internvl_processor().tokenizer
    text, vision = tiny_tower_configs(tok, head_dim)
    return transformers.InternVLConfig(
        text_config=text, vision_config=dict(vision, patch_size=8), image_seq_length=4,
        downsample_ratio=0.5, image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        tie_word_embeddings=False)


def build_internvl_model(seed: int = 0):
    """A tiny randomly initialised model matching `build_internvl_processor()`: fp32, eval
    mode, eager attention; a deep copy of a cached model per call."""
    return cached_model_copy(_MODEL_CLASS, _config, seed)


def save_internvl_checkpoint(path, *, seed: int = 0):
    """Write a tiny float32 checkpoint vLLM loads (``vllm.LLM(model=path)``): the model with
    head_dim 64 (vLLM's CPU attention refuses less), the STOCK ``InternVLProcessor`` with its
    video processor (what ``AutoProcessor`` loads; needs torchvision's transforms: the vLLM
    environment, scripts/envs/vllm.sh) and the tokenizer, template and image settings of
    `build_internvl_processor`. Returns the path."""
    import transformers

    proc = build_internvl_processor()
    video = transformers.InternVLVideoProcessor(size={"height": TILE, "width": TILE})
    stock = transformers.InternVLProcessor(
        image_processor=proc.image_processor, tokenizer=proc.tokenizer, video_processor=video,
        chat_template=proc.chat_template, image_seq_length=proc.image_seq_length)
    model = seeded_model(_MODEL_CLASS, _config(head_dim=64), int(seed))
    return write_checkpoint(model, stock, path)


def offline_processor(family: str, *, min_pixels: int | None = None,
                      max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for InternVL (`mmpipe.offline.tokenizer.OWN_BUILDERS`):
    fixed-size tiles, so pixel bounds do not apply."""
    refuse_pixel_bounds(family, min_pixels, max_pixels)
    return build_internvl_processor()


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for InternVL."""
    return build_internvl_model(seed)
