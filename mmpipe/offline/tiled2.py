"""Offline fixtures for the tiled families InternVL and LLaVA-OneVision: their real
transformers processors with SMALL tiles (so tests are fast) and tiny randomly initialised
``InternVLForConditionalGeneration`` / ``LlavaOnevisionForConditionalGeneration`` models that
match them, built locally with no download and no torchvision::

    >>> proc = build_tiled2_processor("internvl")           # doctest: +SKIP
    >>> model = build_tiled2_model("internvl")              # doctest: +SKIP

The processors are `mmpipe.offline.generic.build_foreign_processor`'s (stock processor class,
the family's PIL image processor, the offline tokenizer with the family's image tokens and a
chat template rendering each image as ``<IMG_CONTEXT>`` / ``<image>``) with the image
processor swapped for one with 32x32 tiles:

- InternVL: ``GotOcr2ImageProcessorPil(size=32x32, max_patches=6)``; the processor turns
  ``crop_to_patches`` on (its default). 4 tokens per tile (vision 32x32 / patch 8 = 4x4
  patches, pixel-shuffled by 0.5 to 2x2).
- LLaVA-OneVision: ``LlavaOnevisionImageProcessorPil(size=32x32)`` with grid pinpoints up to
  4x4 tiles (so ``anyres_max_9`` shrinks the largest grids, as with real checkpoints); 4 tokens
  per tile (SigLIP 32x32 / patch 16, ``"full"`` strategy).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.errors import ArgumentError
from mmpipe.offline.generic import build_foreign_processor

__all__ = ["TILED2_FAMILIES", "TILE", "ONEVISION_PINPOINTS", "build_tiled2_processor", "build_tiled2_model",
           "save_tiled2_checkpoint"]

TILED2_FAMILIES = ("internvl", "llava_onevision")
TILE = 32  # tile side in pixels (the tiny vision towers' image_size)
# (height, width) pinpoints: every grid of 1..4 x 1..4 tiles of TILE pixels
ONEVISION_PINPOINTS = [[TILE * r, TILE * c] for r in range(1, 5) for c in range(1, 5)]


def build_tiled2_processor(name: str, **image_kwargs):
    """A real InternVL or LLaVA-OneVision processor (``name`` in `TILED2_FAMILIES`) with 32x32
    tiles; ``image_kwargs`` override the image processor's settings (e.g. ``max_patches=12``,
    ``image_grid_pinpoints=...``). A fresh object on every call."""
    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"unknown tiled offline processor {name!r}; use one of {TILED2_FAMILIES}")
    import transformers

    proc = build_foreign_processor(name)
    if name == "internvl":
        kwargs = {"size": {"height": TILE, "width": TILE}, "max_patches": 6, **image_kwargs}
        proc.image_processor = transformers.GotOcr2ImageProcessorPil(**kwargs)
    else:
        kwargs = {"size": {"height": TILE, "width": TILE}, "image_grid_pinpoints": ONEVISION_PINPOINTS, **image_kwargs}
        proc.image_processor = transformers.LlavaOnevisionImageProcessorPil(**kwargs)
    return proc


def _config(name: str, head_dim: int = 16):
    """Text: Qwen2, 2 layers, 4 heads of ``head_dim`` (2 of 64 for vLLM); vision: 1 layer, 32x32 images."""
    import transformers

    tok = build_tiled2_processor(name).tokenizer
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    heads = 4 if head_dim < 64 else 2
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=heads * head_dim, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=4096,
                pad_token_id=pad, bos_token_id=pad, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                tie_word_embeddings=False)
    vision = dict(hidden_size=2 * head_dim, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=TILE)
    if head_dim >= 64:
        vision.update(hidden_size=head_dim, num_attention_heads=1)
    if name == "internvl":
        return transformers.InternVLConfig(
            text_config=text, vision_config=dict(vision, patch_size=8), image_seq_length=4, downsample_ratio=0.5,
            image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), tie_word_embeddings=False)
    return transformers.LlavaOnevisionConfig(
        text_config=text, vision_config=dict(vision, model_type="siglip_vision_model", patch_size=16),
        image_token_index=tok.convert_tokens_to_ids("<image>"), video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=ONEVISION_PINPOINTS, vision_feature_select_strategy="full", vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9")


@functools.lru_cache(maxsize=4)
def _cached_model(name: str, seed: int):
    import torch
    import transformers

    cls = {"internvl": "InternVLForConditionalGeneration",
           "llava_onevision": "LlavaOnevisionForConditionalGeneration"}[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, cls)._from_config(_config(name), attn_implementation="eager",
                                                        dtype=torch.float32)
    return model.eval()


def build_tiled2_model(name: str, seed: int = 0):
    """A tiny randomly initialised model matching `build_tiled2_processor(name)`: fp32, eval
    mode, eager attention; a deep copy of a cached model per call."""
    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"no tiled offline model for {name!r}; build_tiled2_model builds one of {TILED2_FAMILIES}")
    return copy.deepcopy(_cached_model(name, int(seed)))


def save_tiled2_checkpoint(name: str, path, *, seed: int = 0):
    """Write a tiny float32 checkpoint vLLM loads (``vllm.LLM(model=path)``): the model with
    head_dim 64 (vLLM's CPU attention refuses less), the STOCK processor class with the model
    type's video processor (what ``AutoProcessor`` loads; needs torchvision's transforms: the
    vLLM environment, scripts/envs/vllm.sh) and the same tokenizer, template and image settings
    as `build_tiled2_processor`. LLaVA-OneVision's vision weights are written under the real
    checkpoints' names (``vision_tower.vision_model.*``, which vLLM reads). Returns the path."""
    from pathlib import Path

    import torch
    import transformers

    if name not in TILED2_FAMILIES:
        raise ArgumentError(f"no tiled checkpoint for {name!r}; save_tiled2_checkpoint saves one of {TILED2_FAMILIES}")
    proc, path = build_tiled2_processor(name), Path(path)
    size = {"height": TILE, "width": TILE}
    if name == "internvl":
        stock = transformers.InternVLProcessor(image_processor=proc.image_processor, tokenizer=proc.tokenizer,
                                               video_processor=transformers.InternVLVideoProcessor(size=size),
                                               chat_template=proc.chat_template, image_seq_length=proc.image_seq_length)
    else:
        stock = transformers.LlavaOnevisionProcessor(
            image_processor=proc.image_processor, tokenizer=proc.tokenizer, chat_template=proc.chat_template,
            video_processor=transformers.LlavaOnevisionVideoProcessor(size=size), num_image_tokens=proc.num_image_tokens,
            vision_feature_select_strategy=proc.vision_feature_select_strategy)
    cls = getattr(transformers, {"internvl": "InternVLForConditionalGeneration",
                                 "llava_onevision": "LlavaOnevisionForConditionalGeneration"}[name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = cls._from_config(_config(name, head_dim=64), dtype=torch.float32)
    tok = proc.tokenizer
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    stock.save_pretrained(path)
    if name == "llava_onevision":
        from safetensors.torch import load_file, save_file

        file = path / "model.safetensors"
        weights = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
                   for k, v in load_file(file).items()}
        save_file(weights, file, metadata={"format": "pt"})
    return path


def offline_processor(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for this module's tiled families (`mmpipe.offline.tokenizer.OWN_BUILDERS`):
    fixed-size tiles, so pixel bounds do not apply."""
    if min_pixels is not None or max_pixels is not None:
        raise ArgumentError(f"{family} resizes to fixed-size tiles: min_pixels / max_pixels do not apply; set size "
                            "on the processor's image processor")
    return build_tiled2_processor(family)


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for this module's tiled families."""
    return build_tiled2_model(family, seed)
