"""Offline fixtures for Phi-4-multimodal, images only (transformers 5.24 ``phi4_multimodal``) on the
generic path, in the "vision" test environment: `mmpipe.offline.vision_env_vlms.build_vision_env_processor` /
``build_vision_env_model("phi4_multimodal")`` call `build_processor` / `build_model` here.

Phi-4-multimodal (``Phi4MultimodalProcessor``, ``Phi4MultimodalImageProcessor`` - torchvision,
``Phi4MultimodalFeatureExtractor``): the processor reads ``tokenizer.image_token`` /
``audio_token`` (named here ``<|image|>`` / ``<|audio|>``; the config's ``image_token_id`` is 200010
in the published vocabulary); turns ``<|user|>`` ... ``<|end|>`` ``<|assistant|>`` ... ``<|end|>``,
the eos after the last turn when no generation prompt is asked for (`PHI4MM_CHAT_TEMPLATE`: written
from that published turn format with list content, images as ``<|image|>``; the hub file itself was
not read here). The image processor cuts each image into crops of ``size`` (dynamic HD, at most
``dynamic_hd``) plus a global view: ``image_pixel_values`` ``[images, max crops, 3, s, s]`` (an
image's missing crops zeros, up to the call's largest), ``image_attention_mask`` ``[images, max
crops, s/patch, s/patch]`` (missing crops ONES), ``image_sizes`` ``[images, 2]``; its token count
hard-codes 256 + 16 for the global view (a 32x32-patch crop pooled 2x2), so the tiny tower keeps
32x32 patches per crop: 64-pixel crops of patch 2 (published: 448, patch 14).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["PHI4MM_TOKENS", "PHI4MM_CHAT_TEMPLATE", "PHI4MM_CROP", "PHI4MM_MAX_CROPS", "build_processor", "build_model"]

PHI4MM_TOKENS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|image|>", "<|audio|>",
                 "<|tool|>", "<|/tool|>")
PHI4MM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif content['type'] == 'audio' %}{{ '<|audio|>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
PHI4MM_CROP = 64  # tiny crops: 64x64 pixels = 32x32 patches of 2 (the processor's 256 + 16 global tokens)
PHI4MM_MAX_CROPS = 4


@functools.lru_cache(maxsize=None)
def _phi4mm_tokenizer():
    return offline_tokenizer(PHI4MM_TOKENS, bos="<|endoftext|>", eos="<|endoftext|>", pad="<|endoftext|>",
                             named=dict(image_token="<|image|>", audio_token="<|audio|>"),
                             template=PHI4MM_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Phi4MultimodalProcessor`` around the stock image processor at `PHI4MM_CROP` crops (patch
    2, at most `PHI4MM_MAX_CROPS` HD crops) and feature extractor, the offline tokenizer (``<|image|>`` /
    ``<|audio|>`` named) and `PHI4MM_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    tok = copy.deepcopy(_phi4mm_tokenizer())
    ip = transformers.Phi4MultimodalImageProcessor(size={"height": PHI4MM_CROP, "width": PHI4MM_CROP}, patch_size=2,
                                                   dynamic_hd=PHI4MM_MAX_CROPS)
    return transformers.Phi4MultimodalProcessor(image_processor=ip,
                                                audio_processor=transformers.Phi4MultimodalFeatureExtractor(),
                                                tokenizer=tok, chat_template=PHI4MM_CHAT_TEMPLATE)


def build_model():
    """Text Phi-3 style, hidden 64, 2 layers; vision (SigLIP-like) hidden 32, 2 layers, 64x64
    crops of 2x2 patches (32x32 patches: 16x16 tokens after the 2x2 pooling); audio encoder
    a tiny conformer (width 32 throughout, one block). SDPA attention: its rows hold 500-2,500 tokens (eager: about twice as
    slow on CPU; batched == per-row either way)."""
    import torch
    import transformers

    tok = _phi4mm_tokenizer()
    image_id, audio_id = ids(tok, "<|image|>", "<|audio|>")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=PHI4MM_CROP, patch_size=2, crop_size=PHI4MM_CROP, image_token_id=image_id,
                  feature_layer=-2)
    audio = dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2, nemo_conv_channels=32,
                 ext_pw_out_channel=32, depthwise_separable_out_channel=32,
                 audio_token_id=audio_id, downsample_rate=1)
    cfg = transformers.Phi4MultimodalConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, original_max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        vision_config=vision, audio_config=audio)
    return transformers.Phi4MultimodalForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
