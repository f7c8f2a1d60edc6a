"""Offline fixtures for GLM-4.1V (`mmpipe.families.GLM4V`): a real ``Glm4vProcessor`` and a tiny
``Glm4vForConditionalGeneration``, built locally with no download.

- `build_tokenizer`: the offline byte-level BPE (`mmpipe.offline.tokenizer.base_tokenizer`)
  with GLM's special tokens (:data:`GLM4V_SPECIAL_TOKENS`: ``[gMASK]``, ``<sop>``, the role
  tokens, ``<|begin_of_image|>`` / ``<|image|>`` / ``<|end_of_image|>``, the video ones) and a
  chat template that renders like GLM-4.1V's (:data:`GLM4V_CHAT_TEMPLATE`).
- `build_processor`: an image-only subclass of ``Glm4vProcessor`` (no video processor, so no
  torchvision) around the real PIL ``Glm4vImageProcessorPil`` with SMALL default bounds.
- `build_model`: a tiny random ``Glm4vForConditionalGeneration`` (fp32, eval, eager attention):
  text hidden 128, 2 heads of head_dim 64 (what vLLM's CPU attention takes), partial rotary 0.5,
  ``mrope_section`` [4, 6, 6]; vision depth 1, hidden 32.

`mmpipe.offline.build_processor("glm4v")` / ``build_model("glm4v")`` hand over to these
(`mmpipe.offline.tokenizer.OWN_BUILDERS`)::

    >>> from mmpipe.offline import build_processor, build_model   # doctest: +SKIP
    >>> proc, model = build_processor("glm4v"), build_model("glm4v")   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools

from mmpipe.compat import extra_special_tokens_key
from mmpipe.errors import ArgumentError
from mmpipe.families import GLM4V
from mmpipe.offline import published_templates as _published
from mmpipe.offline.tf_lines import classes_by_name, image_only_subclass, pil_image_processor, rope_config_fields

__all__ = [
    "GLM4V_SPECIAL_TOKENS", "GLM4V_EXTRA_TOKENS", "GLM4V_CHAT_TEMPLATE", "GLM4V_PUBLISHED_CHAT_TEMPLATE",
    "default_pixel_bounds",
    "build_tokenizer", "build_image_processor", "image_only_processor_class", "build_processor", "build_model",
    "save_checkpoint", "media_token_ids",
]

# In the order of the real GLM-4.1V vocabulary (151329 ... 151344 there).
GLM4V_SPECIAL_TOKENS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|image|>", "<|video|>",
)
GLM4V_EXTRA_TOKENS = ("<think>", "</think>", "<|begin_of_box|>", "<|end_of_box|>")
# as mmpipe.offline.models.ATTN_IMPLEMENTATION: eager attention gives padded == per-row logits bit for bit
ATTN_IMPLEMENTATION = "eager"
# What generation stops at (GLM-4.1V's generation_config: endoftext, user, observation).
_STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")

# NOT the published text: a cleaned-up copy the offline builders default to (many existing tests
# assert its renders). It renders like GLM-4.1V's template ("[gMASK]<sop>", each turn "<|role|>\n"
# + content with no end-of-turn token, an image as <|begin_of_image|><|image|><|end_of_image|>, a
# video as <|begin_of_video|><|video|><|end_of_video|>) but, unlike it, renders tool results as
# <|observation|> turns and content lists of any role as their parts. The published text:
# GLM4V_PUBLISHED_CHAT_TEMPLATE below.
GLM4V_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is not none -%}{%- for item in content -%}"
    "{%- if item['type'] == 'video' or 'video' in item -%}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
    "<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif 'text' in item -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}<|observation|>\n{{ render(message['content']) }}"
    "{%- else -%}<|{{ message['role'] }}|>\n{{ render(message['content']) }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)

# GLM-4.1V's chat template as zai-org publishes it with zai-org/GLM-4.1V-9B-Thinking (its
# chat_template; the text recorded at revision 3c1471e5 in a public renderer-validation record, whose
# sha256 of the JSON-encoded string, 5232dbe7..., this text reproduces; written verbatim in
# `mmpipe.offline.published_templates.GLM4V`, not copied here). What it does that the offline copy
# above does not: no tool branch (a "tool" message and tools= render as nothing, tool_calls are
# dropped), no enable_thinking, assistant / system content printed as it is (a list of parts would
# be its Python repr). The builders keep the offline copy by default; set
# ``proc.chat_template = proc.tokenizer.chat_template = GLM4V_PUBLISHED_CHAT_TEMPLATE`` to encode as
# GLM-4.1V users do.
GLM4V_PUBLISHED_CHAT_TEMPLATE = _published.GLM4V


def default_pixel_bounds() -> tuple[int, int]:
    """Small test defaults ``(min_pixels, max_pixels)`` = ``(4, 64) * 2 * 28**2``: GLM's rule
    bounds two frames of an image (`mmpipe.images.spec.glm4v_smart_resize`), so every image
    becomes 4 to 64 LLM tokens as with the Qwen fixtures."""
    f2 = GLM4V.factor**2 * GLM4V.temporal_patch_size
    return 4 * f2, 64 * f2


@functools.lru_cache(maxsize=None)
def _cached_tokenizer():
    from tokenizers import AddedToken

    from mmpipe.offline.tokenizer import base_tokenizer

    tok = base_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in GLM4V_SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM4V_EXTRA_TOKENS])
    tok.add_special_tokens({
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        extra_special_tokens_key(): [t for t in GLM4V_SPECIAL_TOKENS if t != "<|endoftext|>"],
    })
    tok.chat_template = GLM4V_CHAT_TEMPLATE
    tok.name_or_path = f"mmpipe-testing/{GLM4V.name}"
    return tok


def media_token_ids() -> dict[str, int]:
    """The media token ids a GLM-4.1V-style model config takes, as its keyword arguments
    (``image_token_id``, ``video_token_id``, ``image_start_token_id``, ``image_end_token_id``,
    ``video_start_token_id``, ``video_end_token_id``), from the offline GLM tokenizer
    (`build_tokenizer`): the same for ``Glm4vConfig``, ``Glm46VConfig``, the MoE lines' configs
    (`mmpipe.offline.vllm_2026`) and ``Glm5NextConfig``."""
    ids = _cached_tokenizer().convert_tokens_to_ids
    return dict(image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
                image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
                video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"))


def build_tokenizer():
    """A small offline fast tokenizer with GLM-4.1V's special tokens and chat template (a fresh
    copy per call). ``eos_token`` and ``pad_token`` are ``<|endoftext|>``."""
    return copy.deepcopy(_cached_tokenizer())


def build_image_processor(*, min_pixels: int | None = None, max_pixels: int | None = None):
    """The real ``Glm4vImageProcessorPil`` (PIL backend, whatever is installed) with
    ``size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}`` (default
    `default_pixel_bounds`) and GLM's patch 14, merge 2, temporal patch 2, CLIP mean/std."""
    lo, hi = default_pixel_bounds()
    lo = lo if min_pixels is None else int(min_pixels)
    hi = hi if max_pixels is None else int(max_pixels)
    if lo > hi:
        raise ArgumentError(f"min_pixels {lo} > max_pixels {hi}")
    return pil_image_processor("Glm4vImageProcessorPil")(
        size={"shortest_edge": lo, "longest_edge": hi}, patch_size=GLM4V.patch_size,
        temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
        image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std),
    )


@functools.lru_cache(maxsize=None)
def image_only_processor_class() -> type:
    """``Glm4vProcessor`` without a video processor (its class check fails without
    torchvision, even for None); the stock class stays in the MRO, so `family_of` finds glm4v."""
    from transformers import Glm4vProcessor

    doc = "``Glm4vProcessor`` without a video processor (works without torchvision); built by mmpipe.offline."
    return image_only_subclass(Glm4vProcessor, module=__name__, doc=doc)


# the image-only class pickles by name (spawn DataLoader workers, pickled encoders)
__getattr__ = classes_by_name(__name__, lambda name: image_only_processor_class() if name == "ImageOnlyGlm4vProcessor"
                              else None)


def build_processor(*, min_pixels: int | None = None, max_pixels: int | None = None):
    """A real ``Glm4vProcessor`` (image-only subclass): `build_image_processor` + `build_tokenizer`.
    ``proc(text=[...], images=[...], return_tensors="pt")`` returns ``input_ids``,
    ``attention_mask``, ``pixel_values`` float32 [N, 1176], ``image_grid_thw`` int64 [I, 3] and
    ``mm_token_type_ids``."""
    return image_only_processor_class()(
        image_processor=build_image_processor(min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=build_tokenizer(), chat_template=GLM4V_CHAT_TEMPLATE,
    )


def _model_config():
    from transformers import Glm4vConfig

    tok = _cached_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in GLM4V_SPECIAL_TOKENS}
    text = dict(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, rms_norm_eps=1e-5,
        pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        # head_dim 64, half of it rotary: 16 frequencies split (t, h, w) as the checkpoints' 32 are [8, 12, 12]
        **rope_config_fields({"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                              "mrope_section": [4, 6, 6]}),
    )
    vision = dict(
        depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=128, in_channels=3,
        image_size=112, patch_size=GLM4V.patch_size, spatial_merge_size=GLM4V.merge_size,
        temporal_patch_size=GLM4V.temporal_patch_size,
    )
    return Glm4vConfig(text_config=text, vision_config=vision, **media_token_ids())


@functools.lru_cache(maxsize=4)
def _cached_model(seed: int):
    from mmpipe.offline.seeded import seeded_model

    model = seeded_model("Glm4vForConditionalGeneration", _model_config(), seed,
                         attn_implementation=ATTN_IMPLEMENTATION)
    model.eval()
    tok = _cached_tokenizer()
    gen = model.generation_config
    gen.eos_token_id = [tok.convert_tokens_to_ids(t) for t in _STOP_TOKENS]
    gen.pad_token_id = gen.bos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    gen.do_sample = False
    return model


def build_model(seed: int = 0):
    """A tiny random ``Glm4vForConditionalGeneration`` (fp32, eval mode; a deep copy per call)."""
    return copy.deepcopy(_cached_model(int(seed)))


def save_checkpoint(path, *, seed: int = 0):
    """Write the tiny model (`build_model`, already vLLM-loadable: head_dim 64) and the STOCK
    ``Glm4vProcessor`` with a ``Glm4vVideoProcessor`` (what ``AutoProcessor`` and vLLM load) to
    ``path``; returns it as a ``Path``. The video processor needs torchvision's Python transforms:
    build it in the vLLM environment (`scripts/envs/vllm.sh`); ArgumentError elsewhere."""
    from pathlib import Path

    import transformers

    if not transformers.utils.is_torchvision_available():
        raise ArgumentError("a vLLM-loadable glm4v checkpoint needs the stock processor with a video processor, "
                            "which needs torchvision's Python transforms; build it in the vLLM environment")
    lo, hi = default_pixel_bounds()
    video = transformers.Glm4vVideoProcessor(
        size={"shortest_edge": lo, "longest_edge": hi}, patch_size=GLM4V.patch_size,
        temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
        image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std))
    processor = transformers.Glm4vProcessor(image_processor=build_image_processor(), tokenizer=build_tokenizer(),
                                            video_processor=video, chat_template=GLM4V_CHAT_TEMPLATE)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_model(seed).save_pretrained(path)
    processor.save_pretrained(path)
    return path


def offline_processor(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for ``family`` "glm4v" (`mmpipe.offline.tokenizer.OWN_BUILDERS`)."""
    return build_processor(min_pixels=min_pixels, max_pixels=max_pixels)


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for ``family`` "glm4v"."""
    return build_model(seed)
