"""Offline fixtures: tiny checkpoints on disk that vLLM loads (``vllm.LLM(model=DIR)``,
``vllm serve DIR``) and transformers loads back (``from_pretrained``), one per family.

vLLM asks more of a checkpoint than `mmpipe.offline.models.build_model` gives:

- its CPU attention refuses head sizes below 64, so the text model here has ``head_dim`` 64
  (hidden 128, 2 heads; ``mrope_section`` is the family's real split scaled to head_dim 64);
- it loads the processor with ``AutoProcessor``, which needs the family's STOCK processor
  class and a video processor config (the image-only processors of
  `mmpipe.offline.processors` have neither), so the processor is saved as the stock class
  with the model type's video processor. That class needs torchvision's Python transforms:
  build checkpoints where they import (the vLLM test environment, `scripts/envs/vllm.sh`).

Weights are float32 and seeded: the same ``(family, seed)`` gives the same weights.

    >>> path = save_checkpoint("qwen2_vl", "/tmp/tiny-qwen2-vl")        # doctest: +SKIP
    >>> llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from mmpipe.errors import ArgumentError
from mmpipe.families import QWEN2_5_VL, QWEN2_VL, QWEN3_VL, get_family
from mmpipe.offline.processors import build_image_processor, default_pixel_bounds
from mmpipe.offline.seeded import seeded_model
from mmpipe.offline.tokenizer import build_tokenizer, check_family, special_token_ids
from mmpipe.offline.chat_templates import chat_template

__all__ = ["HEAD_DIM", "checkpoint_config", "rope_fields", "build_checkpoint_processor", "save_checkpoint"]

HEAD_DIM = 64  # vLLM's CPU attention supports head sizes >= 64 (and multiples of 16)
_TEXT = dict(hidden_size=2 * HEAD_DIM, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-6)
_VISION_OUT = dict(hidden_size=32, intermediate_size=64, out_hidden_size=_TEXT["hidden_size"])
# Per-architecture config fields (vision tower shape, rope flags) for a tiny model: what the
# ModelFamily table (the real checkpoints' constants) does not describe.
_TINY = {
    QWEN2_VL.name: dict(text={}, rope={}, vision=dict(embed_dim=32, mlp_ratio=2, hidden_size=_TEXT["hidden_size"])),
    QWEN2_5_VL.name: dict(text={}, rope={}, vision=dict(
        _VISION_OUT, window_size=QWEN2_5_VL.factor * 4, fullatt_block_indexes=[0],
        tokens_per_second=int(QWEN2_5_VL.tokens_per_second))),
    QWEN3_VL.name: dict(text=dict(head_dim=HEAD_DIM), rope=dict(mrope_interleaved=True), vision=dict(
        _VISION_OUT, num_position_embeddings=256, deepstack_visual_indexes=[0])),
}


def checkpoint_config(family: str):
    """The transformers config of the tiny vLLM-loadable model of ``family`` (head_dim 64)."""
    import transformers

    fam = get_family(check_family(family))
    tiny = _TINY[fam.name]
    ids = special_token_ids(fam.name)
    # the real checkpoints split head_dim 128; the same proportions for head_dim 64
    section = [s * HEAD_DIM // 128 for s in fam.mrope_section]
    rope = dict({"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}, **tiny["rope"])
    text = dict(_TEXT, vocab_size=len(build_tokenizer(fam.name)), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], **rope_fields(rope),
                **tiny["text"])
    vision = dict(depth=1, num_heads=2, in_channels=3, patch_size=fam.patch_size, spatial_merge_size=fam.merge_size,
                  temporal_patch_size=fam.temporal_patch_size, **tiny["vision"])
    config_class = getattr(transformers, fam.model_class).config_class
    return config_class(
        text_config=text, vision_config=vision, image_token_id=ids[fam.image_token],
        video_token_id=ids[fam.video_token], vision_start_token_id=ids[fam.vision_start_token],
        vision_end_token_id=ids[fam.vision_end_token], torch_dtype="float32",
    )


def rope_fields(rope: dict, version: str | None = None) -> dict:
    """The text config's rope fields in the installed transformers' form: 5.x takes
    ``rope_parameters`` (theta inside); 4.x takes ``rope_theta`` and ``rope_scaling`` (the
    M-RoPE split inside; without it 4.57's Qwen2-VL / Qwen2.5-VL attention fails to load)."""
    if version is None:
        import transformers

        version = transformers.__version__
    if int(version.split(".")[0]) >= 5:
        return {"rope_parameters": dict(rope)}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    scaling["type"] = scaling["rope_type"]  # 4.x configs (and vLLM's readers) spell both
    return {"rope_theta": rope["rope_theta"], "rope_scaling": scaling}


def build_checkpoint_processor(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """The family's STOCK processor class (e.g. ``Qwen2VLProcessor``) with the offline
    tokenizer, the family's image processor (pixel bounds as `build_image_processor`) and the
    model type's video processor. Needs torchvision's transforms (ArgumentError without)."""
    import transformers
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    fam = get_family(check_family(family))
    model_type = fam.model_types[0]
    names = VIDEO_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
    name = names.get("torchvision") if isinstance(names, dict) else names
    video_cls = getattr(transformers, name, None) if name else None
    if video_cls is None or not transformers.utils.is_torchvision_available():
        raise ArgumentError(
            f"a vLLM-loadable {fam.name} checkpoint needs the stock processor with a video processor, which "
            "needs torchvision's Python transforms; build it in the vLLM environment (scripts/envs/vllm.sh puts "
            "the torchvision-transforms folder on PYTHONPATH)"
        )
    lo, hi = default_pixel_bounds(fam.name)
    image = build_image_processor(fam.name, min_pixels=min_pixels, max_pixels=max_pixels)
    video = video_cls(patch_size=fam.patch_size, temporal_patch_size=fam.temporal_patch_size,
                      merge_size=fam.merge_size, image_mean=list(fam.image_mean), image_std=list(fam.image_std),
                      size={"shortest_edge": min_pixels or lo, "longest_edge": max_pixels or hi})
    stock = getattr(transformers, fam.processor_classes[0])
    return stock(image_processor=image, tokenizer=build_tokenizer(fam.name), video_processor=video,
                 chat_template=chat_template(fam.name))


def save_checkpoint(family: str, path: Union[str, Path], *, seed: int = 0, min_pixels: int | None = None,
                    max_pixels: int | None = None) -> Path:
    """Write a tiny randomly initialised float32 checkpoint of ``family`` to ``path``: model
    (safetensors, `checkpoint_config`), generation config, and the stock processor
    (`build_checkpoint_processor`). Returns the directory. Idempotent for the same arguments
    (a ``mmpipe_checkpoint.json`` stamp records them)."""
    import transformers

    fam = get_family(check_family(family))
    path = Path(path)
    stamp = {"family": fam.name, "seed": int(seed), "min_pixels": min_pixels, "max_pixels": max_pixels,
             "head_dim": HEAD_DIM, "transformers": transformers.__version__}
    stamp_file = path / "mmpipe_checkpoint.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    processor = build_checkpoint_processor(fam.name, min_pixels=min_pixels, max_pixels=max_pixels)
    model = seeded_model(fam.model_class, checkpoint_config(fam.name), int(seed))
    ids = special_token_ids(fam.name)
    gen = model.generation_config
    gen.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gen.pad_token_id = gen.bos_token_id = ids["<|endoftext|>"]
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    stamp_file.write_text(json.dumps(stamp))
    return path
