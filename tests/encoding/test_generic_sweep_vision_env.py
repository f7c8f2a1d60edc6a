"""The generic path across the transformers 5.25 VLM processor classes without an offline line of their own
(issue 26: the generic path is the one record for every processor mmpipe has no family row for), in the
"vision" environment (most of their image or video processors need torchvision).

Each class: its real processor around its stock image processor (and video processor / feature extractor
where its constructor takes one), an offline BPE tokenizer holding the special tokens these processors read,
and a ChatML template writing the processor's image placeholder per image item (not the checkpoints' own
templates: the lines with a tiny model and a published or reconstructed template are in
tests/encoding/test_generic_vision_env.py). Rows of 1, 0 and 2 images of other sizes and shapes:

- every row == the processor's own call on it (ids and every output, dtype included);
- the batch == the processor's own batch call (both padding sides; one image list per row where the
  batch call takes them so), ``sample_to_image_indices`` per row;
- ``unbatch(collate(rows)) == rows``.

A sweep of this kind found Step-3.7's crop outputs missing from the layout (fixed in the probe); what a
class cannot do itself (PerceptionLM's processor cannot stack two images of other tile counts) is not
listed here."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.testing import invariants

from helpers import generic_chat_rows

pytestmark = pytest.mark.needs_env("vision")

CLASSES = ("glm5_next", "hy_v4_vl", "lfm3_vl", "lfm2_vl", "minimax_m3_vl", "molmo2", "step3p7", "inkling2",
           "dots3_note", "cosmos3_edge", "muse_glimmer", "gemma4_unified", "hunyuan_vl", "paddleocr_vl",
           "ernie4_5_vl_moe", "aya_vision", "cohere2_vision", "video_llama_3", "deepseek_ocr2", "qianfan_ocr",
           "hyperclovax_vision_v2", "minicpm_ocr", "granite_docling", "granite4_vision", "lighton_ocr",
           "unlimited_ocr", "deepseek_vl", "janus")
COUNTS, SIZES = [1, 0, 2], [(64, 100), (120, 80), (48, 48)]
# the special tokens these processors read from their tokenizers (attribute -> token)
NAMED = dict(image_token="<|image|>", boi_token="<start_of_image>", eoi_token="<end_of_image>",
             image_start_token="<|image_start|>", image_end_token="<|image_end|>", start_image_token="<img>",
             end_image_token="</img>", context_image_token="<IMG_CONTEXT>", video_token="<video>",
             video_start_token="<frame_start>", video_end_token="<frame_end>", image_break_token="[IMG_BREAK]",
             img_line_break_token="<|IMG_LINE_BREAK|>", row_token="<row_1_col_1>", slice_start_token="<slice>",
             slice_end_token="</slice>", image_id_start_token="<image_id>", image_id_end_token="</image_id>",
             audio_token="<|audio|>", boa_token="<|audio_start|>", eoa_token="<|audio_end|>")
OTHER_TOKENS = ("<image>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|video|>",
                "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<im_start>",
                "<im_end>", "<im_patch>", "<im_col>", "<patch_start>", "<patch_end>", "<patch_newline>",
                "<|im_start|>", "<|im_end|>", "<pad>", "<s>", "</s>", "<fake_token_around_image>", "<global-img>",
                "<end_of_utterance>", "[IMG]", "[IMG_END]", "<image_placeholder>", "<begin_of_image>",
                "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<image_soft_token>")
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}IMAGE{% elif c['type'] == 'text' %}"
            "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# the image text a class's call takes where it is not the processor's image_token
IMAGE_TEXT = {"hunyuan_vl": "<|image_start|><|image|><|image_end|>", "qianfan_ocr": "<image>"}


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from mmpipe.offline.vision_env_vlms import offline_tokenizer

    tokens = tuple(dict.fromkeys(list(NAMED.values()) + list(OTHER_TOKENS)))
    return offline_tokenizer(tokens, bos="<s>", eos="<|im_end|>", pad="<pad>", named=NAMED)


def _component(mapping: dict, model_type: str):
    """The stock component class of ``model_type`` in an auto mapping (PIL backend first), built with its defaults."""
    import transformers

    names = mapping.get(model_type)
    if isinstance(names, dict):
        names = names.get("pil") or names.get("torchvision")
    elif isinstance(names, (tuple, list)):
        names = next(n for n in names if n)
    return getattr(transformers, names)()


def _processor(model_type: str):
    import copy

    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    cls = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])
    params = inspect.signature(cls.__init__).parameters
    kw = {"image_processor": _component(IMAGE_PROCESSOR_MAPPING_NAMES, model_type),
          "tokenizer": copy.deepcopy(_tokenizer())}
    if "video_processor" in params and model_type in VIDEO_PROCESSOR_MAPPING_NAMES:
        kw["video_processor"] = _component(VIDEO_PROCESSOR_MAPPING_NAMES, model_type)
    if "feature_extractor" in params and model_type in FEATURE_EXTRACTOR_MAPPING_NAMES:
        kw["feature_extractor"] = _component(FEATURE_EXTRACTOR_MAPPING_NAMES, model_type)
    if "patch_size" in params:  # processors that take the vision tower's patch size (no default)
        kw["patch_size"] = 14
    proc = cls(**kw)
    proc.chat_template = TEMPLATE.replace("IMAGE", IMAGE_TEXT.get(model_type) or proc.image_token)
    return proc


@pytest.fixture(scope="module", params=CLASSES)
def line(request):
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    if request.param not in PROCESSOR_MAPPING_NAMES:
        pytest.skip(f"this transformers has no {request.param}")
    proc = _processor(request.param)
    raws = generic_chat_rows(COUNTS, sizes=SIZES)
    return request.param, proc, raws, [mmpipe.encode_row(r, proc) for r in raws]


def _array(v) -> np.ndarray:
    return v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)


def _texts(proc, raws) -> list:
    return [proc.apply_chat_template(r["messages"], tokenize=False) for r in raws]


def test_rows_equal_the_processors_own_call(line):
    name, proc, raws, rows = line
    for raw, row, text in zip(raws, rows, _texts(proc, raws)):
        own = proc(text=[text], images=raw["images"] or None, return_tensors="pt")
        assert np.array_equal(row.input_ids, own["input_ids"][0].numpy()), name
        assert set(own) - {"input_ids", "attention_mask"} == set(row.vision) | set(row.sequence), name
        for k, v in row.vision.items():  # (Unlimited-OCR returns its crop counts as lists: compared as arrays)
            assert np.array_equal(v, _array(own[k])) and v.dtype == _array(own[k]).dtype, (name, k)
        for k, v in row.sequence.items():
            assert np.array_equal(v, _array(own[k])[0]), (name, k)


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_equals_the_processors_own_batch_call(line, side):
    name, proc, raws, rows = line
    texts, flat = _texts(proc, raws), [im for r in raws for im in r["images"]]
    try:
        own = proc(text=texts, images=flat, return_tensors="pt", padding=True, padding_side=side)
    except ValueError:  # batch calls that take one image list per row (a flat list counts as one row's)
        own = proc(text=texts, images=[r["images"] for r in raws], return_tensors="pt", padding=True,
                   padding_side=side)
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    got = batch.model_inputs()
    for k, v in own.items():
        assert torch.equal(torch.as_tensor(got[k]), torch.as_tensor(v)), (name, k)
    assert batch.sample_to_image_indices == [[0], [], [1, 2]]


def test_unbatch_collate_is_the_rows(line):
    _, proc, _, rows = line
    for side in ("left", "right"):
        invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
