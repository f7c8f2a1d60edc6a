"""Offline fixtures for Gemma 4 (transformers ``gemma4``: images and audio) on the generic path, in the
"vision" test environment (its processor needs its video processor, which needs torchvision):
`mmpipe.offline.vision_env_vlms.build_vision_env_processor` / ``build_vision_env_model("gemma4")``
call `build_processor` / `build_model` here.

Gemma 4 (``Gemma4Processor``: ``Gemma4ImageProcessorPil``, ``Gemma4AudioFeatureExtractor``,
``Gemma4VideoProcessor``): each image is resized to keep its aspect ratio within a patch budget
(``max_soft_tokens`` x ``pooling_kernel_size``^2 patches of 16 px; the smallest published budget,
70 soft tokens, here), its patches padded to the budget (``pixel_values`` [I, max_patches, 768],
``image_position_ids`` [I, max_patches, 2], -1 at the padding); the processor expands each
``<|image|>`` to ``<|image>`` + one ``<|image|>`` per soft token + ``<image|>`` and each
``<|audio|>`` to ``<|audio>`` + one ``<|audio|>`` per 40 ms + ``<audio|>``, and returns
``mm_token_type_ids`` (the model attends bidirectionally within each image's tokens).

The chat template has the published template's structure (google/gemma-4-31B-it, as llama.cpp
keeps a copy of it; the hub file itself is not reachable here) for everything but tool calls:
the BOS written by the template (the tokenizer would add one too), a system turn when the first
message is a system message or thinking is on (``<|think|>`` at its top), roles ``user`` / ``model``
between ``<|turn>`` and ``<turn|>``, user text trimmed, model text with its thinking channels
(``<|channel>...<channel|>``) stripped, consecutive assistant messages continuing one model turn,
one placeholder per image, audio clip and video, and a generation prompt that opens the thinking
channel when thinking is on (``enable_thinking`` in ``chat_template_kwargs``).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["GEMMA4_TOKENS", "GEMMA4_CHAT_TEMPLATE", "GEMMA4_SOFT_TOKENS", "build_processor", "build_model"]

GEMMA4_TOKENS = ("<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|audio>",
                 "<audio|>", "<|audio|>", "<|video|>", "<|channel>", "<channel|>", "<|think|>")
GEMMA4_CHAT_TEMPLATE = """\
{%- macro without_thinking(text) -%}
    {%- set kept = namespace(text='') -%}
    {%- for piece in text.split('<channel|>') -%}
        {%- if '<|channel>' in piece -%}{%- set kept.text = kept.text + piece.split('<|channel>')[0] -%}
        {%- else -%}{%- set kept.text = kept.text + piece -%}{%- endif -%}
    {%- endfor -%}
    {{- kept.text | trim -}}
{%- endmacro -%}
{%- set turns = messages -%}
{{- bos_token -}}
{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\\n' -}}
    {%- if enable_thinking is defined and enable_thinking -%}{{- '<|think|>\\n' -}}{%- endif -%}
    {%- if messages[0]['role'] in ['system', 'developer'] -%}
        {{- messages[0]['content'] | trim -}}
        {%- set turns = messages[1:] -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endif -%}
{%- for message in turns -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {%- if not (role == 'model' and loop.index0 > 0 and turns[loop.index0 - 1]['role'] == 'assistant') -%}
        {{- '<|turn>' + role + '\\n' -}}
    {%- endif -%}
    {%- if message['content'] is string -%}
        {%- if role == 'model' -%}{{- without_thinking(message['content']) -}}
        {%- else -%}{{- message['content'] | trim -}}{%- endif -%}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'text' -%}
                {%- if role == 'model' -%}{{- without_thinking(part['text']) -}}
                {%- else -%}{{- part['text'] | trim -}}{%- endif -%}
            {%- elif part['type'] == 'image' -%}{{- '<|image|>' -}}
            {%- elif part['type'] == 'audio' -%}{{- '<|audio|>' -}}
            {%- elif part['type'] == 'video' -%}{{- '<|video|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n' -}}
    {%- if enable_thinking | default(false) -%}{{- '<|channel>thought\\n' -}}{%- endif -%}
{%- endif -%}
"""
GEMMA4_SOFT_TOKENS = 70  # soft tokens per image at most (the published budgets: 70, 140, 280, 560, 1120)


@functools.lru_cache(maxsize=None)
def _gemma4_tokenizer():
    named = dict(image_token="<|image|>", boi_token="<|image>", eoi_token="<image|>", audio_token="<|audio|>",
                 boa_token="<|audio>", eoa_token="<audio|>")
    return offline_tokenizer(GEMMA4_TOKENS, bos="<bos>", eos="<turn|>", pad="<pad>", named=named, add_bos=True,
                             template=GEMMA4_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Gemma4Processor`` around the stock PIL image processor and video processor at
    `GEMMA4_SOFT_TOKENS` soft tokens (patch 16, pooling 3: at most 630 patches an image), the stock
    audio feature extractor (16 kHz, 128 mel bins), the offline tokenizer (adds the BOS) and
    `GEMMA4_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    tok = copy.deepcopy(_gemma4_tokenizer())
    return transformers.Gemma4Processor(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=transformers.Gemma4ImageProcessorPil(max_soft_tokens=GEMMA4_SOFT_TOKENS),
        video_processor=transformers.Gemma4VideoProcessor(max_soft_tokens=GEMMA4_SOFT_TOKENS),
        tokenizer=tok, chat_template=GEMMA4_CHAT_TEMPLATE, image_seq_length=GEMMA4_SOFT_TOKENS)


def build_model():
    """Text: Gemma 4, hidden 64, 2 layers (sliding then full), bidirectional attention within each
    image's tokens (``use_bidirectional_attention="vision"``, from ``mm_token_type_ids``); vision: the
    Gemma 4 encoder, hidden 32, 1 layer, 16 px patches pooled 3x3; audio: the Gemma 4 conformer,
    hidden 32, 1 layer, one soft token per 40 ms of a clip. Vocabulary: the offline tokenizer's."""
    import torch
    import transformers

    tok = _gemma4_tokenizer()
    boi, eoi, image_id, boa, eoa, audio_id, video_id = ids(tok, "<|image>", "<image|>", "<|image|>", "<|audio>",
                                                           "<audio|>", "<|audio|>", "<|video|>")
    n = len(tok)
    text = dict(vocab_size=n, vocab_size_per_layer_input=n, hidden_size=64, hidden_size_per_layer_input=8,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                layer_types=["sliding_attention", "full_attention"], sliding_window=512,
                use_bidirectional_attention="vision", pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=16, pooling_kernel_size=3, position_embedding_size=1024)
    # the first subsampling width stays the published 128: the projection after the two convolutions
    # takes (that width // 4) x the second width inputs, which is the 128 mel bins // 4 x it only then
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[128, 8],
                 output_proj_dims=64)
    cfg = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, boi_token_id=boi,
                                    eoi_token_id=eoi, image_token_id=image_id, video_token_id=video_id,
                                    boa_token_id=boa, eoa_token_index=eoa, audio_token_id=audio_id)
    return transformers.Gemma4ForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                   dtype=torch.float32)
