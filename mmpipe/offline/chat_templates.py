"""Offline fixtures: the chat templates of the offline tokenizers (Qwen2-VL's, also used for
Qwen2.5-VL, and a Qwen3-VL-like one), written for mmpipe to behave like the official ones.

Tool use renders as in the official templates: Qwen2-VL's / Qwen2.5-VL's processor template
has no tool support (``tools`` and assistant ``tool_calls`` are not rendered; a ``tool``
message is a plain ``<|im_start|>tool`` turn, images included); Qwen3-VL's puts ``tools`` in
the system turn, renders ``tool_calls`` as ``<tool_call>`` blocks and wraps ``tool`` messages
(text and images) in ``<tool_response>`` inside a user turn.

``chat_template(family, generation=True)`` gives the same template with each assistant reply
(its text, tool calls and ``<|im_end|>``, not the newline after it) inside
``{% generation %}`` ... ``{% endgeneration %}``: what transformers'
``return_assistant_tokens_mask=True`` needs. It renders the same text.
"""

from __future__ import annotations

from mmpipe.families import QWEN2_5_VL, QWEN2_VL, QWEN3_VL

__all__ = [
    "QWEN2_VL_CHAT_TEMPLATE", "QWEN3_VL_CHAT_TEMPLATE", "QWEN2_VL_GENERATION_CHAT_TEMPLATE",
    "QWEN3_VL_GENERATION_CHAT_TEMPLATE", "chat_template",
]

# A Qwen2-VL message's content items (images, videos, text), shared by both Qwen2-VL templates.
_QWEN2_CONTENT_ITEMS = (
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}"
)

# Behaves like the official Qwen2-VL / Qwen2.5-VL template.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    + _QWEN2_CONTENT_ITEMS
    + "<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-like: no default system prompt; tools in the system turn; tool results wrapped in
# <tool_response> inside a user turn (images allowed there); assistant tool calls as <tool_call>.
QWEN3_VL_CHAT_TEMPLATE = """\
{%- macro render_content(content, allow_vision) -%}
{%- if content is string -%}
{{- content -}}
{%- elif content is not none -%}
{%- for item in content -%}
{%- if allow_vision and (item['type'] == 'image' or 'image' in item or 'image_url' in item) -%}
{%- set image_count.value = image_count.value + 1 -%}
{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif allow_vision and (item['type'] == 'video' or 'video' in item) -%}
{%- set video_count.value = video_count.value + 1 -%}
{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in item -%}
{{- item['text'] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages[0]['role'] == 'system' -%}
{{- render_content(messages[0]['content'], false) + '\\n\\n' -}}
{%- endif -%}
{{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" -}}
{%- for tool in tools -%}
{{- '\\n' + (tool | tojson) -}}
{%- endfor -%}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" -}}
{%- elif messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\\n' + render_content(messages[0]['content'], false) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' and loop.first -%}
{%- elif message['role'] == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\\n<tool_response>\\n' + render_content(message['content'], true) + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- elif message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\\n' + render_content(message['content'], true) -}}
{%- if message['tool_calls'] -%}
{%- for tool_call in message['tool_calls'] -%}
{%- if (loop.first and message['content']) or not loop.first -%}
{{- '\\n' -}}
{%- endif -%}
{%- if tool_call['function'] -%}
{%- set tool_call = tool_call['function'] -%}
{%- endif -%}
{{- '<tool_call>\\n{"name": "' + tool_call['name'] + '", "arguments": ' -}}
{%- if tool_call['arguments'] is string -%}
{{- tool_call['arguments'] -}}
{%- else -%}
{{- tool_call['arguments'] | tojson -}}
{%- endif -%}
{{- '}\\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\\n' + render_content(message['content'], true) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

# The Qwen2-VL template with each assistant turn's content and <|im_end|> in a generation block
# (the role header is rendered outside it; the content goes through a macro so the assistant
# branch and the other roles render it the same way). The newline after the block is written as
# an expression: transformers compiles templates with trim_blocks, which drops a literal one.
QWEN2_VL_GENERATION_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% macro render_content(message) %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    + _QWEN2_CONTENT_ITEMS
    + "{% endif %}"
    "{% endmacro %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ render_content(message) }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ render_content(message) }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _with_generation_blocks(template: str, edits: tuple[tuple[str, str], ...]) -> str:
    """``template`` with each (anchor, replacement) applied; every anchor must occur once."""
    for anchor, replacement in edits:
        if template.count(anchor) != 1:  # pragma: no cover - guards edits of the template above
            raise RuntimeError(f"generation-block anchor occurs {template.count(anchor)} times: {anchor!r}")
        template = template.replace(anchor, replacement)
    return template


# The Qwen3-VL-like template with the assistant reply (content, tool calls, <|im_end|>) in a
# generation block.
QWEN3_VL_GENERATION_CHAT_TEMPLATE = _with_generation_blocks(QWEN3_VL_CHAT_TEMPLATE, (
    ("{{- '<|im_start|>assistant\\n' + render_content(message['content'], true) -}}",
     "{{- '<|im_start|>assistant\\n' -}}{%- generation -%}{{- render_content(message['content'], true) -}}"),
    ("{{- '}\\n</tool_call>' -}}\n{%- endfor -%}\n{%- endif -%}\n{{- '<|im_end|>\\n' -}}",
     "{{- '}\\n</tool_call>' -}}\n{%- endfor -%}\n{%- endif -%}\n{{- '<|im_end|>' -}}{%- endgeneration -%}"
     "{{- '\\n' -}}"),
))

# Which template each family's offline tokenizer mimics. Keyed by the family constants, not a
# ModelFamily field: the template text is a fixture of this package (the real checkpoints ship
# their own), so the choice belongs beside the templates.
_TEMPLATES = {
    QWEN2_VL.name: QWEN2_VL_CHAT_TEMPLATE,
    QWEN2_5_VL.name: QWEN2_VL_CHAT_TEMPLATE,
    QWEN3_VL.name: QWEN3_VL_CHAT_TEMPLATE,
}


_GENERATION_TEMPLATES = {
    QWEN2_VL.name: QWEN2_VL_GENERATION_CHAT_TEMPLATE,
    QWEN2_5_VL.name: QWEN2_VL_GENERATION_CHAT_TEMPLATE,
    QWEN3_VL.name: QWEN3_VL_GENERATION_CHAT_TEMPLATE,
}


def chat_template(family: str, *, generation: bool = False) -> str:
    """The Jinja chat template of the offline tokenizer / processor of ``family`` (a vision
    family name): Qwen2-VL's (default system prompt) or the Qwen3-VL-like one (none).
    ``generation=True``: the same template with ``{% generation %}`` blocks around assistant
    replies, for ``apply_chat_template(..., return_assistant_tokens_mask=True)``."""
    return (_GENERATION_TEMPLATES if generation else _TEMPLATES)[family]
