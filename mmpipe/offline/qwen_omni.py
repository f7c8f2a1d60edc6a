"""Offline fixtures for Qwen2.5-Omni's thinker (transformers ``qwen2_5_omni``): images and audio on
the generic path, in the main environment (the video processor needs torchvision, so these
processors take no videos here).

Published facts written into the builders: ``Qwen2_5OmniProcessor`` around
``Qwen2VLImageProcessor`` (patch 14, merge 2, temporal patch 2) and ``WhisperFeatureExtractor``
(128 mel bins, 16 kHz, hop 160, each clip padded to 30 s: ``input_features`` [A, 128, 3000],
``feature_attention_mask`` [A, 3000]); audio tokens per clip
``((frames - 1) // 2 + 1 - 2) // 2 + 1``; the checkpoint's chat template
(`QWEN2_5_OMNI_CHAT_TEMPLATE`: the default system turn, ``<|vision_bos|><|IMAGE|><|vision_eos|>``
per image, ``<|audio_bos|><|AUDIO|><|audio_eos|>`` per clip); the thinker's M-RoPE
(``mrope_section``) with audio positions at 25 per second (TMRoPE), computed by the model's own
``get_rope_index``.
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["QWEN2_5_OMNI_CHAT_TEMPLATE", "QWEN2_5_OMNI_TOKENS", "build_processor", "build_model"]

QWEN2_5_OMNI_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
                       "<|vision_bos|>", "<|vision_eos|>", "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>")
# the published chat_template.json of Qwen/Qwen2.5-Omni-7B (and -3B), as it is
QWEN2_5_OMNI_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: "
    "{% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # tiny: 4..16 merged tokens per image


@functools.lru_cache(maxsize=None)
def _tokenizer():
    named = dict(image_token="<|IMAGE|>", audio_token="<|AUDIO|>", video_token="<|VIDEO|>",
                 vision_bos_token="<|vision_bos|>", vision_eos_token="<|vision_eos|>",
                 audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>")
    return offline_tokenizer(QWEN2_5_OMNI_TOKENS, eos="<|im_end|>", pad="<|endoftext|>", named=named,
                             template=QWEN2_5_OMNI_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Qwen2_5OmniProcessor``: the PIL ``Qwen2VLImageProcessor`` at tiny pixel bounds,
    the stock ``WhisperFeatureExtractor`` (128 mel bins), no video processor, the offline
    tokenizer with the checkpoint's special tokens and `QWEN2_5_OMNI_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    ip = transformers.Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    fe = transformers.WhisperFeatureExtractor(feature_size=128)
    return _class()(image_processor=ip, feature_extractor=fe, tokenizer=copy.deepcopy(_tokenizer()),
                    chat_template=QWEN2_5_OMNI_CHAT_TEMPLATE)


def no_video_class(base: type, extra: dict = None) -> type:
    """An Omni processor class ``base`` without its video processor (whose class check needs
    torchvision): ``ProcessorMixin`` takes the sub-processors from the ``__init__`` signature, so
    this one lists image processor, feature extractor and tokenizer; the stock class stays in the MRO
    (`mmpipe.families.processor_class_name`). ``extra``: further class attributes."""

    def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
        # the stock __init__ passes a video processor positionally: call the mixin's, then set what it sets
        super(base, self).__init__(image_processor, feature_extractor, tokenizer, chat_template=chat_template)
        for name in ("image", "audio", "video"):
            setattr(self, f"{name}_token", getattr(tokenizer, f"{name}_token"))
            setattr(self, f"{name}_token_id", getattr(tokenizer, f"{name}_token_id"))
        for name in ("vision_bos", "vision_eos", "audio_bos", "audio_eos"):
            setattr(self, f"{name}_token", getattr(tokenizer, f"{name}_token"))

    return type(f"NoVideo{base.__name__}", (base,), {"__init__": __init__, "__module__": __name__, **(extra or {})})


@functools.lru_cache(maxsize=None)
def _class() -> type:
    import transformers

    return no_video_class(transformers.Qwen2_5OmniProcessor)


def build_model():
    """A tiny ``Qwen2_5OmniThinkerForConditionalGeneration``: text hidden 64 (4 heads of 16,
    ``mrope_section`` [2, 3, 3]), 2 layers; vision depth 2 (patch 14, merge 2, out 64); audio
    encoder 2 layers of width 32 (128 mel bins, output 64); fp32, eager attention."""
    import torch
    import transformers

    tok = _tokenizer()
    audio_id, image_id, video_id, a_bos, a_eos, v_bos, v_eos = ids(
        tok, "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
        "<|vision_eos|>")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
                rope_scaling={"type": "default", "mrope_section": [2, 3, 3]}, pad_token_id=tok.pad_token_id)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  fullatt_block_indexes=[1], window_size=56)
    audio = dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                 output_dim=64, n_window=100, max_source_positions=1500)
    cfg = transformers.Qwen2_5OmniThinkerConfig(
        text_config=text, vision_config=vision, audio_config=audio, audio_token_index=audio_id,
        image_token_index=image_id, video_token_index=video_id, audio_start_token_id=a_bos,
        audio_end_token_id=a_eos, vision_start_token_id=v_bos, vision_end_token_id=v_eos)
    return transformers.Qwen2_5OmniThinkerForConditionalGeneration._from_config(
        cfg, attn_implementation="eager", dtype=torch.float32).eval()
