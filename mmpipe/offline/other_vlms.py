"""Offline fixtures for the VLMs mmpipe has no family-table row for (Idefics3, LLaVA 1.5,
Mllama, PaliGemma, LLaVA-OneVision-1.5 and Ovis2.5 (transformers >= 5.25); MiniCPM-V 4.6 / 4.7 from `mmpipe.offline.minicpmv`, `MINICPMV_NAMES`; Ovis2 from
`mmpipe.offline.ovis2`, `OVIS2_NAMES`): their
real transformers processors and tiny models, built locally with no download and no torchvision. The same table also builds the stock GLM-4.1V, Gemma 3,
LLaVA-OneVision and InternVL processors (and a tiny Gemma 3 model): the base that
`mmpipe.offline.gemma3`, `mmpipe.offline.internvl` and `mmpipe.offline.onevision` adjust.

Each processor is the stock transformers class (an image-only subclass where the stock
``__init__`` takes a video processor, which needs torchvision) around the family's real PIL
image processor and the offline tokenizer with the family's image tokens added. Used to check
that `mmpipe.families.family_of` refuses them (none is taken for a Qwen family) and to run
the generic path (`mmpipe.media.processor_encode`) on a real non-Qwen processor and model::

    >>> proc = build_foreign_processor("idefics3")          # doctest: +SKIP
    >>> model = build_foreign_model("idefics3")             # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
import tempfile

from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.offline.chat_templates import QWEN2_VL_CHAT_TEMPLATE
from mmpipe.families import DEFAULT_FAMILY, FAMILIES
from mmpipe.offline.minicpmv import MINICPMV_NAMES, build_minicpmv_model, build_minicpmv_processor
from mmpipe.offline.ovis2 import OVIS2_NAMES, build_ovis2_model, build_ovis2_processor
from mmpipe.offline.tf_lines import classes_by_name, image_only_subclass, pil_image_processor
from mmpipe.offline.tokenizer import build_tokenizer

__all__ = ["FOREIGN_PROCESSORS", "IDEFICS3_TILE", "MINICPMV_NAMES", "OVIS2_NAMES", "MODELS", "MORE_MODELS",
           "TINY_IMAGE", "build_foreign_processor", "build_foreign_model"]

IDEFICS3_TILE = 32  # tiny tiles: 32x32 pixels, 2x2 patches of 16, one token per tile (scale 2)
TINY_IMAGE = 32  # Gemma 3 / LLaVA images are resized to 32x32 (the tiny vision towers' image_size)

# name -> (processor class, image processor class, added tokens {attribute: token},
#          the chat template's text for one image, processor keyword arguments)
_SPECS = {
    "glm4v": ("Glm4vProcessor", "Glm4vImageProcessorPil",
              dict(image_token="<|image|>", begin="<|begin_of_image|>", end="<|end_of_image|>",
                   video_token="<|video|>"),
              "<|begin_of_image|><|image|><|end_of_image|>", {}),
    "gemma3": ("Gemma3Processor", "Gemma3ImageProcessorPil",
               dict(boi_token="<start_of_image>", image_token="<image_soft_token>", eoi_token="<end_of_image>"),
               "<start_of_image>", dict(image_seq_length=4)),
    "idefics3": ("Idefics3Processor", "Idefics3ImageProcessorPil",
                 dict(fake="<fake_token_around_image>", image="<image>", eou="<end_of_utterance>",
                      glob="<global-img>"),
                 "<image>", dict(image_seq_len=1)),
    "llava_onevision": ("LlavaOnevisionProcessor", "LlavaOnevisionImageProcessorPil",
                        dict(image="<image>", video="<video>"), "<image>",
                        dict(num_image_tokens=4, vision_feature_select_strategy="full")),
    "internvl": ("InternVLProcessor", "GotOcr2ImageProcessorPil",
                 dict(start_image_token="<img>", end_image_token="</img>", context_image_token="<IMG_CONTEXT>",
                      video_token="<video>"),
                 "<IMG_CONTEXT>", dict(image_seq_length=4)),
    "llava": ("LlavaProcessor", "CLIPImageProcessorPil", dict(image_token="<image>"), "<image>",
              dict(patch_size=16, vision_feature_select_strategy="default", num_additional_image_tokens=1)),
    "mllama": ("MllamaProcessor", "MllamaImageProcessorPil", dict(image_token="<|image|>"), "<|image|>", {}),
    "paligemma": ("PaliGemmaProcessor", "SiglipImageProcessorPil", dict(image_token="<image>"), "<image>", {}),
    # LLaVA-OneVision-1.5 (transformers >= 5.25): Qwen2-VL's patch grids and pads (the EXAONE 4.5
    # processor class, as transformers maps it), a RICE-ViT tower (one frame per patch), Qwen3 text, 1-D rope
    "llava_onevision1_5": ("Exaone4_5_Processor", "Qwen2VLImageProcessorPil",
                           dict(image_token="<|image_pad|>", video_token="<|video_pad|>"),
                           "<|vision_start|><|image_pad|><|vision_end|>", {}),
    # Ovis2.5 (transformers >= 5.25): patch grids of 16 merged 2x2 (one frame per patch); the
    # processor writes the tokenizer's image start token, the pads and its end token in place of each
    # pad the template writes; the model swaps the start/end tokens for learned visual embeddings.
    # Pads are Qwen's (the config's ids 151655/151656); the start/end names are ours (published ones
    # not reachable here; the ids differ in any case: the offline tokenizer is not Qwen3's)
    "ovis2_5": ("Ovis2_5Processor", "Ovis2_5ImageProcessorPil",
                dict(image_token="<|image_pad|>", video_token="<|video_pad|>", image_start_token="<ovis_image_start>",
                     image_end_token="<ovis_image_end>", video_start_token="<ovis_video_start>",
                     video_end_token="<ovis_video_end>"),
                "<|image_pad|>", {}),
}
# the transformers module each processor needs where it is newer than the oldest supported line (4.57)
_NEEDS = {"llava_onevision1_5": "transformers.models.llava_onevision1_5", "ovis2_5": "transformers.models.ovis2_5"}


def _available(name: str) -> bool:
    """Whether the installed transformers has ``name``'s classes: its model package is on disk
    (looked up without importing transformers: ``find_spec`` of a submodule would import it)."""
    import importlib.util
    import os

    module = _NEEDS.get(name)
    if module is None:
        return True
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    return spec is not None and any(os.path.isdir(os.path.join(loc, *rest))
                                    for loc in (spec.submodule_search_locations or ()))


_BOS = {"mllama": "<|begin_of_text|>", "paligemma": "<bos>"}  # processors that read tokenizer.bos_token (Mllama prepends it)
# the generic path's test processors: those of no native family (glm4v has a table row now;
# build_foreign_processor("glm4v") still builds it)
FOREIGN_PROCESSORS = tuple(n for n in _SPECS if n not in FAMILIES and n not in ("mllama", "paligemma")
                           and _available(n))  # MORE_MODELS
# image-processor settings that keep tests fast (Idefics3: tiny tiles, see IDEFICS3_TILE)
_IMAGE_KWARGS = {
    "idefics3": dict(size={"longest_edge": 2 * IDEFICS3_TILE}, max_image_size={"longest_edge": IDEFICS3_TILE}),
    "gemma3": dict(size={"height": TINY_IMAGE, "width": TINY_IMAGE}),
    "llava": dict(size={"shortest_edge": TINY_IMAGE}, crop_size={"height": TINY_IMAGE, "width": TINY_IMAGE}),
    "mllama": dict(size={"height": TINY_IMAGE, "width": TINY_IMAGE}, max_image_tiles=4),  # 32x32 tiles, up to 4
    "paligemma": dict(size={"height": TINY_IMAGE, "width": TINY_IMAGE}),
    # the test bounds of the Qwen fixtures: (4, 64) x 28^2 pixels, 4 to 64 tokens per image
    "llava_onevision1_5": dict(temporal_patch_size=1, size={"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28}),
    "ovis2_5": dict(size={"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32}),  # 32 = patch 16 x merge 2
}
# build_foreign_model's families (tests/encoding/test_generic_models.py)
MODELS = tuple(n for n in ("idefics3", "gemma3", "llava", "llava_onevision1_5", "ovis2_5") if _available(n))
MORE_MODELS = ("mllama", "paligemma")  # and these (cross-attention; prefix-LM): test_generic_more_models.py


@functools.lru_cache(maxsize=None)
def _named_tokenizer(name: str):
    """The offline tokenizer with ``name``'s image tokens as named special tokens (so that
    e.g. ``tokenizer.boi_token_id`` exists, as the Gemma 3 / InternVL processors read)."""
    tok = build_tokenizer(DEFAULT_FAMILY)  # the offline BPE; the family only picks its chat template
    named = _SPECS[name][2]
    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        bos = {"bos_token": _BOS[name]} if name in _BOS else {}
        return type(tok).from_pretrained(d, extra_special_tokens=dict(named), **bos)


@functools.lru_cache(maxsize=None)
def _processor_class(name: str) -> type:
    """``name``'s processor class: the stock one, or one built here (one per name: pickle finds it
    by its name, `_class_named`)."""
    import inspect

    import transformers

    base = getattr(transformers, _SPECS[name][0])
    # 4.57's PaliGemmaProcessor takes Gemma tokenizers only (5.x any): the offline one is Qwen2's
    loose = {} if is_transformers_5() or name != "paligemma" else {"tokenizer_class": "AutoTokenizer"}
    if "video_processor" not in inspect.signature(base.__init__).parameters:
        return type(base.__name__, (base,), dict(loose, __module__=__name__)) if loose else base
    return image_only_subclass(base, module=__name__, **loose)


def _class_named(class_name: str):
    for name, spec in _SPECS.items():
        if class_name in (spec[0], "ImageOnly" + spec[0]) and _available(name):
            cls = _processor_class(name)
            if cls.__module__ == __name__ and cls.__name__ == class_name:
                return cls
    return None


__getattr__ = classes_by_name(__name__, _class_named)  # the classes built here pickle by name


def build_foreign_processor(name: str):
    """A real processor of family ``name`` (one of `FOREIGN_PROCESSORS`, `MINICPMV_NAMES`, `OVIS2_NAMES`),
    offline; a fresh object on every call. Its chat template renders each image as the family's
    placeholder."""
    if name in MINICPMV_NAMES:  # a builder of its own (tests/encoding/test_generic_2026.py)
        return build_minicpmv_processor(name)
    if name in OVIS2_NAMES:  # and Ovis2 (tests/encoding/test_generic_ovis2.py)
        return build_ovis2_processor(name)
    if name not in _SPECS:
        raise ArgumentError(f"unknown offline processor {name!r}; use one of "
                            f"{FOREIGN_PROCESSORS + MINICPMV_NAMES + OVIS2_NAMES}")
    if not _available(name):
        raise ArgumentError(f"the offline {name!r} processor needs {_NEEDS[name]}, which the installed "
                            "transformers lacks; upgrade transformers (5.25 or later)")
    _, ip_name, _, image_text, kwargs = _SPECS[name]
    template = QWEN2_VL_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", image_text)
    image_processor = pil_image_processor(ip_name)(**_IMAGE_KWARGS.get(name, {}))
    if name == "paligemma":  # read by PaliGemmaProcessor: 2x2 patches of 16 -> 4 tokens per image
        image_processor.image_seq_length = 4
    return _processor_class(name)(image_processor=image_processor, tokenizer=copy.deepcopy(_named_tokenizer(name)),
                                  chat_template=template, **kwargs)


def _config(name: str):
    """The tiny config of ``name``: text hidden 64, 2 layers; vision hidden 32, 1 layer, 16x16 patches."""
    import transformers

    tok = _named_tokenizer(name)
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    # the tokenizer's own eos / bos: the configs' defaults (eos 1, bos 2, Llama's and Gemma's ids)
    # are '"' and '#' in this vocabulary, so generation stopped at a quote mark
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=pad,
                eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=16)
    if name == "idefics3":
        return transformers.Idefics3Config(text_config=dict(text, model_type="llama"),
                                           vision_config=dict(vision, image_size=IDEFICS3_TILE), scale_factor=2,
                                           image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=pad)
    if name == "llava":  # 2x2 patches, CLS dropped ("default"): 4 tokens per image
        return transformers.LlavaConfig(text_config=dict(text, model_type="llama"),
                                        vision_config=dict(vision, model_type="clip_vision_model", image_size=TINY_IMAGE),
                                        image_token_index=tok.convert_tokens_to_ids("<image>"), image_seq_length=4,
                                        vision_feature_layer=-1, vision_feature_select_strategy="default")
    if name == "mllama":  # 32x32 tiles of 2x2 patches (+CLS, padded to 8); layer 1 of 3 cross-attends
        return transformers.MllamaConfig(
            text_config=dict(text, model_type="mllama_text_model", num_hidden_layers=3, cross_attention_layers=[1],
                             bos_token_id=tok.convert_tokens_to_ids("<|begin_of_text|>"), eos_token_id=None),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                               attention_heads=2, image_size=TINY_IMAGE, patch_size=16, max_num_tiles=4,
                               intermediate_layers_indices=[0], vision_output_dim=64),
            image_token_index=tok.convert_tokens_to_ids("<|image|>"))
    if name == "paligemma":  # its processor adds 1152 <locNNNN>/<segNNN> tokens: the vocabulary is its tokenizer's
        return transformers.PaliGemmaConfig(
            text_config=dict(text, model_type="gemma", head_dim=16, vocab_size=len(build_foreign_processor(name).tokenizer)),
            vision_config=dict(vision, model_type="siglip_vision_model", image_size=TINY_IMAGE),
            image_token_index=tok.convert_tokens_to_ids("<image>"), projection_dim=64, hidden_size=64)
    if name == "llava_onevision1_5":  # Qwen3 text; a 1-layer RICE-ViT with 14x14 patches merged 2x2
        vision_ids = {f"{k}_token_id": tok.convert_tokens_to_ids(t) for k, t in (
            ("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
            ("vision_end", "<|vision_end|>"))}
        return transformers.LlavaOnevision15Config(
            text_config=dict(text, model_type="qwen3", head_dim=16),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                               spatial_merge_size=2, out_hidden_size=64), **vision_ids)
    if name == "ovis2_5":  # Qwen3 text; a 1-layer SigLIP2-NaViT (16x16 patches merged 2x2), visual vocabulary 64 + 4
        vision_ids = {f"{k}_token_id": tok.convert_tokens_to_ids(getattr(tok, f"{k}_token"))
                      for k in ("image", "video", "image_start", "image_end", "video_start", "video_end")}
        return transformers.Ovis2_5Config(
            text_config=dict(text, model_type="qwen3", head_dim=16),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               patch_size=16, image_size=64, window_size=32, vocab_size=68), **vision_ids)
    # gemma3: 4x4 patches of 8 pooled to 2x2 = 4 tokens per image (image_seq_length=4); sliding window 8
    return transformers.Gemma3Config(
        text_config=dict(text, model_type="gemma3_text", head_dim=16, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(vision, model_type="siglip_vision_model", image_size=TINY_IMAGE, patch_size=8),
        mm_tokens_per_image=4, image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"))


@functools.lru_cache(maxsize=4)
def _cached_model(name: str, seed: int):
    from mmpipe.offline.seeded import seeded_model

    cls = {"idefics3": "Idefics3ForConditionalGeneration", "gemma3": "Gemma3ForConditionalGeneration",
           "llava": "LlavaForConditionalGeneration", "mllama": "MllamaForConditionalGeneration",
           "paligemma": "PaliGemmaForConditionalGeneration",
           "llava_onevision1_5": "LlavaOnevision15ForConditionalGeneration",
           "ovis2_5": "Ovis2_5ForConditionalGeneration"}[name]
    model = seeded_model(cls, _config(name), seed, attn_implementation="eager")
    if name == "mllama":  # its tanh gates start at 0 (vision unused): open them so images count
        for pname, param in model.named_parameters():
            if "gate" in pname and param.numel() == 1:
                param.data.fill_(0.5)
    return model.eval()


def build_foreign_model(name: str = "idefics3", seed: int = 0):
    """A tiny randomly initialised model matching `build_foreign_processor` (one of `MODELS`):
    text hidden 64, 2 layers (Llama; Gemma 3: one sliding-window and one global layer);
    vision hidden 32, 1 layer, 16x16 patches (Gemma 3: 8x8). Idefics3: 32x32 tiles, scale
    factor 2 -> 1 token per tile; LLaVA (CLIP) and Gemma 3 (SigLIP): 32x32 images, 4 tokens
    each; Mllama: 32x32 tiles (up to 4 per image), 2 vision layers + 1 global, text layer 1 of 3
    cross-attends, its tanh gates set to 0.5 (0 at init: images would not count); PaliGemma
    (Gemma + SigLIP): 32x32 images, 4 tokens each; LLaVA-OneVision-1.5: Qwen3 text, a 1-layer
    RICE-ViT (14x14 patches, 2x2 merge: Qwen2-VL's grids, one frame per patch); Ovis2.5: Qwen3
    text, a 1-layer SigLIP2-NaViT (16x16 patches, 2x2 merge), visual vocabulary 64. fp32, eval
    mode, eager attention. A deep copy of a cached model per call. MiniCPM-V 4.6 / 4.7
    (`MINICPMV_NAMES`): `mmpipe.offline.minicpmv.build_minicpmv_model`; Ovis2 (`OVIS2_NAMES`):
    `mmpipe.offline.ovis2.build_ovis2_model`."""
    if name in MINICPMV_NAMES:
        return build_minicpmv_model(name, seed)
    if name in OVIS2_NAMES:
        return build_ovis2_model(name, seed)
    if name not in MODELS + MORE_MODELS:
        raise ArgumentError(f"no offline model for {name!r}; build_foreign_model builds one of "
                            f"{MODELS + MORE_MODELS + MINICPMV_NAMES + OVIS2_NAMES}")
    return copy.deepcopy(_cached_model(name, int(seed)))
