"""What the InternVL and LLaVA-OneVision offline builders (`mmpipe.offline.internvl`,
`mmpipe.offline.onevision`) share: the tile size, the tiny Qwen2 text and vision tower
configs, seeded construction (`mmpipe.offline.seeded`) and the checkpoint layout vLLM loads. Kept in one place so the
two families' tiny models stay alike (tests run both side by side and compare them to their
processors) and so neither family module imports the other.
"""

from __future__ import annotations

import copy
import functools

from mmpipe.errors import ArgumentError
from mmpipe.offline.seeded import seeded_model

__all__ = ["TILE", "tiny_tower_configs", "write_checkpoint", "use_hub_vision_names",
           "refuse_pixel_bounds"]

TILE = 32  # tile side in pixels (the tiny vision towers' image_size)


def tiny_tower_configs(tok, head_dim: int = 16) -> tuple[dict, dict]:
    """(text, vision) config dicts for a tokenizer ``tok``. Text: Qwen2, 2 layers, 4 heads of
    ``head_dim`` (2 of 64 for vLLM); vision: 1 layer, TILE x TILE images. The family adds its
    vision model type and patch size."""
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    heads = 4 if head_dim < 64 else 2
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=heads * head_dim,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=heads,
                num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=pad,
                bos_token_id=pad, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                tie_word_embeddings=False)
    vision = dict(hidden_size=2 * head_dim, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=TILE)
    if head_dim >= 64:  # the vLLM checkpoint: one vision head of head_dim as well
        vision.update(hidden_size=head_dim, num_attention_heads=1)
    return text, vision


@functools.lru_cache(maxsize=8)
def _cached_model(class_name: str, config_fn, seed: int):
    return seeded_model(class_name, config_fn(), seed, attn_implementation="eager").eval()


def cached_model_copy(class_name: str, config_fn, seed: int):
    """The tiny test model ``transformers.<class_name>`` of ``config_fn()``: fp32, eval mode,
    eager attention, weights from ``seed``; built once per (class, config, seed) and handed out
    as a deep copy (a test may change its copy)."""
    return copy.deepcopy(_cached_model(class_name, config_fn, int(seed)))


def write_checkpoint(model, processor, path):
    """Save ``model`` and ``processor`` under ``path`` (created) as vLLM loads them, generation
    stopping at ``<|im_end|>`` (the chat template's end of turn) or padding; returns the
    ``Path``."""
    from pathlib import Path

    tok = processor.tokenizer
    stop = [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    model.generation_config.eos_token_id = stop
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def use_hub_vision_names(path) -> None:
    """Rename the vision weights in ``path``/model.safetensors from transformers'
    ``vision_tower.*`` to the real checkpoints' ``vision_tower.vision_model.*``, the names
    vLLM's weight loader reads."""
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    file = Path(path) / "model.safetensors"
    prefix = "vision_tower."
    weights = {(prefix + "vision_model." + k[len(prefix):] if k.startswith(prefix) else k): v
               for k, v in load_file(file).items()}
    save_file(weights, file, metadata={"format": "pt"})


def refuse_pixel_bounds(family: str, min_pixels: int | None, max_pixels: int | None) -> None:
    """`mmpipe.offline.build_processor`'s pixel bounds mean nothing to a fixed-tile family:
    refuse them rather than ignore them."""
    if min_pixels is not None or max_pixels is not None:
        raise ArgumentError(f"{family} resizes to fixed-size tiles: min_pixels / max_pixels do not "
                            "apply; set size on the processor's image processor")
