"""The chat templates as published with each native family's checkpoints, and a
``{% generation %}`` copy of each: the reference for labels (`mmpipe.encoding.spans`).

Facts, not code: each template is the text the checkpoint ships (its ``chat_template.json`` /
``tokenizer_config.json``), written here so tests run offline. Sources: Qwen/Qwen2-VL-7B-Instruct
(Qwen2.5-VL ships the same), Qwen/Qwen3-VL-8B-Instruct, zai-org/GLM-4.1V-9B-Thinking (GLM-4.5V /
4.6V use the same structure), google/gemma-3-4b-it, OpenGVLab/InternVL3-1B-hf (transformers'
conversion script), llava-hf/llava-onevision-qwen2-0.5b-ov-hf (which marks its replies with
``{% generation %}`` itself).

What they do that a cleaned-up copy would not: Gemma 3 trims every text and refuses a role order
other than user/assistant alternating; GLM-4.1V prints assistant and system content as it is (a
list of parts would become its Python repr) and writes no end-of-turn token; LLaVA-OneVision
renders only content PARTS (a string content renders as nothing), writes ``<role> \\n`` in a turn
but ``assistant\\n`` as the generation prompt (prefixes are not prefixes) and no newline between
turns; Qwen3-VL writes a newline before a tool call only after non-empty content.

`generation_template(family)`: the same template with each reply inside a generation block: its
content as rendered, its tool calls and the stop token the template writes after it (not the
newline after that), i.e. what mmpipe labels by default (LLaVA-OneVision: its own blocks, which
stop before ``<|im_end|>``). Each renders the same text as the published one (tested).
"""

from __future__ import annotations

from mmpipe.families import GEMMA3 as _GEMMA3, GLM4V as _GLM4V, INTERNVL as _INTERNVL
from mmpipe.families import LLAVA_ONEVISION as _ONEVISION, QWEN2_5_VL, QWEN2_VL, QWEN3_VL as _QWEN3_VL
from mmpipe.offline.chat_templates import QWEN2_VL_CHAT_TEMPLATE, QWEN2_VL_GENERATION_CHAT_TEMPLATE

__all__ = ["PUBLISHED", "published_template", "generation_template"]

QWEN3_VL = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GLM4V = """\
[gMASK]<sop>
{%- for msg in messages %}
    {%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
    {%- elif msg.role == 'user' %}
<|user|>{{ '\\n' }}

        {%- if msg.content is string %}
{{ msg.content }}
        {%- else %}
            {%- for item in msg.content %}
                {%- if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>
                {%- elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>
                {%- elif item.type == 'text' %}
{{ item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- elif msg.role == 'assistant' %}
        {%- if msg.metadata %}
<|assistant|>{{ msg.metadata }}
{{ msg.content }}
        {%- else %}
<|assistant|>
{{ msg.content }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

GEMMA3 = """\
{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

INTERNVL = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\\n' }}{% elif content['type'] == 'video' %}{{ '<video>\\n' }}{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\\n' }}{% endif %}"
)

LLAVA_ONEVISION = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# keyed by the family constants (the template texts are fixtures of this package, not family rules)
PUBLISHED = {QWEN2_VL.name: QWEN2_VL_CHAT_TEMPLATE, QWEN2_5_VL.name: QWEN2_VL_CHAT_TEMPLATE, _QWEN3_VL.name: QWEN3_VL,
             _GLM4V.name: GLM4V, _GEMMA3.name: GEMMA3, _INTERNVL.name: INTERNVL, _ONEVISION.name: LLAVA_ONEVISION}


def _edited(template: str, edits: tuple) -> str:
    """``template`` with each (anchor, replacement); every anchor must occur exactly once."""
    for anchor, replacement in edits:
        if template.count(anchor) != 1:  # pragma: no cover - guards the edits below
            raise RuntimeError(f"anchor occurs {template.count(anchor)} times: {anchor!r}")
        template = template.replace(anchor, replacement)
    return template


_GENERATION = {
    QWEN2_VL.name: QWEN2_VL_GENERATION_CHAT_TEMPLATE,
    QWEN2_5_VL.name: QWEN2_VL_GENERATION_CHAT_TEMPLATE,
    _QWEN3_VL.name: _edited(QWEN3_VL, (
        ("{%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role + '\\n' }}",
         "{%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role + '\\n' }}"
         "{%- generation %}"),
        ("{{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}",
         "{{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>' }}"
         "{%- endgeneration %}{{- '\\n' }}"),
    )),
    _GLM4V.name: _edited(GLM4V, (
        ("<|assistant|>{{ msg.metadata }}\n{{ msg.content }}",
         "<|assistant|>{{ msg.metadata }}\n{% generation %}{{ msg.content }}{% endgeneration %}"),
        ("<|assistant|>\n{{ msg.content }}", "<|assistant|>\n{% generation %}{{ msg.content }}{% endgeneration %}"),
    )),
    _GEMMA3.name: _edited(GEMMA3, (
        ("{{ bos_token }}\n",
         "{%- macro turn_content(message) -%}\n"
         "    {%- if message['content'] is string -%}\n"
         "        {{ message['content'] | trim }}\n"
         "    {%- elif message['content'] is iterable -%}\n"
         "        {%- for item in message['content'] -%}\n"
         "            {%- if item['type'] == 'image' -%}\n"
         "                {{ '<start_of_image>' }}\n"
         "            {%- elif item['type'] == 'text' -%}\n"
         "                {{ item['text'] | trim }}\n"
         "            {%- endif -%}\n"
         "        {%- endfor -%}\n"
         "    {%- else -%}\n"
         "        {{ raise_exception(\"Invalid content type\") }}\n"
         "    {%- endif -%}\n"
         "{%- endmacro -%}\n"
         "{{ bos_token }}\n"),
        (GEMMA3[GEMMA3.index("    {%- if message['content'] is string -%}"):GEMMA3.index("{%- endfor -%}\n{%- if add_gen")],
         "    {%- if role == 'model' -%}\n"
         "        {%- generation -%}{{ turn_content(message) }}{{ '<end_of_turn>' }}{%- endgeneration -%}{{ '\\n' }}\n"
         "    {%- else -%}\n"
         "        {{ turn_content(message) }}{{ '<end_of_turn>\\n' }}\n"
         "    {%- endif -%}\n"),
    )),
    _INTERNVL.name: (
        "{% macro turn_content(message) %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
        "{% elif content['type'] == 'video' %}{{ '<video>\\n' }}{% elif content['type'] == 'text' %}"
        "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ turn_content(message) }}{{'<|im_end|>'}}{% endgeneration %}{{'\\n'}}{% else %}"
        "{{ turn_content(message) }}{{'<|im_end|>\\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n' }}{% endif %}"
    ),
    _ONEVISION.name: LLAVA_ONEVISION,
}


def published_template(family: str) -> str:
    """The chat template published with ``family``'s checkpoints (a native family name)."""
    return PUBLISHED[family]


def generation_template(family: str) -> str:
    """`published_template` with each reply in a ``{% generation %}`` block (module doc)."""
    return _GENERATION[family]
