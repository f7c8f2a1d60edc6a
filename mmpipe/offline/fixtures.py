"""Offline fixtures: real transformers tokenizer, processor and model classes, built locally.

For tests, the demo and notebooks. Nothing here downloads anything: no Hugging Face hub, no
network. Everything is built from code in a second or less:

- :func:`build_tokenizer` - a real ``transformers`` fast tokenizer (``Qwen2Tokenizer``, backed by
  the ``tokenizers`` library): a small byte-level BPE learned deterministically on a built-in
  English corpus, plus the Qwen special tokens (``<|im_start|>``, ``<|vision_start|>``,
  ``<|image_pad|>``, ...) and a Qwen-style chat template.
- :func:`build_processor` - a real Qwen-VL processor (subclasses of ``Qwen2VLProcessor``,
  ``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``) around the real Qwen image processor with the
  family's patch / merge / mean / std settings, and SMALL default pixel bounds so tests are fast.
- :func:`build_model` - a tiny randomly initialised ``Qwen2VLForConditionalGeneration`` /
  ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` (fp32, eval mode).
- :func:`sample_photos`, :func:`generated_images`, :func:`tiny_image` - real photographs that
  ship with matplotlib, and deterministic synthetic images.

Example::

    >>> from mmpipe.testing import build_processor, build_model, tiny_image   # doctest: +SKIP
    >>> proc = build_processor("qwen2_5_vl")                                  # doctest: +SKIP
    >>> msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    >>> text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # doctest: +SKIP
    >>> inputs = proc(text=[text], images=[tiny_image(64, 96)], return_tensors="pt")     # doctest: +SKIP
    >>> build_model("qwen2_5_vl")(**inputs).logits.shape                     # doctest: +SKIP

The special tokens get the same ids in every family (the tokenizer is the same apart from its
chat template), see :data:`SPECIAL_TOKENS` and :func:`special_token_ids`.

Transformers model classes are imported inside the functions, so importing this module stays
cheap.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from mmpipe.families import get_family

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, ProcessorMixin, PreTrainedTokenizerBase

__all__ = [
    "FAMILY_NAMES",
    "SPECIAL_TOKENS",
    "EXTRA_TOKENS",
    "QWEN2_VL_CHAT_TEMPLATE",
    "QWEN3_VL_CHAT_TEMPLATE",
    "build_tokenizer",
    "build_processor",
    "build_image_processor",
    "build_model",
    "default_pixel_bounds",
    "ATTN_IMPLEMENTATION",
    "special_token_ids",
    "sample_photos",
    "generated_images",
    "tiny_image",
]

FAMILY_NAMES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# Special tokens in the order of the real Qwen2-VL / Qwen2.5-VL / Qwen3-VL vocabularies
# (151643 ... 151656 there); here they follow the BPE vocabulary directly.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added but not special (as in the Qwen2.5 / Qwen3 vocabularies): kept by decode(skip_special_tokens=True).
EXTRA_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# Pre-tokenisation regex of the Qwen2 tokenizer (same as transformers' Qwen2Tokenizer).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_BPE_VOCAB_SIZE = 640  # 256 byte tokens + up to 384 merges

# A small built-in English corpus (written for this module) to learn the BPE merges on, so text
# is not one token per character. Changing it changes every token id above 255: don't.
_CORPUS = """\
You are a helpful assistant. Describe this image in one sentence.
What is shown in the picture? Please answer the question about the image.
The photograph shows a woman in a uniform standing in front of a flag.
The picture shows a small red box on a wooden table next to a window.
There is a cat sitting on the chair, and a dog sleeping under the table.
A man is riding a bicycle along the river while the sun is setting behind the hills.
The image contains two people, three cars and a large building with many windows.
How many objects are there in the image? There are four objects in the image.
What color is the car? The car is blue. What color is the sky? The sky is grey.
Look at the chart and tell me which value is the largest and which one is the smallest.
The table lists the number of students in each class for the first and the second year.
Read the text in the image and translate it into English.
The document is a letter written by hand; the first line says good morning.
Answer with a single word. Answer with a number. Think step by step before you answer.
The answer is correct. The answer is wrong. Let me think about this question again.
First, we count the apples: there are seven apples on the left and five on the right.
So the total number of apples is twelve, and the final answer is twelve.
The model reads the images and the text together and then writes a short reply.
Each image is split into patches, and the patches are merged into tokens for the language model.
The video shows a person walking through a park, then sitting down on a bench to read.
In the first frame the door is open; in the last frame the door is closed.
The weather today is warm and sunny, with a light wind from the west.
She opened the window, looked at the garden and smiled at the flowers.
They went to the market in the morning and came back with bread, cheese and fruit.
The train leaves the station at nine and arrives in the city before noon.
Please write a short story about a robot that learns to paint pictures of the sea.
The robot painted the sea in the morning light, with white boats and blue waves.
A good caption is short, accurate and mentions the most important objects in the scene.
The search tool returned three results; the second result contains the answer.
Call the tool with the query, wait for the response, and then answer the user.
The user asked about the price of the house, and the assistant gave a clear answer.
This is a test of the tokenizer. It should split common words into a few tokens.
Numbers like 1, 2, 3, 10, 42 and 2024 are written with digits, one token per digit.
The quick brown fox jumps over the lazy dog near the bank of the river.
Where is the ball? The ball is under the table, next to the green chair.
Is there a person in this image? Yes, there is a person holding an umbrella.
The building on the left is taller than the building on the right.
Give the bounding box of the dog in the image, as coordinates of the top left and bottom right corners.
The reward is higher when the answer matches the reference and the format is right.
Training the model with reinforcement learning needs many samples and a good reward.
"""


# --------------------------------------------------------------------------------------------
# Chat templates
# --------------------------------------------------------------------------------------------

# Behaves like the official Qwen2-VL / Qwen2.5-VL template.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n"
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


def _chat_template(family: str) -> str:
    return QWEN3_VL_CHAT_TEMPLATE if family == "qwen3_vl" else QWEN2_VL_CHAT_TEMPLATE


def _check_family(family: str) -> str:
    if family not in FAMILY_NAMES:
        raise ValueError(f"unknown vision family {family!r}; known: {list(FAMILY_NAMES)}")
    return family


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _bpe_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn the byte-level BPE on the built-in corpus (deterministic; ~30 ms)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer)
    model = json.loads(tok.to_str())["model"]  # {"type": "BPE", "vocab": {...}, "merges": [...]}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return dict(model["vocab"]), merges


@functools.lru_cache(maxsize=None)
def _cached_tokenizer(family: str):
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _bpe_vocab_and_merges()
    tok = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token=None,
        pad_token=None,
        errors="replace",
        model_max_length=32768,
    )
    # Add the special tokens in Qwen order so their ids are fixed, then name eos / pad.
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_TOKENS])
    tok.add_special_tokens(
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "extra_special_tokens": [t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
        }
    )
    tok.chat_template = _chat_template(family)
    tok.name_or_path = f"mmpipe-testing/{family}"
    return tok


def build_tokenizer(family: str = "qwen2_vl") -> "PreTrainedTokenizerBase":
    """A small offline ``Qwen2Tokenizer`` (fast, ``tokenizers``-backed) with the Qwen special tokens.

    Byte-level BPE with 256 byte tokens plus merges learned on a built-in English corpus, then
    the :data:`SPECIAL_TOKENS` (special) and :data:`EXTRA_TOKENS` (added, not special); fewer
    than 1024 ids in all. ``pad_token`` is ``<|endoftext|>``, ``eos_token`` is ``<|im_end|>``,
    padding side right (as the real Qwen-VL tokenizers). ``family`` only picks the chat
    template: Qwen2-VL's (also used for Qwen2.5-VL, default system prompt) or a Qwen3-VL-like
    one (no default system prompt). Supports ``return_offsets_mapping=True``.

    The tokenizer is built once per family and each call returns a deep copy (~ms), so
    setting ``padding_side`` or other attributes on it cannot leak into other callers.
    """
    return copy.deepcopy(_cached_tokenizer(_check_family(family)))


def special_token_ids(family: str = "qwen2_vl") -> dict[str, int]:
    """Token -> id for :data:`SPECIAL_TOKENS` and :data:`EXTRA_TOKENS` (same for every family)."""
    tok = _cached_tokenizer(_check_family(family))
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS}


# --------------------------------------------------------------------------------------------
# Processor
# --------------------------------------------------------------------------------------------


def default_pixel_bounds(family: str = "qwen2_vl") -> tuple[int, int]:
    """Small test defaults ``(min_pixels, max_pixels)`` = ``(4, 64) * factor**2``.

    factor = patch * merge (28, or 32 for Qwen3-VL): every image becomes 4 to 64 LLM tokens
    (16 to 256 patch rows). Real checkpoints use much larger bounds (see mmpipe.families).
    """
    factor = get_family(_check_family(family)).factor
    return 4 * factor * factor, 64 * factor * factor


@functools.lru_cache(maxsize=None)
def _processor_classes() -> dict[str, type]:
    """Subclasses of the real processors without a ``video_processor`` argument.

    ``ProcessorMixin`` takes its sub-processors from the ``__init__`` signature; the stock
    classes list ``video_processor``, whose class check fails without torchvision even for
    ``None``. Dropping the parameter gives a processor with ``image_processor`` and
    ``tokenizer`` only (``videos=`` is not supported). The class names keep the real class in
    the MRO, so :func:`mmpipe.families.family_of` recognises them.
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor

    def make(base: type, name: str) -> type:
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        doc = (
            f"``{base.__name__}`` without a video processor (works without torchvision); "
            "built by :func:`mmpipe.testing.build_processor`."
        )
        return type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})

    return {
        "qwen2_vl": make(Qwen2VLProcessor, "ImageOnlyQwen2VLProcessor"),
        "qwen2_5_vl": make(Qwen2_5_VLProcessor, "ImageOnlyQwen2_5_VLProcessor"),
        "qwen3_vl": make(Qwen3VLProcessor, "ImageOnlyQwen3VLProcessor"),
    }


def build_image_processor(family: str = "qwen2_vl", *, min_pixels: int | None = None, max_pixels: int | None = None):
    """The real Qwen image processor with the family's settings.

    Always the PIL/numpy backend ``Qwen2VLImageProcessorPil`` (what ``Qwen2VLImageProcessor``
    resolves to without torchvision), so outputs do not depend on whether torchvision is
    installed. ``min_pixels`` / ``max_pixels`` default to :func:`default_pixel_bounds`.
    """
    try:
        from transformers import Qwen2VLImageProcessorPil as Qwen2VLImageProcessor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import Qwen2VLImageProcessor

    fam = get_family(_check_family(family))
    lo, hi = default_pixel_bounds(family)
    lo = lo if min_pixels is None else int(min_pixels)
    hi = hi if max_pixels is None else int(max_pixels)
    if lo > hi:
        raise ValueError(f"min_pixels {lo} > max_pixels {hi}")
    return Qwen2VLImageProcessor(
        size={"shortest_edge": lo, "longest_edge": hi},
        patch_size=fam.patch_size,
        temporal_patch_size=fam.temporal_patch_size,
        merge_size=fam.merge_size,
        image_mean=list(fam.image_mean),
        image_std=list(fam.image_std),
    )


def build_processor(
    family: str = "qwen2_vl", *, min_pixels: int | None = None, max_pixels: int | None = None
) -> "ProcessorMixin":
    """A real Qwen-VL processor (image processor + :func:`build_tokenizer`), offline.

    The class is a subclass of ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` /
    ``Qwen3VLProcessor`` (see :func:`_processor_classes`); it has no video processor.
    ``min_pixels`` / ``max_pixels`` default to :func:`default_pixel_bounds` (small, for fast
    tests). ``proc(text=[...], images=[...], return_tensors="pt")`` returns ``input_ids``,
    ``attention_mask``, ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids``.
    A fresh processor (with its own tokenizer copy) is returned on every call.
    """
    family = _check_family(family)
    cls = _processor_classes()[family]
    proc = cls(
        image_processor=build_image_processor(family, min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=build_tokenizer(family),
        chat_template=_chat_template(family),
    )
    return proc


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------

_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
)
# head_dim = 64 / 4 = 16, so sum(mrope_section) must be 8.
_MROPE_SECTION = {"qwen2_vl": [2, 3, 3], "qwen2_5_vl": [2, 3, 3], "qwen3_vl": [4, 2, 2]}
# "eager": on CPU a left- or right-padded batch gives bit-identical logits to each row run
# alone (checked for all three families); "sdpa" differs by ~1e-7. Read when a model is first
# built for a (family, seed), which is then cached.
ATTN_IMPLEMENTATION = "eager"


def _model_config(family: str):
    import transformers

    fam = get_family(family)
    ids = special_token_ids(family)
    vocab_size = len(_cached_tokenizer(family))
    common_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    text = dict(
        _TEXT,
        vocab_size=vocab_size,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _MROPE_SECTION[family]},
    )
    vision_common = dict(
        depth=1,
        num_heads=2,
        in_channels=3,
        patch_size=fam.patch_size,
        spatial_merge_size=fam.merge_size,
        temporal_patch_size=fam.temporal_patch_size,
    )
    if family == "qwen2_vl":
        vision = dict(vision_common, embed_dim=32, mlp_ratio=2, hidden_size=_TEXT["hidden_size"])
        cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **common_ids)
    elif family == "qwen2_5_vl":
        vision = dict(
            vision_common,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=_TEXT["hidden_size"],
            window_size=fam.factor * 4,  # 112 like the checkpoints: 4x4 merged tokens per window
            fullatt_block_indexes=[0],
            tokens_per_second=int(fam.tokens_per_second),
        )
        cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common_ids)
    else:
        text["head_dim"] = _TEXT["hidden_size"] // _TEXT["num_attention_heads"]
        text["rope_parameters"]["mrope_interleaved"] = True
        vision = dict(
            vision_common,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=_TEXT["hidden_size"],
            num_position_embeddings=256,  # 16 x 16 learned grid, interpolated
            deepstack_visual_indexes=[0],
        )
        cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **common_ids)
    return cfg


_MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}


@functools.lru_cache(maxsize=16)
def _cached_model(family: str, seed: int):
    import torch
    import transformers

    cls = getattr(transformers, _MODEL_CLASSES[family])
    config = _model_config(family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls._from_config(config, attn_implementation=ATTN_IMPLEMENTATION, dtype=torch.float32)
    model.eval()
    ids = special_token_ids(family)
    gen = model.generation_config
    gen.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gen.pad_token_id = ids["<|endoftext|>"]
    gen.bos_token_id = ids["<|endoftext|>"]
    gen.do_sample = False
    return model


def build_model(family: str = "qwen2_vl", seed: int = 0) -> "PreTrainedModel":
    """A tiny randomly initialised Qwen-VL model for ``family``, fp32, eval mode, offline.

    Text: hidden 64, 2 layers, 4 heads (2 KV heads), head_dim 16, ``mrope_section``
    [2, 3, 3] (Qwen3-VL: [4, 2, 2], interleaved). Vision: depth 1, hidden 32, patch / merge /
    temporal patch as the processor of :func:`build_processor`; Qwen3-VL deepstack at [0].
    Token ids and ``vocab_size`` come from :func:`build_tokenizer`. Attention is ``"eager"``.
    The same ``(family, seed)`` gives the same weights; the model is built once and each call
    returns a deep copy, so callers may train or modify it freely.
    """
    return copy.deepcopy(_cached_model(_check_family(family), int(seed)))


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def sample_photos() -> list[tuple[str, Image.Image]]:
    """The real images shipped with matplotlib (``mpl-data/sample_data``), as RGB PIL images.

    Sorted by file name, e.g. ``("grace_hopper.jpg", <512x600 RGB>)``. Fresh image objects each
    call. Needs matplotlib (a test extra).
    """
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover
        raise ImportError("sample_photos() needs matplotlib (pip install mmpipe[test])") from e
    root = Path(matplotlib.get_data_path()) / "sample_data"
    out = []
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        if not path.is_file() or path.suffix.lower() not in _IMAGE_SUFFIXES:
            continue
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except OSError:
            continue
        out.append((path.relative_to(root).as_posix(), img))
    return out


def tiny_image(h: int, w: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic ``w x h`` PIL image: colour gradients plus seeded noise, in ``mode``.

    ``mode`` "RGB", "RGBA" (alpha is a gradient too), "L" or anything PIL converts RGB to.
    """
    if h <= 0 or w <= 0:
        raise ValueError(f"image size must be positive, got {h}x{w}")
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h, dtype=np.float64)[:, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float64)[None, :]
    phase = rng.uniform(0, 2 * np.pi, size=3)
    base = np.stack(
        [
            0.5 + 0.5 * np.sin(2 * np.pi * (x + 0.5 * y) + phase[0]) * np.ones_like(y),
            0.5 + 0.5 * np.cos(2 * np.pi * (y - 0.3 * x) + phase[1]) * np.ones_like(x),
            0.5 + 0.5 * np.sin(6 * np.pi * x * y + phase[2]),
        ],
        axis=-1,
    )
    noise = rng.normal(0.0, 0.08, size=(h, w, 3))
    arr = np.clip((base + noise) * 255.0, 0, 255).round().astype(np.uint8)
    if mode == "RGB":
        return Image.fromarray(arr, "RGB")
    if mode == "RGBA":
        alpha = np.clip((0.25 + 0.75 * x * np.ones_like(y)) * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(np.dstack([arr, alpha]), "RGBA")
    return Image.fromarray(arr, "RGB").convert(mode)


def generated_images(seed: int = 0) -> list[tuple[str, Image.Image]]:
    """A few deterministic synthetic images of assorted sizes and modes, as ``(name, image)``.

    Names give height then width: RGB h48 x w64, h300 x w400 (the FACTS example: 308x392
    after smart_resize with the real bounds), h97 x w211, h512 x w128 (aspect ratios 0.25 to
    2.2), a flat grey 28x28, one RGBA and one grayscale ("L") image. Fresh objects each call.
    """
    specs = [  # (name, h, w, mode)
        ("rgb_h48_w64", 48, 64, "RGB"),
        ("rgb_h300_w400", 300, 400, "RGB"),
        ("rgb_h97_w211", 97, 211, "RGB"),
        ("rgb_h512_w128", 512, 128, "RGB"),
        ("rgba_h90_w120", 90, 120, "RGBA"),
        ("gray_h100_w150", 100, 150, "L"),
    ]
    out = [(name, tiny_image(h, w, seed=seed + i, mode=mode)) for i, (name, h, w, mode) in enumerate(specs)]
    out.insert(4, ("flat_h28_w28", Image.new("RGB", (28, 28), (128, 128, 128))))
    return out
