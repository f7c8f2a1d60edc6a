"""Offline fixtures for Step-3.7-Flash (transformers ``step3p7``) on the generic path, in the "vision" test
environment (its image processor needs torchvision): `mmpipe.offline.vision_env_vlms.build_vision_env_processor`
/ ``build_vision_env_model("step3p7")`` call `build_processor` / `build_model` here.

Step-3.7 (``Step3p7Processor`` around ``Step3p7ImageProcessor``): each image gives one square global view
(``pixel_values`` [I, 3, S, S]) and, when it is elongated (long side > 1.5 x short side) or larger than the
view, local crops of a window chosen by its aspect ratio (``pixel_values_local`` [crops, 3, W, W],
``num_local_patches`` [I]); an image without crops adds nothing to ``pixel_values_local``, and a call whose
images have none returns no ``pixel_values_local`` at all. The processor writes each ``<im_patch>`` as one
``<patch_start>`` + features + ``<patch_end>`` block per crop and ``<im_start>`` + features + ``<im_end>`` for
the view. Tiny settings here: a 112 px view (4 tokens), 56 px crops (1 token each), images above 448 px
scaled down.

The chat template is a ChatML frame writing the processor's ``<im_patch>`` once per image item (the
published Step-3.7 template was not reachable here).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["STEP3P7_TOKENS", "STEP3P7_CHAT_TEMPLATE", "build_processor", "build_model"]

STEP3P7_TOKENS = ("<|begin_of_sentence|>", "<|end_of_sentence|>", "<pad>", "<|im_start|>", "<|im_end|>", "<im_patch>",
                  "<patch_start>", "<patch_end>", "<patch_newline>", "<im_start>", "<im_end>")
STEP3P7_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<im_patch>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# global view side, crop side, largest side kept (px); view and crop sides are multiples of 56 (14 px patches,
# two stride-2 downsamplers), as the published 728 and 504 are
STEP3P7_VIEW, STEP3P7_CROP, STEP3P7_MAX = 112, 56, 448


@functools.lru_cache(maxsize=None)
def _step3p7_tokenizer():
    return offline_tokenizer(STEP3P7_TOKENS, bos="<|begin_of_sentence|>", eos="<|im_end|>", pad="<pad>",
                             template=STEP3P7_CHAT_TEMPLATE)


def build_processor():
    """The stock ``Step3p7Processor`` around the stock image processor at the tiny sizes above, the offline
    tokenizer and `STEP3P7_CHAT_TEMPLATE`; a fresh object."""
    import transformers

    ip = transformers.Step3p7ImageProcessor(size={"height": STEP3P7_VIEW, "width": STEP3P7_VIEW},
                                            patch_size=STEP3P7_CROP, max_image_size=STEP3P7_MAX)
    return transformers.Step3p7Processor(image_processor=ip, tokenizer=copy.deepcopy(_step3p7_tokenizer()),
                                         chat_template=STEP3P7_CHAT_TEMPLATE)


def build_model():
    """Text: Step-3.5 (hidden 64, 2 layers: a dense one, then a mixture of 4 experts, top 2, with the
    shared expert); vision: the Step-3.7 ViT (hidden 32, 1 layer, 14 px patches, two stride-2 downsamplers)
    at the 112 px view and the 56 px crops. Vocabulary: the offline tokenizer's."""
    import torch
    import transformers

    tok = _step3p7_tokenizer()
    (image_id,) = ids(tok, "<im_patch>")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, mlp_layer_types=["dense", "sparse"],
                layer_types=["full_attention", "full_attention"], sliding_window=512, moe_intermediate_size=32, n_routed_experts=4,
                num_experts_per_tok=2, share_expert_dim=32, pad_token_id=tok.pad_token_id,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=STEP3P7_VIEW, patch_size=14, mlp_ratio=2.0, max_position_embeddings=(STEP3P7_VIEW // 14) ** 2)
    cfg = transformers.Step3p7Config(text_config=text, vision_config=vision, image_token_id=image_id)
    return transformers.Step3p7ForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                     dtype=torch.float32)
