"""Offline fixtures: tiny randomly initialised Qwen-VL models (fp32, eval mode), built locally
from a config whose token ids and vocabulary come from the offline tokenizer and whose patch /
merge / temporal sizes come from `mmpipe.families`."""

from __future__ import annotations

import copy
import functools
import importlib
from typing import TYPE_CHECKING

from mmpipe.families import DEFAULT_FAMILY, QWEN2_5_VL, QWEN2_VL, QWEN3_VL, get_family
from mmpipe.offline.qwen3_5 import MODEL_LINES, build_qwen3_5_model
from mmpipe.offline.tf_lines import rope_config_fields
from mmpipe.offline.tokenizer import OWN_BUILDERS, build_tokenizer, check_family, special_token_ids

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

__all__ = ["ATTN_IMPLEMENTATION", "build_model"]

_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
)
_VISION_OUT = dict(hidden_size=32, intermediate_size=64, out_hidden_size=_TEXT["hidden_size"])

# The tiny models' per-family settings, keyed by the family constants. They are
# transformers' per-architecture config fields (vision tower shape, rope flags) sized for a
# tiny model, which the ModelFamily table (real checkpoints' constants) does not describe;
# the seeded random weights depend on them, so they must not change.
# mrope_section: head_dim = 64 / 4 = 16, so its sum must be 8 (the real checkpoints' split,
# ModelFamily.mrope_section, is for head_dim 128).
_TINY = {
    QWEN2_VL.name: dict(
        mrope_section=[2, 3, 3], text={}, rope={},
        vision=dict(embed_dim=32, mlp_ratio=2, hidden_size=_TEXT["hidden_size"]),
    ),
    QWEN2_5_VL.name: dict(
        mrope_section=[2, 3, 3], text={}, rope={},
        vision=dict(
            _VISION_OUT,
            window_size=QWEN2_5_VL.factor * 4,  # 112 like the checkpoints: 4x4 merged tokens per window
            fullatt_block_indexes=[0],
            tokens_per_second=int(QWEN2_5_VL.tokens_per_second),
        ),
    ),
    QWEN3_VL.name: dict(
        mrope_section=[4, 2, 2], text=dict(head_dim=_TEXT["hidden_size"] // _TEXT["num_attention_heads"]),
        rope=dict(mrope_interleaved=True),
        vision=dict(
            _VISION_OUT,
            num_position_embeddings=256,  # 16 x 16 learned grid, interpolated
            deepstack_visual_indexes=[0],
        ),
    ),
}
# "eager": on CPU a left- or right-padded batch gives bit-identical logits to each row run
# alone (checked for all three families); "sdpa" differs by ~1e-7. Read when a model is first
# built for a (family, seed), which is then cached.
ATTN_IMPLEMENTATION = "eager"


def _model_config(family: str):
    import transformers

    fam = get_family(family)
    tiny = copy.deepcopy(_TINY[family])  # fresh lists in every config, as callers may edit them
    ids = special_token_ids(family)
    common_ids = dict(
        image_token_id=ids[fam.image_token],
        video_token_id=ids[fam.video_token],
        vision_start_token_id=ids[fam.vision_start_token],
        vision_end_token_id=ids[fam.vision_end_token],
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(tiny["mrope_section"])}
    rope_fields = rope_config_fields(dict(rope, **tiny["rope"]))  # 4.x: theta apart, the split in rope_scaling
    text = dict(
        _TEXT,
        vocab_size=len(build_tokenizer(family)),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        **rope_fields,
        **tiny["text"],
    )
    vision_common = dict(
        depth=1,
        num_heads=2,
        in_channels=3,
        patch_size=fam.patch_size,
        spatial_merge_size=fam.merge_size,
        temporal_patch_size=fam.temporal_patch_size,
    )
    config_class = getattr(transformers, fam.model_class).config_class
    return config_class(text_config=text, vision_config=dict(vision_common, **tiny["vision"]), **common_ids)


@functools.lru_cache(maxsize=16)
def _cached_model(family: str, seed: int):
    from mmpipe.offline.seeded import seeded_model

    model = seeded_model(get_family(family).model_class, _model_config(family), seed,
                         attn_implementation=ATTN_IMPLEMENTATION)
    model.eval()
    ids = special_token_ids(family)
    gen = model.generation_config
    gen.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gen.pad_token_id = ids["<|endoftext|>"]
    gen.bos_token_id = ids["<|endoftext|>"]
    gen.do_sample = False
    return model


def build_model(family: str = DEFAULT_FAMILY, seed: int = 0) -> "PreTrainedModel":
    """A tiny randomly initialised Qwen-VL model for ``family``, fp32, eval mode, offline.

    Text: hidden 64, 2 layers, 4 heads (2 KV heads), head_dim 16, ``mrope_section``
    [2, 3, 3] (Qwen3-VL: [4, 2, 2], interleaved). Vision: depth 1, hidden 32, patch / merge /
    temporal patch as the processor of :func:`build_processor`; Qwen3-VL deepstack at [0].
    Token ids and ``vocab_size`` come from :func:`build_tokenizer`. Attention is ``"eager"``.
    ``family`` may also name a model line that loads with the Qwen3-VL processor (`MODEL_LINES`:
    ``"qwen3_5"``, ``"qwen3_5_moe"``, ``"qwen3_vl_moe"``; `mmpipe.offline.qwen3_5`).
    The same ``(family, seed)`` gives the same weights; the model is built once and each call
    returns a deep copy, so callers may train or modify it freely.
    """
    if family in MODEL_LINES:  # Qwen3.5, Qwen3.5-MoE, Qwen3-VL-MoE: the Qwen3-VL processor's other models
        return build_qwen3_5_model(family, seed)
    if family in OWN_BUILDERS:  # a family with a builder module of its own (mmpipe.offline.glm4v)
        return importlib.import_module(OWN_BUILDERS[family]).offline_model(family, seed)
    return copy.deepcopy(_cached_model(check_family(family), int(seed)))
