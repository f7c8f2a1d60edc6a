"""Offline fixtures for GLM-5.3-Flash (transformers ``glm5_next``) on the generic path, in the "vision" test
environment (its processor needs its video processor, which needs torchvision):
`mmpipe.offline.vision_env_vlms.build_vision_env_processor` / ``build_vision_env_model("glm5_next")`` call
`build_processor` / `build_model` here.

GLM-5.3-Flash (``Glm5NextProcessor`` around ``Glm5NextImageProcessorPil``): GLM's patch grids (14 px patches,
merged 2x2, two frames per temporal patch; ``pixel_values`` [N, 1176], ``image_grid_thw`` [I, 3]), each
``<|image|>`` expanded to one ``<|image|>`` per merged patch, ``mm_token_type_ids`` returned. Its text model
takes 1-D positions (no M-RoPE): hybrid layers of KDA linear attention and sparse MLA attention whose
indexer picks ``index_topk`` keys in pools of ``index_kpool``, MoE feed-forward layers, hyper-connections.

Its first published chat template renders image items as a text reminder (no ``<|image|>``: the generic
path refuses it, naming the fix); the template here is GLM-4.6V's (`mmpipe.offline.glm46v`), which writes
``<|begin_of_image|><|image|><|end_of_image|>`` per image, as the patched templates of its fine-tuning
recipes do. The tiny model's indexer budget (``index_topk``) is `GLM5_NEXT_TOPK` by default, more keys than
the test rows hold, so every key is kept; ``build_model(index_topk=16)`` gives one that selects.
"""

from __future__ import annotations

__all__ = ["GLM5_NEXT_TOPK", "build_processor", "build_model"]

GLM5_NEXT_TOPK = 256  # sparse-attention keys per query of the tiny model (the published: 2048)


def build_processor():
    """The stock ``Glm5NextProcessor`` around the stock PIL image processor and video processor, the offline
    GLM tokenizer (`mmpipe.offline.glm4v.build_tokenizer`) and GLM-4.6V's chat template; a fresh object."""
    import transformers

    from mmpipe.offline.glm46v import GLM46V_CHAT_TEMPLATE
    from mmpipe.offline.glm4v import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = GLM46V_CHAT_TEMPLATE
    return transformers.Glm5NextProcessor(image_processor=transformers.Glm5NextImageProcessorPil(), tokenizer=tok,
                                          video_processor=transformers.Glm5NextVideoProcessor(),
                                          chat_template=GLM46V_CHAT_TEMPLATE)


def build_model(index_topk: int = GLM5_NEXT_TOPK):
    """Text: GLM-5-Next, hidden 64, 4 layers (KDA linear attention, sparse MLA, KDA, sparse MLA; dense and
    4-expert top-2 MoE feed-forward layers alternating; 2 hyper-connection streams), the indexer picking
    ``index_topk`` keys in pools of 4; vision: depth 1, hidden 32, the processor's patch, merge and temporal
    patch sizes. Vocabulary: the offline GLM tokenizer's."""
    import torch
    import transformers

    from mmpipe.offline.glm4v import build_tokenizer, media_token_ids

    tok = build_tokenizer()
    ip = transformers.Glm5NextImageProcessorPil()
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=0, v_head_dim=32,
                qk_nope_head_dim=32, index_topk=int(index_topk), index_head_dim=16, index_n_heads=2, index_kpool=4,
                linear_head_dim=16, linear_num_heads=2, hc_mult=2, pad_token_id=tok.pad_token_id,
                layer_types=["linear_attention", "indexed_attention"] * 2, mlp_layer_types=["dense", "sparse"] * 2,
                indexer_types=["full", "full", "shared", "full"])
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  projection_intermediate_size=64, patch_size=ip.patch_size, spatial_merge_size=ip.merge_size,
                  temporal_patch_size=ip.temporal_patch_size)
    cfg = transformers.Glm5NextConfig(text_config=text, vision_config=vision, **media_token_ids())
    return transformers.Glm5NextForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                     dtype=torch.float32)
