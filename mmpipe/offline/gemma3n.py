"""Offline fixtures for Gemma 3n, images only (transformers 5.24 ``gemma3n``) on the generic path, in the
"vision" test environment: `mmpipe.offline.vision_env_vlms.build_vision_env_processor` /
``build_vision_env_model("gemma3n")`` call `build_processor` / `build_model` here.

Gemma 3n (``Gemma3nProcessor``, ``SiglipImageProcessor`` - torchvision,
``Gemma3nAudioFeatureExtractor``; vision tower: timm ``mobilenetv5_300m_enc`` through
``TimmWrapperModel``): preprocessor_config ``do_normalize`` false, ``do_rescale`` true, resample
2 (bilinear), 768x768; 256 soft tokens per image; the chat template is Gemma 3's with the
Gemma 3n placeholders ``<image_soft_token>`` / ``<audio_soft_token>`` (written here from the
published Gemma 3 template's structure), the processor expanding each to
``\\n\\n<start_of_image>`` + n x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``; the tokenizer
adds ``<bos>``.
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["GEMMA3N_TOKENS", "GEMMA3N_CHAT_TEMPLATE", "GEMMA3N_IMAGE", "GEMMA3N_TOKENS_PER_IMAGE", "GEMMA3N_AUDIO_TOKENS",
           "GEMMA3N_TINY_ARCH", "build_processor", "build_model"]

GEMMA3N_TOKENS = ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                  "<image_soft_token>", "<start_of_audio>", "<end_of_audio>", "<audio_soft_token>")
GEMMA3N_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' -%}{{ '<audio_soft_token>' }}"
    "{%- elif item['type'] == 'image' -%}{{ '<image_soft_token>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA3N_IMAGE = 64  # tiny: 64x64 images; the tiny MobileNetV5 (stride 32) ends at 2x2 -> 4 soft tokens
GEMMA3N_TOKENS_PER_IMAGE = 4
# soft tokens per clip (published: 188, for 30 s); the tiny conformer gives fewer for clips up to ~2.5 s and the
# model pads them with its last audio embedding, as the published one does
GEMMA3N_AUDIO_TOKENS = 16


@functools.lru_cache(maxsize=None)
def _gemma3n_tokenizer():
    named = dict(image_token="<image_soft_token>", boi_token="<start_of_image>", eoi_token="<end_of_image>",
                 audio_token="<audio_soft_token>", boa_token="<start_of_audio>", eoa_token="<end_of_audio>")
    return offline_tokenizer(GEMMA3N_TOKENS, bos="<bos>", eos="<end_of_turn>", pad="<pad>", named=named, add_bos=True,
                             template=GEMMA3N_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Gemma3nProcessor`` around the stock ``SiglipImageProcessor`` (published settings, tiny
    `GEMMA3N_IMAGE` size), the stock audio feature extractor, `GEMMA3N_TOKENS_PER_IMAGE` soft tokens per
    image, the offline tokenizer (adds the BOS) and `GEMMA3N_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    tok = copy.deepcopy(_gemma3n_tokenizer())
    ip = transformers.SiglipImageProcessor(size={"height": GEMMA3N_IMAGE, "width": GEMMA3N_IMAGE}, resample=2,
                                           do_normalize=False, do_rescale=True, do_convert_rgb=True)
    return transformers.Gemma3nProcessor(feature_extractor=transformers.Gemma3nAudioFeatureExtractor(),
                                         image_processor=ip, tokenizer=tok, chat_template=GEMMA3N_CHAT_TEMPLATE,
                                         image_seq_length=GEMMA3N_TOKENS_PER_IMAGE,
                                         audio_seq_length=GEMMA3N_AUDIO_TOKENS)


# a MobileNetV5 of the published block kinds (edge residual, universal inverted residual, multi-query
# attention; a stage ends with a residual block, as there), one to three blocks a stage, tiny channels;
# timm's mobilenetv5_300m_enc takes it as block_args
GEMMA3N_TINY_ARCH = (
    ("er_r1_k3_s2_e4_c16",),
    ("uir_r1_a3_k5_s2_e6_c24",),
    ("uir_r1_a5_k5_s2_e6_c32", "mqa_r1_k3_h2_v2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"),
    ("uir_r1_a5_k5_s2_e6_c32", "mqa_r1_k3_h2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"),
)


def build_model():
    """Text: Gemma 3n (AltUp, Laurel, per-layer inputs), hidden 64, 2 layers (sliding then full);
    vision: timm ``mobilenetv5_300m_enc`` with `GEMMA3N_TINY_ARCH` (stem 16 channels), its
    multi-scale fusion adapter at 2x2 (``msfa_output_resolution``) -> 4 soft tokens of 2048
    (the encoder's fixed width); audio: a tiny conformer, `GEMMA3N_AUDIO_TOKENS` soft tokens per clip. The
    text vocabulary spans the vision and audio embedding ranges after the tokenizer's (8 ids each), as the
    published 262,400 spans 262,144 + 128 + 128: the model pads short clips with the last audio id."""
    import torch
    import transformers
    from timm.models._efficientnet_builder import decode_arch_def

    tok = _gemma3n_tokenizer()
    boi, eoi, image_id, boa, eoa, audio_id = ids(tok, "<start_of_image>", "<end_of_image>", "<image_soft_token>",
                                                  "<start_of_audio>", "<end_of_audio>", "<audio_soft_token>")
    n = len(tok)
    text = dict(vocab_size=n + 16, vocab_size_per_layer_input=n, hidden_size=64, hidden_size_per_layer_input=8,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                head_dim=32, layer_types=["sliding_attention", "full_attention"], sliding_window=512,
                num_kv_shared_layers=0, activation_sparsity_pattern=[0.0, 0.0], laurel_rank=8,
                altup_num_inputs=2, max_position_embeddings=4096, pad_token_id=tok.pad_token_id)
    vision = dict(architecture="mobilenetv5_300m_enc", hidden_size=2048, vocab_size=8, vocab_offset=n,
                  model_args=dict(block_args=decode_arch_def([list(s) for s in GEMMA3N_TINY_ARCH]), stem_size=16,
                                  msfa_output_resolution=2))
    audio = dict(vocab_size=8, vocab_offset=n + 8, hidden_size=32, conf_num_attention_heads=2,
                 conf_num_hidden_layers=1, sscp_conv_channel_size=[8, 8])
    cfg = transformers.Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio,
                                     vision_soft_tokens_per_image=GEMMA3N_TOKENS_PER_IMAGE,
                                     audio_soft_tokens_per_image=GEMMA3N_AUDIO_TOKENS,
                                     boi_token_id=boi, eoi_token_id=eoi, image_token_id=image_id, boa_token_id=boa,
                                     eoa_token_id=eoa, audio_token_id=audio_id)
    return transformers.Gemma3nForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                     dtype=torch.float32)
