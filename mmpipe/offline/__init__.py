"""Offline builders: a real tokenizer, processor and tiny model per family, and sample images,
made locally with no download (what the demo, the CLI's ``testing:FAMILY`` processors, the
notebooks and the tests use). Nothing here downloads anything; transformers is imported inside
the functions, so importing this package stays cheap.

- `mmpipe.offline.tokenizer`: :func:`build_tokenizer` - a real ``transformers`` fast tokenizer
  (``Qwen2Tokenizer``): a small byte-level BPE learned deterministically on a built-in English
  corpus, the Qwen special tokens and a Qwen-style chat template
  (`mmpipe.offline.chat_templates`). The special tokens get the same ids in every family, see
  :data:`SPECIAL_TOKENS` and :func:`special_token_ids`.
- `mmpipe.offline.processors`: :func:`build_processor` - a real Qwen-VL processor (an
  image-only subclass of the family's stock processor class) around the real Qwen image
  processor with the family's patch / merge / mean / std settings and SMALL default pixel
  bounds so tests are fast.
- `mmpipe.offline.models`: :func:`build_model` - a tiny randomly initialised model of the
  family's model class (fp32, eval mode).
- `mmpipe.offline.glm4v`: GLM-4.1V's tokenizer (its special tokens, a GLM-like chat template),
  ``Glm4vProcessor`` and tiny ``Glm4vForConditionalGeneration``; ``build_processor("glm4v")`` /
  ``build_model("glm4v")`` hand over to it, as they do to the three modules below
  (`mmpipe.offline.tokenizer.OWN_BUILDERS`).
- `mmpipe.offline.gemma3`, `mmpipe.offline.internvl`, `mmpipe.offline.onevision`: Gemma 3,
  InternVL and LLaVA-OneVision - their real processors with small fixed-size tiles and tiny
  matching models (the last two share `mmpipe.offline.tiny_towers`;
  `mmpipe.offline.tile_builders` picks either by name).
- `mmpipe.offline.gemma_tokenizer`: a tokenizer built like Gemma's published one (SentencePiece-style
  BPE with byte fallback that adds its BOS, newline runs as added tokens);
  ``build_gemma3_processor(tokenizer="gemma")`` puts it in Gemma 3's processor (transformers 5).
- `mmpipe.offline.qwen3_5`: tiny Qwen3.5, Qwen3.5-MoE (hybrid linear attention) and Qwen3-VL-MoE
  models that take the Qwen3-VL processor's rows (``build_model("qwen3_5")`` routes there).
- `mmpipe.offline.same_family_lines`: tiny Qwen4-Exp, Cosmos3 Omni (Qwen3-VL processor) and GLM-OCR
  (GLM-4.6V processor) models of transformers 5.25 (``build_line_model("qwen4_exp")``).
- `mmpipe.offline.published_525`: Qwen3.6's chat template as published (GLM-OCR's:
  ``same_family_lines.GLM_OCR_CHAT_TEMPLATE``), to encode as those checkpoints' users do.
- `mmpipe.offline.glm46v`, `mmpipe.offline.minicpmv`: GLM-4.6V's ``Glm46VProcessor`` and MiniCPM-V
  4.6 / 4.7's processors with tiny models (transformers 5 only; their chat templates are
  reconstructions, see each module).
- `mmpipe.offline.ovis2`: Ovis2's stock processor (small tiles, the published chat template and
  image tokens) and a tiny ``Ovis2ForConditionalGeneration``, for the generic path.
- `mmpipe.offline.other_vlms`: the stock processors and tiny models of VLMs mmpipe has no
  family-table row for (Idefics3, LLaVA 1.5, Mllama, PaliGemma), the base the modules above
  adjust.
- `mmpipe.offline.tf_lines`: what the builders do differently on transformers 4.57 and 5.x (the
  PIL image processors' class names, image-only processors, rope config fields), so every family
  above builds on both lines (tests/offline/test_tf457_families.py checks 4.57).
- `mmpipe.offline.images`: :func:`sample_photos`, :func:`generated_images`,
  :func:`tiny_image` - real photographs that ship with matplotlib, and deterministic
  synthetic images.

Example::

    >>> from mmpipe.offline import build_processor, build_model, tiny_image   # doctest: +SKIP
    >>> proc = build_processor("qwen2_5_vl")                                  # doctest: +SKIP
    >>> msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    >>> text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # doctest: +SKIP
    >>> inputs = proc(text=[text], images=[tiny_image(64, 96)], return_tensors="pt")     # doctest: +SKIP
    >>> build_model("qwen2_5_vl")(**inputs).logits.shape                     # doctest: +SKIP
"""

from mmpipe.offline.chat_templates import QWEN2_VL_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE
from mmpipe.offline.images import generated_images, sample_photos, tiny_image
from mmpipe.offline.models import ATTN_IMPLEMENTATION, build_model
from mmpipe.offline.processors import (
    build_image_processor,
    build_processor,
    default_pixel_bounds,
    image_only_class_name,
    image_only_family,
    image_only_processor_class,
)
from mmpipe.offline.tokenizer import EXTRA_TOKENS, FAMILY_NAMES, SPECIAL_TOKENS, build_tokenizer, special_token_ids

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
    "image_only_class_name",
    "image_only_family",
    "image_only_processor_class",
]
