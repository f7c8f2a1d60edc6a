"""Chat templates of thinking models for the reasoning-label tests, each with a ``{% generation %}``
copy (the reference: transformers' assistant mask marks what the model writes after its turn's
header).

- `QWEN3_VL_THINKING`: the structure of Qwen/Qwen3-VL-8B-Thinking's template (the Qwen3 thinking
  rules on Qwen3-VL's content items): reasoning from ``reasoning_content`` or split out of the
  content at ``</think>``, written only after the last user turn (for the last reply, or one with
  reasoning), history replies as their answer; tool calls; the generation prompt opens
  ``<think>\\n``. The repo ships no Thinking checkpoint template.
- `GLM46V_GENERATION`: `mmpipe.offline.glm46v.GLM46V_CHAT_TEMPLATE` with each reply (after
  ``<|assistant|>\\n``: its ``<think>...</think>`` as rendered, then its answer) in a block.
"""

from __future__ import annotations

from mmpipe.offline.chat_templates import _with_generation_blocks as _edited  # each anchor once
from mmpipe.offline.glm46v import GLM46V_CHAT_TEMPLATE

__all__ = ["QWEN3_VL_THINKING", "QWEN3_VL_THINKING_GENERATION", "GLM46V_GENERATION"]

QWEN3_VL_THINKING = r"""{%- macro render(content) -%}
{%- if content is string -%}{{- content -}}{%- else -%}{%- for c in content -%}
{%- if c.type == 'image' or 'image' in c -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif 'text' in c -%}{{- c.text -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
{%- set index = (messages|length - 1) - loop.index0 -%}
{%- if ns.multi_step_tool and message.role == 'user' -%}
{%- set ns.multi_step_tool = false -%}{%- set ns.last_query_index = index -%}
{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- set content = render(message.content) -%}
{%- if message.role == 'user' or message.role == 'system' -%}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{%- set reasoning_content = '' -%}
{%- if message.reasoning_content is string -%}{%- set reasoning_content = message.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- set think = loop.index0 > ns.last_query_index and (loop.last or reasoning_content) -%}
{{- '<|im_start|>assistant\n' + ('<think>\n' if think else '') -}}
{{- (reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')) if think else content -}}
{%- for tool_call in message.tool_calls or [] -%}
{%- if (loop.first and content) or (not loop.first) -%}{{- '\n' -}}{%- endif -%}
{%- set fn = tool_call.function if tool_call.function else tool_call -%}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
{{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}{%- endif -%}"""


QWEN3_VL_THINKING_GENERATION = _edited(QWEN3_VL_THINKING, (
    ("{{- '<|im_start|>assistant\\n' + ('<think>\\n' if think else '') -}}",
     "{{- '<|im_start|>assistant\\n' + ('<think>\\n' if think else '') -}}{%- generation -%}"),
    ("{{- '<|im_end|>\\n' -}}\n{%- elif message.role == 'tool' -%}",
     "{{- '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}\n{%- elif message.role == 'tool' -%}"),
))

GLM46V_GENERATION = _edited(GLM46V_CHAT_TEMPLATE, (
    ("<|assistant|>{{- '\\n<think>' + reasoning.strip() + '</think>' if loop.index0 > ns.last_user and reasoning "
     "else '\\n<think></think>' -}}",
     "<|assistant|>{{ '\\n' }}{% generation %}{{- '<think>' + reasoning.strip() + '</think>' if loop.index0 > "
     "ns.last_user and reasoning else '<think></think>' -}}"),
    ("{{- '\\n' + text.strip() if text.strip() else '' -}}",
     "{{- '\\n' + text.strip() if text.strip() else '' -}}{% endgeneration %}"),
))
