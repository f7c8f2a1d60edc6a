"""Offline tiny models of transformers 5.25 model types whose checkpoints load a native family's
processor, so their rows are that family's (`mmpipe.families`: the model type sits in the row's
``model_types``), built locally from transformers' own classes with no download::

    >>> model = build_line_model("qwen4_exp")          # doctest: +SKIP
    >>> proc = build_line_processor("qwen4_exp")       # the Qwen3-VL processor

- ``qwen4_exp`` (``Qwen4ExpForConditionalGeneration``, Qwen3.5-MoE based; Qwen3-VL processor): 4 text
  layers ``linear_attention`` / ``indexed_attention`` alternating (QSA indexer: 2 heads of 32, a budget
  of 8 tokens in blocks of 4, fewer keys than the test rows hold, so it selects), hashed n-gram
  per-layer embeddings (PLE, n-grams up to 3 that restart after each ``<|im_end|>``, the eos) on both
  linear layers, 2 hyper-connection streams, 4 experts (2 per token) and a shared expert; the rest as
  `mmpipe.offline.qwen3_5`'s Qwen3.5-MoE (hidden 64, M-RoPE [4, 2, 2] interleaved, half rotary).
- ``cosmos3_omni`` (``Cosmos3OmniForConditionalGeneration``: the Reasoner, a Qwen3-VL model; Qwen3-VL
  processor): `mmpipe.offline.build_model`'s Qwen3-VL config under the Cosmos3 config class.
- ``glm_ocr`` (``GlmOcrForConditionalGeneration``, GLM-4.1V based; its checkpoints ship
  ``Glm46VProcessor``): `mmpipe.offline.glm46v`'s tiny GLM-4.6V config under the GLM-OCR classes.

Each: fp32, eval mode, eager attention, weights from ``seed``; a deep copy of a cached model per call.

:data:`GLM_OCR_CHAT_TEMPLATE`: the chat template zai-org/GLM-OCR publishes (the processor built here
keeps the family's offline one; set ``proc.chat_template`` to it to encode as GLM-OCR users do).
Qwen4-Exp, Cosmos3 Omni and GLM-GA: no published template was found to write here.
transformers without the class: `ArgumentError` naming it.
"""

from __future__ import annotations

from mmpipe.errors import ArgumentError
from mmpipe.families import GLM46V, QWEN3_VL
from mmpipe.offline.tiny_towers import cached_model_copy

__all__ = ["LINES", "GLM_OCR_CHAT_TEMPLATE", "build_line_model", "build_line_processor"]

# model type -> (transformers model class, the family whose processor its checkpoints ship)
LINES = {
    "qwen4_exp": ("Qwen4ExpForConditionalGeneration", QWEN3_VL.name),
    "cosmos3_omni": ("Cosmos3OmniForConditionalGeneration", QWEN3_VL.name),
    "glm_ocr": ("GlmOcrForConditionalGeneration", GLM46V.name),
}
_QSA = dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=8, indexer_compress_ratio=4)
_PLE = dict(hc_count=2, hc_lowrank=8, ple_layer_ids=[1, 3], ple_embed_dim=32, ngram_size=3, heads_per_ngram=2,
            ngram_vocab_size_base=1000, split_ngram_parts=1)


def _qwen4_exp_config():
    import transformers

    from mmpipe.offline.tokenizer import build_tokenizer, special_token_ids

    fam, ids = QWEN3_VL, special_token_ids(QWEN3_VL.name)
    top = dict(image_token_id=ids[fam.image_token], video_token_id=ids[fam.video_token],
               vision_start_token_id=ids[fam.vision_start_token], vision_end_token_id=ids[fam.vision_end_token])
    text = dict(**_QSA, **_PLE, vocab_size=len(build_tokenizer(fam.name)), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], hidden_size=64,
                intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                max_position_embeddings=4096, rms_norm_eps=1e-6, layer_types=["linear_attention", "indexed_attention"] * 2,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2],
                                     mrope_interleaved=True, partial_rotary_factor=0.5))
    vision = dict(depth=1, num_heads=2, in_channels=3, hidden_size=32, intermediate_size=64, out_hidden_size=64,
                  patch_size=fam.patch_size, spatial_merge_size=fam.merge_size,
                  temporal_patch_size=fam.temporal_patch_size, num_position_embeddings=256)
    return transformers.Qwen4ExpConfig(text_config=text, vision_config=vision, **top)


def _cosmos3_omni_config():
    import transformers

    from mmpipe.offline.builders import build_model

    fields = {k: v for k, v in build_model(QWEN3_VL.name).config.to_dict().items()
              if k not in ("model_type", "architectures", "transformers_version")}
    return transformers.Cosmos3OmniConfig(**fields)


def _glm_ocr_config():
    import transformers

    from mmpipe.offline.glm46v import build_model

    base = build_model().config
    ids = {k: getattr(base, k) for k in ("image_token_id", "video_token_id", "image_start_token_id",
                                         "image_end_token_id", "video_start_token_id", "video_end_token_id")}
    vision = {k: v for k, v in base.vision_config.to_dict().items() if k != "model_type"}
    text = {k: v for k, v in base.text_config.to_dict().items() if k != "model_type"}
    return transformers.GlmOcrConfig(text_config=text, vision_config=vision, **ids)


_CONFIGS = {"qwen4_exp": _qwen4_exp_config, "cosmos3_omni": _cosmos3_omni_config, "glm_ocr": _glm_ocr_config}


def _class(model_type: str) -> str:
    import transformers

    if model_type not in LINES:
        raise ArgumentError(f"unknown model line {model_type!r}; known: {list(LINES)}")
    cls = LINES[model_type][0]
    if not hasattr(transformers, cls):
        raise ArgumentError(f"{model_type}: transformers {transformers.__version__} has no {cls} (it came with "
                            "transformers 5.25); install a transformers that has it to build this line")
    return cls


def build_line_model(model_type: str, seed: int = 0):
    """The tiny ``model_type`` model (one of `LINES`) taking `build_line_processor(model_type)`'s rows."""
    return cached_model_copy(_class(model_type), _CONFIGS[model_type], seed)


def build_line_processor(model_type: str):
    """The processor ``model_type``'s checkpoints ship: `mmpipe.offline.build_processor` of its family."""
    from mmpipe.offline.builders import build_processor

    _class(model_type)
    return build_processor(LINES[model_type][1])

# GLM-OCR's chat template as zai-org publishes it with the checkpoint (zai-org/GLM-OCR
# tokenizer_config.json "chat_template"; read from a public Dart llama.cpp binding's test
# (`_actualGlmOcrTemplate`, "actual GLM-OCR template"), the same text as the tokenizer_config.json of the
# textagent/GLM-OCR-ONNX mirror). The published text, not a cleaned-up copy: "[gMASK]<sop>" then a
# newline, user parts written by their own loop (not `visible_text`), "\n<think></think>" on every
# reply before the last user turn, tool calls as "<tool_call>name\n<arg_key>..</arg_key>...".
GLM_OCR_CHAT_TEMPLATE = r'''[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is mapping and (item.type == 'image' or 'image' in item) -%}
                <|begin_of_image|><|image|><|end_of_image|>
            {%- elif item is mapping and (item.type == 'video' or 'video' in item) -%}
                <|begin_of_video|><|video|><|end_of_video|>
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{% if m.content is string %}
{{ m.content }}
{%- else %}
{%- for item in m.content %}
{% if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>{% elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>{% elif item.type == 'text' %}
{{ item.text }}
{%- endif %}
{%- endfor %}
{%- endif %}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{% elif m.content is iterable and m.content is not mapping %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
{{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{%- for tr in m.content -%}
  {%- if tr is mapping and tr.type is defined -%}
    {%- set t = tr.type | lower -%}
    {%- if t == 'text' and tr.text is defined -%}
{{ tr.text }}
    {%- elif t in ['image', 'image_url'] -%}
<|begin_of_image|><|image|><|end_of_image|>
    {%- elif t in ['video', 'video_url'] -%}
<|begin_of_video|><|video|><|end_of_video|>
    {%- else -%}
{{ tr | tojson(ensure_ascii=False) }}
    {%- endif -%}
  {%- else -%}
{{ tr.output if tr.output is defined else tr }}
  {%- endif -%}
{%- endfor -%}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{{'<think></think>\n' if (enable_thinking is defined and not enable_thinking) else ''}}
{%- endif -%}'''
