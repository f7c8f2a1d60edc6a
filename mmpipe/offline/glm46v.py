"""Offline fixtures for GLM-4.6V (transformers 5 ``glm46v``, `mmpipe.families.GLM46V`): a real
``Glm46VProcessor`` and a tiny ``Glm46VForConditionalGeneration``, built locally with no
download; ``mmpipe.offline.build_processor("glm46v")`` / ``build_model("glm46v")`` hand over to
these (`mmpipe.offline.tokenizer.OWN_BUILDERS`). transformers 4.57 has no ``glm46v``: every builder raises
`ArgumentError` saying so (`available` tells tests to skip).

- `build_processor`: an image-only subclass of ``Glm46VProcessor`` (its stock ``__init__`` checks
  a video processor, which needs torchvision) around the real PIL ``Glm46VImageProcessorPil``
  (patch 14, merge 2, temporal patch 2, CLIP mean/std; small pixel bounds) and the GLM tokenizer
  of `mmpipe.offline.glm4v` with :data:`GLM46V_CHAT_TEMPLATE`.
- `build_model`: a tiny random model (fp32, eval, eager attention): text hidden 64, 2 layers,
  2 heads of 32 (half rotary, ``mrope_section`` [2, 3, 3]); vision depth 1, hidden 32, the
  processor's patch / merge / temporal patch sizes.

    >>> from mmpipe.offline.glm46v import build_processor, build_model   # doctest: +SKIP
    >>> proc, model = build_processor(), build_model()                   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools

from mmpipe.errors import ArgumentError
from mmpipe.offline.tf_lines import classes_by_name

__all__ = ["GLM46V_CHAT_TEMPLATE", "available", "build_processor", "build_model", "image_only_processor_class",
           "offline_processor", "offline_model"]

# NOT the published text: a cleaned-up copy of GLM-4.6V's chat format (the GLM-4.5V style) that the
# offline builder defaults to (existing tests assert its renders). GLM-4.6V's own published
# chat_template (zai-org/GLM-4.6V, GLM-4.6V-Flash) was not found in any public copy to write here
# verbatim. It leaves out what the published GLM-4.5V-style text writes: the "# Tools" system header
# (tools=) and an assistant's tool_calls ("\n<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>
# \n</tool_call>" after the reply); otherwise it rendered GLM-OCR's text on a conversation with a system
# prompt, images, a tool response with an image and the generation prompt. The nearest published text
# users load with a Glm46VProcessor is GLM-OCR's
# (`mmpipe.offline.same_family_lines.GLM_OCR_CHAT_TEMPLATE`; tests/encoding/test_hunt_published_glm46v.py
# holds mmpipe to it on this processor, tools= included). What this copy renders:
# - "[gMASK]<sop>" once, then each turn "<|role|>" with no end-of-turn token after it;
# - a user or system turn: "<|user|>\n" / "<|system|>\n" + its content; an image renders as
#   "<|begin_of_image|><|image|><|end_of_image|>", a video as "<|begin_of_video|><|video|><|end_of_video|>";
#   enable_thinking=False appends "/nothink" to a user turn;
# - an assistant turn: "<|assistant|>" + "\n<think>REASONING</think>" (reasoning kept only after
#   the last user turn, else "\n<think></think>") + "\n" + the stripped answer when not empty;
# - a tool result: "<|observation|>" (once per run of tool turns) + "\n<tool_response>\n...\n</tool_response>";
# - the generation prompt: "<|assistant|>\n" (+ "<think></think>\n" with enable_thinking=False).
GLM46V_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is not none -%}{%- for item in content -%}"
    "{%- if item is string -%}{{ item }}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item['type'] == 'image' or 'image' in item -%}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set no_think = enable_thinking is defined and not enable_thinking -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "[gMASK]<sop>"
    "{%- for m in messages -%}"
    "{%- set text = render(m['content']) -%}"
    "{%- if m['role'] == 'user' -%}<|user|>\n{{ text }}"
    "{{- '/nothink' if no_think and not text.endswith('/nothink') else '' -}}"
    "{%- elif m['role'] == 'system' -%}<|system|>\n{{ text }}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{%- set reasoning = m['reasoning_content'] if m['reasoning_content'] is string else '' -%}"
    "{%- if reasoning == '' and '</think>' in text -%}"
    "{%- set reasoning = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "<|assistant|>"
    "{{- '\\n<think>' + reasoning.strip() + '</think>' if loop.index0 > ns.last_user and reasoning "
    "else '\\n<think></think>' -}}"
    "{{- '\\n' + text.strip() if text.strip() else '' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}<|observation|>{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + text + '\\n</tool_response>' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>\n{{ '<think></think>\\n' if no_think else '' }}{%- endif -%}"
)
# as mmpipe.offline.glm4v: eager attention gives padded == per-row logits bit for bit
ATTN_IMPLEMENTATION = "eager"
PATCH, MERGE, TEMPORAL = 14, 2, 2  # Glm46VImageProcessorPil's defaults (GLM-4.1V's too)


def available() -> bool:
    """Whether the installed transformers has GLM-4.6V (``glm46v``: transformers 5)."""
    import transformers

    return hasattr(transformers, "Glm46VProcessor")


def _require():
    if not available():
        import transformers

        raise ArgumentError(
            f"GLM-4.6V (model type glm46v, Glm46VProcessor) is not in transformers {transformers.__version__}: "
            "it arrived in transformers 5; install transformers>=5 to build the offline GLM-4.6V fixtures")


@functools.lru_cache(maxsize=None)
def image_only_processor_class() -> type:
    """``Glm46VProcessor`` without a video processor; the stock class stays in the MRO, so
    `mmpipe.families.processor_class_name` names it (and `family_of` finds the glm46v row)."""
    from transformers import Glm46VProcessor

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        Glm46VProcessor.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type("ImageOnlyGlm46VProcessor", (Glm46VProcessor,), {
        "__init__": __init__, "__module__": __name__,
        "__doc__": "``Glm46VProcessor`` without a video processor (works without torchvision)."})


# the image-only class pickles by name (spawn DataLoader workers, pickled encoders)
__getattr__ = classes_by_name(__name__, lambda name: image_only_processor_class()
                              if name == "ImageOnlyGlm46VProcessor" else None)


def build_processor(*, min_pixels: int | None = None, max_pixels: int | None = None):
    """A real ``Glm46VProcessor`` (image-only subclass; a fresh object per call). Pixel bounds
    default to `mmpipe.offline.glm4v.default_pixel_bounds` (4 to 64 LLM tokens per image).
    ``proc(text=[...], images=[...])`` returns ``input_ids``, ``attention_mask``,
    ``mm_token_type_ids`` [B, L], ``pixel_values`` float32 [N, 1176], ``image_grid_thw`` [I, 3]."""
    _require()
    from transformers import Glm46VImageProcessorPil

    from mmpipe.offline.glm4v import build_tokenizer, default_pixel_bounds

    lo, hi = default_pixel_bounds()
    lo, hi = (lo if min_pixels is None else int(min_pixels)), (hi if max_pixels is None else int(max_pixels))
    if lo > hi:
        raise ArgumentError(f"min_pixels {lo} > max_pixels {hi}")
    image_processor = Glm46VImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=PATCH,
                                              merge_size=MERGE, temporal_patch_size=TEMPORAL)
    tok = build_tokenizer()
    tok.chat_template = GLM46V_CHAT_TEMPLATE
    return image_only_processor_class()(image_processor=image_processor, tokenizer=tok,
                                        chat_template=GLM46V_CHAT_TEMPLATE)


def _config():
    from transformers import Glm46VConfig

    from mmpipe.offline.glm4v import build_tokenizer, media_token_ids

    tok = build_tokenizer()
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, rms_norm_eps=1e-5,
                pad_token_id=pad, eos_token_id=pad,
                # head_dim 32, half rotary: 8 frequencies split (t, h, w)
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, in_channels=3,
                  image_size=112, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL)
    return Glm46VConfig(text_config=text, vision_config=vision, **media_token_ids())


@functools.lru_cache(maxsize=2)
def _cached_model(seed: int):
    from mmpipe.offline.seeded import seeded_model

    return seeded_model("Glm46VForConditionalGeneration", _config(), seed,
                        attn_implementation=ATTN_IMPLEMENTATION).eval()


def build_model(seed: int = 0):
    """A tiny random ``Glm46VForConditionalGeneration`` matching `build_processor` (fp32, eval
    mode; a deep copy of a cached model per call)."""
    _require()
    return copy.deepcopy(_cached_model(int(seed)))


def offline_processor(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for ``family`` "glm46v" (`mmpipe.offline.tokenizer.OWN_BUILDERS`)."""
    return build_processor(min_pixels=min_pixels, max_pixels=max_pixels)


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for ``family`` "glm46v"."""
    return build_model(seed)
