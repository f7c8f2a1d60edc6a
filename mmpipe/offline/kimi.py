"""Offline fixtures for Kimi-K2.5 (transformers 5.24 ``kimi_k25``) on the generic path, in the
"vision" test environment: `mmpipe.offline.vision_env_vlms.build_vision_env_processor` /
``build_vision_env_model("kimi_k25")`` call `build_processor` / `build_model` here.

Kimi-K2.5 (``Kimi_K25Processor``, ``Kimi_K25ImageProcessor`` - torchvision,
``Kimi_K25VideoProcessor`` - torchvision): each image is written
``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>`` (vLLM's
``KimiK25ForConditionalGeneration.get_placeholder_str``) and ``<|media_pad|>`` expanded to
grid / merge^2 tokens; turns ``<|im_user|>user<|im_middle|>`` ... ``<|im_end|>`` and
``<|im_assistant|>assistant<|im_middle|>`` with a ``<think>...</think>`` block (a rendered
non-thinking prompt ends ``<|im_assistant|>assistant<|im_middle|><think></think>``); config ids
``<|media_begin|>`` 163602, ``<|media_end|>`` 163604, ``<|media_pad|>`` 163605 (``[BOS]`` / ``[EOS]`` /
``[PAD]`` here are the Kimi-K2 tokenizer's names as remembered, not read). The chat
template (`KIMI_K25_CHAT_TEMPLATE`) is a reconstruction from those facts (the hub's
chat_template.jinja was not readable here): images, text, thinking; no tools. Image processor:
navit resize to at most ``size`` per side, padded to multiples of patch x merge; pixels
``[patches, 3, 14, 14]`` float32 and ``image_grid_thw`` ``[images, 3]``.
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["KIMI_K25_TOKENS", "KIMI_K25_CHAT_TEMPLATE", "KIMI_MAX_SIDE", "build_processor", "build_model"]

KIMI_K25_TOKENS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                   "<|im_middle|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                   "<|kimi_k25_video_placeholder|>", "[PAD]", "<think>", "</think>")
KIMI_K25_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ '<|im_system|>system<|im_middle|>' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ '<|im_assistant|>assistant<|im_middle|>' }}"
    "{%- else -%}{{ '<|im_user|>' + message['role'] + '<|im_middle|>' }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<think>' + (message['reasoning_content'] if message['reasoning_content'] is defined else '') + '</think>' }}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or content['type'] == 'image_url' -%}"
    "{{ '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>' }}"
    "{%- elif content['type'] == 'text' -%}{{ content['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_assistant|>assistant<|im_middle|>' }}"
    "{%- if thinking is defined and thinking is false -%}{{ '<think></think>' }}"
    "{%- else -%}{{ '<think>' }}{%- endif -%}"
    "{%- endif -%}"
)
KIMI_MAX_SIDE = 112  # tiny: images resized to at most 112 pixels a side -> up to 8x8 patches of 14, 16 tokens


@functools.lru_cache(maxsize=None)
def _kimi_tokenizer():
    return offline_tokenizer(KIMI_K25_TOKENS, bos="[BOS]", eos="[EOS]", pad="[PAD]", template=KIMI_K25_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Kimi_K25Processor`` (image and video processors: torchvision) at tiny image settings (at
    most `KIMI_MAX_SIDE` pixels a side) with the offline tokenizer and `KIMI_K25_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    tok = copy.deepcopy(_kimi_tokenizer())
    size = {"max_height": KIMI_MAX_SIDE, "max_width": KIMI_MAX_SIDE}
    return transformers.Kimi_K25Processor(image_processor=transformers.Kimi_K25ImageProcessor(size=size),
                                          tokenizer=tok,
                                          video_processor=transformers.Kimi_K25VideoProcessor(size=size),
                                          chat_template=KIMI_K25_CHAT_TEMPLATE)


def build_model():
    """Text DeepSeek-V3 (MLA + MoE: 1 dense then 1 MoE layer of 4 experts, 2 per token), hidden 64;
    vision hidden 32, 1 layer, patch 14, 8x8 learned position grid, 2x2 merge."""
    import torch
    import transformers

    tok = _kimi_tokenizer()
    begin, end, pad_img, video = ids(tok, "<|media_begin|>", "<|media_end|>", "<|media_pad|>",
                                      "<|kimi_k25_video_placeholder|>")
    text = dict(model_type="deepseek_v3", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4,
                n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, num_attention_heads=4,
                num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                v_head_dim=16, max_position_embeddings=4096, pad_token_id=tok.pad_token_id)
    vision = dict(patch_size=14, pos_emb_height=8, pos_emb_width=8, num_attention_heads=2, num_hidden_layers=1,
                  hidden_size=32, intermediate_size=64, merge_kernel_size=[2, 2])
    cfg = transformers.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                                      image_token_id=pad_img, video_token_id=video, vision_start_token_id=begin,
                                      vision_end_token_id=end, tie_word_embeddings=False)
    return transformers.Kimi_K25ForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                      dtype=torch.float32)
