"""Offline fixtures for MiniCPM-V 4.6 and 4.7 (transformers 5.24 ``minicpmv4_6`` / ``minicpmv4_7``):
their real processors around the real PIL image processor, and tiny random models of the
transformers classes (fp32), built locally with no download and no torchvision. mmpipe has no
family table for them: they take the generic path (`mmpipe.media.processor_encode`)::

    >>> proc = build_minicpmv_processor("minicpmv4_6")      # doctest: +SKIP
    >>> model = build_minicpmv_model("minicpmv4_6")         # doctest: +SKIP

Facts from the published checkpoints (openbmb/MiniCPM-V-4.6; read from the public
``tokenizer_config.json`` keys that AXERA-TECH/MiniCPM-V-4.6.axera's ``minicpmv46_helper.py`` and
sglang's ``MiniCPMV4_6MultimodalProcessor`` read; the hub files themselves are not reachable here):
the tokenizer's ``extra_special_tokens`` name ``<|image_pad|>`` / ``<|video_pad|>`` (image / video
token), ``<image>`` ``</image>``, ``<slice>`` ``</slice>``, ``<image_id>`` ``</image_id>``; the
chat template is the Qwen3.5 one (ChatML turns, no default system prompt) and writes each image
as ``<|image_pad|>`` followed by a newline, which the processor expands to
``<image_id>k</image_id><image>`` + tokens + ``</image>`` (+ one ``<slice>...</slice>`` per
slice, rows joined by newlines). The image processor resizes so that each side is a multiple of
patch 14 x merge 4 = 56 pixels and slices an image larger than ``scale_resolution``^2 into up to
``max_slice_nums`` slices; its ``pixel_values`` is ONE array ``float32 [1, 3, 14, sum of patches
x 14]`` for the whole call (every slice of every image of every row, joined on the last axis) and
``target_sizes`` int32 ``[slices, 2]``. MiniCPM-V 4.7 adds ``mm_token_type_ids`` and computes its
own canvas M-RoPE positions from them (``model_inputs(positions="none")``).

Tiny settings here: ``scale_resolution`` 112 (a 112x112 view is 8x8 patches = 4 tokens),
``max_slice_nums`` 4; text: Qwen3.5 hidden 64, one linear-attention and one full-attention layer;
vision: hidden 32, 2 layers (the window merger after layer 0).
"""

from __future__ import annotations

import copy
import functools
import tempfile
from typing import Optional

from mmpipe.errors import ArgumentError
from mmpipe.offline.tf_lines import classes_by_name

__all__ = ["MINICPMV_NAMES", "MINICPMV_TOKENS", "build_minicpmv_processor", "build_minicpmv_model"]

MINICPMV_NAMES = ("minicpmv4_6", "minicpmv4_7")
# the checkpoints' named special tokens (tokenizer_config.json extra_special_tokens)
MINICPMV_TOKENS = dict(image_token="<|image_pad|>", video_token="<|video_pad|>", image_start_token="<image>",
                       image_end_token="</image>", slice_start_token="<slice>", slice_end_token="</slice>",
                       image_id_start_token="<image_id>", image_id_end_token="</image_id>")
_CLASSES = {"minicpmv4_6": ("MiniCPMV4_6Processor", "MiniCPMV4_6Config", "MiniCPMV4_6ForConditionalGeneration"),
            "minicpmv4_7": ("MiniCPMV4_7Processor", "MiniCPMV4_7Config", "MiniCPMV4_7ForConditionalGeneration")}
SCALE_RESOLUTION = 112  # tiny: one 112x112 view = 8x8 patches of 14 = 4 tokens (16x merge)
MAX_SLICES = 4


def _check(name: str) -> None:
    if name not in MINICPMV_NAMES:
        raise ArgumentError(f"unknown offline MiniCPM-V processor {name!r}; use one of {MINICPMV_NAMES}")


@functools.lru_cache(maxsize=None)
def _tokenizer():
    """The offline BPE with the checkpoints' named tokens and a Qwen3.5-like template."""
    from mmpipe.families import QWEN3_VL
    from mmpipe.offline.chat_templates import QWEN3_VL_CHAT_TEMPLATE
    from mmpipe.offline.tokenizer import build_tokenizer

    tok = build_tokenizer(QWEN3_VL.name)  # Qwen special tokens (<|image_pad|>, <|video_pad|> among them)
    tok.chat_template = QWEN3_VL_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>",
                                                       "<|image_pad|>{{- '\\n' -}}")
    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        return type(tok).from_pretrained(d, extra_special_tokens=dict(MINICPMV_TOKENS))


@functools.lru_cache(maxsize=None)
def _processor_class(name: str) -> type:
    """An image-only subclass of the stock processor: its ``__init__`` takes no video processor
    (the stock one needs torchvision) and hands the stock ``__init__`` a stand-in holding the
    two settings it reads (``slice_mode``, ``downsample_mode``). One class per name (pickle finds
    it by its name, `_class_named`)."""
    import types

    import transformers
    from transformers.processing_utils import ProcessorMixin

    base = getattr(transformers, _CLASSES[name][0])

    class _NoVideo(ProcessorMixin):
        def __init__(self, image_processor=None, video_processor=None, tokenizer=None, **kwargs):
            ProcessorMixin.__init__(self, image_processor, tokenizer, **kwargs)
            self.video_processor = types.SimpleNamespace(slice_mode=image_processor.slice_mode,
                                                         downsample_mode=image_processor.downsample_mode)

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        base.__init__(self, image_processor, None, tokenizer, chat_template=chat_template, **kwargs)

    return type("ImageOnly" + base.__name__, (base, _NoVideo), {"__init__": __init__, "__module__": __name__})


def _class_named(class_name: str) -> Optional[type]:
    name = next((n for n, classes in _CLASSES.items() if class_name == "ImageOnly" + classes[0]), None)
    return None if name is None else _processor_class(name)


__getattr__ = classes_by_name(__name__, _class_named)  # the image-only classes pickle by name


def build_minicpmv_processor(name: str = "minicpmv4_6", **image_kwargs):
    """A real MiniCPM-V 4.6 / 4.7 processor (image-only subclass of the stock class) around the
    real ``MiniCPMV4_6ImageProcessorPil`` (tiny: ``scale_resolution`` 112, ``max_slice_nums`` 4;
    ``image_kwargs`` override) and the offline tokenizer with the checkpoints' tokens. A fresh object."""
    _check(name)
    import transformers

    kw = dict(scale_resolution=SCALE_RESOLUTION, max_slice_nums=MAX_SLICES, **image_kwargs)
    tok = copy.deepcopy(_tokenizer())
    return _processor_class(name)(image_processor=transformers.MiniCPMV4_6ImageProcessorPil(**kw),
                                  tokenizer=tok, chat_template=tok.chat_template)


def _config(name: str):
    import transformers

    tok = _tokenizer()
    ids = {t: tok.convert_tokens_to_ids(v) for t, v in MINICPMV_TOKENS.items()}
    text = dict(model_type="qwen3_5_text", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=14,
                  image_size=SCALE_RESOLUTION)
    extra = {}
    if name == "minicpmv4_7":  # the canvas M-RoPE markers (config.json of the 4.7 checkpoints)
        extra = dict(image_start_id=ids["image_start_token"], image_end_id=ids["image_end_token"],
                     slice_start_id=ids["slice_start_token"], slice_end_id=ids["slice_end_token"],
                     newline_id=tok.encode("\n", add_special_tokens=False)[0])
    return getattr(transformers, _CLASSES[name][1])(
        text_config=text, vision_config=vision, insert_layer_id=0, image_size=SCALE_RESOLUTION,
        image_token_id=ids["image_token"], video_token_id=ids["video_token"], **extra)


@functools.lru_cache(maxsize=2)
def _cached_model(name: str, seed: int):
    from mmpipe.offline.seeded import seeded_model

    return seeded_model(_CLASSES[name][2], _config(name), seed, attn_implementation="eager").eval()


def build_minicpmv_model(name: str = "minicpmv4_6", seed: int = 0):
    """A tiny random ``MiniCPMV4_6ForConditionalGeneration`` / ``MiniCPMV4_7...`` matching
    `build_minicpmv_processor` (module doc: sizes), fp32, eval, eager attention; a deep copy of a
    cached model per call."""
    _check(name)
    return copy.deepcopy(_cached_model(name, int(seed)))
