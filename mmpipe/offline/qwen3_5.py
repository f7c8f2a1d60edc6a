"""Offline fixtures for the model lines that load with the Qwen3-VL processor: tiny randomly
initialised Qwen3.5 (``Qwen3_5ForConditionalGeneration``, hybrid linear / full attention),
Qwen3.5-MoE and Qwen3-VL-MoE, built locally from transformers' own classes with no download::

    >>> proc = build_qwen3_5_processor()                     # doctest: +SKIP
    >>> model = build_qwen3_5_model("qwen3_5")               # doctest: +SKIP

The processor is `mmpipe.offline.build_processor` of the Qwen3-VL family (what Qwen3.5
checkpoints ship); each model's vision tower takes its patch / merge / temporal sizes from that
family's table row and its image / video / vision start / end token ids and vocabulary size
from the offline tokenizer, as `mmpipe.offline.build_model` does for Qwen3-VL. Text: hidden 64,
4 heads (2 KV), fp32, eager attention. Qwen3.5 lines: 2 layers, one ``linear_attention``
(gated delta rule: 2 key / 4 value heads of 16, convolution kernel 4) then one
``full_attention`` (head_dim 32, half of it rotary - the checkpoints: a quarter -, M-RoPE
[4, 2, 2] interleaved);
Qwen3-VL-MoE: 2 full-attention layers (head_dim 16, deepstack at vision layer 0). The MoE
lines: 4 experts, 2 per token, expert width 32 (Qwen3.5-MoE adds a shared expert of 32).
``build_model(name)`` hands these names over (`MODEL_LINES`). Qwen3.5 needs transformers 5.x
(4.57 has no such class: an `ArgumentError` says so); Qwen3-VL-MoE builds on both lines.
"""

from __future__ import annotations

from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.families import QWEN3_VL
from mmpipe.offline.tiny_towers import cached_model_copy

__all__ = ["MODEL_LINES", "build_qwen3_5_processor", "build_qwen3_5_model", "offline_model"]

# line name -> transformers model class
MODEL_LINES = {
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}
_MROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2], mrope_interleaved=True)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_LINEAR = dict(layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4, head_dim=32)


def build_qwen3_5_processor(min_pixels: int | None = None, max_pixels: int | None = None):
    """The processor these models load with: `mmpipe.offline.build_processor` of Qwen3-VL."""
    from mmpipe.offline.processors import build_processor

    return build_processor(QWEN3_VL.name, min_pixels=min_pixels, max_pixels=max_pixels)


def _token_fields() -> tuple[dict, dict]:
    """(the top config's image / video / vision start / end ids, the text config's vocabulary
    and bos / eos / pad ids), from the offline tokenizer of the Qwen3-VL family."""
    from mmpipe.offline.tokenizer import build_tokenizer, special_token_ids

    fam, ids = QWEN3_VL, special_token_ids(QWEN3_VL.name)
    top = dict(image_token_id=ids[fam.image_token], video_token_id=ids[fam.video_token],
               vision_start_token_id=ids[fam.vision_start_token], vision_end_token_id=ids[fam.vision_end_token])
    text = dict(vocab_size=len(build_tokenizer(fam.name)), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return top, text


def _config(name: str, text: dict, vision: dict, rope: dict):
    import transformers

    top, token_text = _token_fields()
    if is_transformers_5():
        rope_fields = dict(rope_parameters=rope)
    else:  # 4.x: theta apart, the M-RoPE split in rope_scaling
        rope = dict(rope)
        rope_fields = dict(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                **token_text, **rope_fields, **text)
    fam = QWEN3_VL
    vision = dict(depth=1, num_heads=2, in_channels=3, hidden_size=32, intermediate_size=64, out_hidden_size=64,
                  patch_size=fam.patch_size, spatial_merge_size=fam.merge_size,
                  temporal_patch_size=fam.temporal_patch_size, num_position_embeddings=256, **vision)
    config_class = getattr(transformers, _model_class(name)).config_class
    return config_class(text_config=text, vision_config=vision, **top)


def _qwen3_5_config():
    return _config("qwen3_5", dict(_LINEAR), {}, dict(_MROPE, partial_rotary_factor=0.5))


def _qwen3_5_moe_config():
    return _config("qwen3_5_moe", dict(_LINEAR, **_MOE, shared_expert_intermediate_size=32), {},
                   dict(_MROPE, partial_rotary_factor=0.5))


def _qwen3_vl_moe_config():
    return _config("qwen3_vl_moe", dict(_MOE, head_dim=16), dict(deepstack_visual_indexes=[0]), dict(_MROPE))


_CONFIGS = {"qwen3_5": _qwen3_5_config, "qwen3_5_moe": _qwen3_5_moe_config, "qwen3_vl_moe": _qwen3_vl_moe_config}


def _model_class(name: str) -> str:
    """The transformers class of ``name``; `ArgumentError` for an unknown name or a class the
    installed transformers lacks."""
    import transformers

    if name not in MODEL_LINES:
        raise ArgumentError(f"unknown model line {name!r}; known: {list(MODEL_LINES)}")
    cls = MODEL_LINES[name]
    if not hasattr(transformers, cls):
        raise ArgumentError(f"{name}: transformers {transformers.__version__} has no {cls} (it came with "
                            "transformers 5); install transformers>=5 to build it")
    return cls


def build_qwen3_5_model(name: str = "qwen3_5", seed: int = 0):
    """The tiny ``name`` model (one of `MODEL_LINES`) matching `build_qwen3_5_processor()`:
    fp32, eval mode, eager attention, weights from ``seed``; built once per (name, seed) and
    handed out as a deep copy. Generation stops at ``<|im_end|>`` or ``<|endoftext|>``."""
    from mmpipe.offline.tokenizer import special_token_ids

    model = cached_model_copy(_model_class(name), _CONFIGS[name], seed)
    ids = special_token_ids(QWEN3_VL.name)
    gen = model.generation_config
    gen.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gen.pad_token_id = gen.bos_token_id = ids["<|endoftext|>"]
    gen.do_sample = False
    return model


def offline_model(name: str, seed: int = 0):
    """`mmpipe.offline.build_model` for these lines."""
    return build_qwen3_5_model(name, seed)
