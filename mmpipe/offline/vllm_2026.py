"""Offline vLLM-loadable checkpoints of the 2026 model lines (issue 27.2): tiny randomly
initialised Qwen3.5, Qwen3.5-MoE, Qwen3-VL-MoE, GLM-4.5V (``glm4v_moe``) and GLM-4.6V models,
saved with the STOCK processor class and a video processor config (what ``AutoProcessor`` and
``vllm.LLM`` load), built locally with no download::

    >>> path = save_checkpoint("qwen3_5", "/tmp/tiny-qwen3_5")                 # doctest: +SKIP
    >>> llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True)  # doctest: +SKIP

What vLLM's CPU build asks of them (as `mmpipe.offline.checkpoints`): attention ``head_dim`` 64
(hidden 128, 2 heads); the Qwen3.5 lines' gated-delta-rule layers get key / value heads of 64
too. Every line has 2 text layers (Qwen3.5: one ``linear_attention`` then one
``full_attention``), a depth-1 vision tower with the family's patch / merge / temporal sizes;
the MoE lines have 4 experts, 2 per token (width 96 for the Qwen lines, 64 plus a dense first
layer for GLM). Each fills in what vLLM 0.32 reads and transformers 5.19's configs leave out,
as the published config.json files do (see the comments below); the Qwen3.5 lines are served in
bfloat16 (`VLLM_DTYPE`).

`LINES`: line -> (mmpipe family the rows resolve to, transformers model class, processor
class). Two GLM-4.6V forms, both with the ``Glm46VProcessor`` (so both give glm46v rows):
``glm46v_moe`` on a ``Glm4vMoeForConditionalGeneration`` (model type ``glm4v_moe``), as GLM-4.6V
is published (GLM-4.6V-Flash: the same processor on the dense ``Glm4vForConditionalGeneration``);
vLLM's ``glm4_1v`` implementation serves it (its processor code treats any processor that is not
a ``Glm4vProcessor`` as GLM-4.6V's). ``glm46v`` is transformers' own
``Glm46VForConditionalGeneration`` (model type ``glm46v``), which vLLM 0.32's registry does not
name: vLLM runs it on its Transformers backend (``TransformersMultiModalForCausalLM``).

The processors need torchvision's Python transforms (the video processors): build these in the
vLLM environment (`scripts/envs/vllm.sh`); `ArgumentError` elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from mmpipe.errors import ArgumentError
from mmpipe.families import GLM4V, GLM46V, QWEN3_VL
from mmpipe.offline.seeded import seeded_model

__all__ = ["LINES", "HEAD_DIM", "VLLM_DTYPE", "line_config", "build_line_processor", "save_checkpoint"]

HEAD_DIM = 64  # vLLM's CPU attention supports head sizes >= 64
# line -> (mmpipe family name, transformers model class, stock processor class)
LINES = {
    "qwen3_5": (QWEN3_VL.name, "Qwen3_5ForConditionalGeneration", QWEN3_VL.processor_classes[0]),
    "qwen3_5_moe": (QWEN3_VL.name, "Qwen3_5MoeForConditionalGeneration", QWEN3_VL.processor_classes[0]),
    "qwen3_vl_moe": (QWEN3_VL.name, "Qwen3VLMoeForConditionalGeneration", QWEN3_VL.processor_classes[0]),
    "glm4v_moe": (GLM4V.name, "Glm4vMoeForConditionalGeneration", GLM4V.processor_classes[0]),
    "glm46v": (GLM46V.name, GLM46V.model_class, GLM46V.processor_classes[0]),
    "glm46v_moe": (GLM46V.name, "Glm4vMoeForConditionalGeneration", GLM46V.processor_classes[0]),
}
# line -> the dtype vLLM 0.32 serves it in on CPU: its CPU gated-delta-rule kernel asserts
# bfloat16 ("CPU GDN attention requires BF16."; x86 needs AVX512-BF16), so the Qwen3.5 lines
# run in bf16; their saved weights are rounded to bf16 (float32 values), so vLLM and a float32
# transformers forward use the same weights. Every other line: float32.
VLLM_DTYPE = {"qwen3_5": "bfloat16", "qwen3_5_moe": "bfloat16"}
_TEXT = dict(hidden_size=2 * HEAD_DIM, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             max_position_embeddings=8192)
# norm_topk_prob: transformers' Qwen3-VL-MoE / Qwen3.5-MoE always renormalise the top-k weights and
# their text configs drop the field (``norm_topk_prob = AttributeError()``), but vLLM 0.32's MoE
# block reads ``config.norm_topk_prob`` (AttributeError at start-up without it); the published
# checkpoints' config.json carry it (true), so these do too.
# moe_intermediate_size 96: 2 * 96 != hidden 128, so the fused expert tensors' two layouts (below)
# never have the same shape.
_QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, norm_topk_prob=True)
# Qwen3-VL-MoE checkpoints store fused expert weights as [E, hidden, 2 * width] / [E, width, hidden]
# (what vLLM 0.32 loads: ``is_fused_checkpoint_transposed``); transformers 5.19 reads either layout
# (a shape-checked transpose) but saves its own [E, 2 * width, hidden] / [E, hidden, width], which
# vLLM refuses (a shape mismatch in its MoE weight loader): written transposed here.
_TRANSPOSED_ON_DISK = {"qwen3_vl_moe": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")}
_QWEN_LINEAR = dict(layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4,
                    linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM, linear_num_key_heads=2,
                    linear_num_value_heads=2)


def _check_line(line: str) -> tuple[str, str, str]:
    import transformers

    if line not in LINES:
        raise ArgumentError(f"unknown model line {line!r}; known: {list(LINES)}")
    fam, model_cls, proc_cls = LINES[line]
    for cls in (model_cls, proc_cls):
        if not hasattr(transformers, cls):
            raise ArgumentError(f"{line}: transformers {transformers.__version__} has no {cls}; install a "
                                "transformers that ships it")
    return fam, model_cls, proc_cls


def _qwen_config(line: str, model_cls: str):
    import transformers

    from mmpipe.offline.tokenizer import build_tokenizer, special_token_ids

    fam, ids = QWEN3_VL, special_token_ids(QWEN3_VL.name)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True}
    text = dict(_TEXT, num_key_value_heads=2, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                vocab_size=len(build_tokenizer(fam.name)), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    vision = dict(depth=1, num_heads=2, in_channels=3, hidden_size=32, intermediate_size=64,
                  out_hidden_size=_TEXT["hidden_size"], patch_size=fam.patch_size, spatial_merge_size=fam.merge_size,
                  temporal_patch_size=fam.temporal_patch_size, num_position_embeddings=256)
    if line == "qwen3_vl_moe":
        text.update(_QWEN_MOE)
        rope["mrope_section"] = [12, 10, 10]  # (24, 20, 20) scaled to head_dim 64
        vision["deepstack_visual_indexes"] = [0]
    else:  # Qwen3.5: hybrid layers, a quarter of head_dim rotary in the checkpoints; half here
        text.update(_QWEN_LINEAR)
        rope.update(partial_rotary_factor=0.5, mrope_section=[6, 5, 5])
        if line == "qwen3_5_moe":
            text.update(_QWEN_MOE, shared_expert_intermediate_size=64)
    text["rope_parameters"] = rope
    config_class = getattr(transformers, model_cls).config_class
    return config_class(text_config=text, vision_config=vision, image_token_id=ids[fam.image_token],
                        video_token_id=ids[fam.video_token], vision_start_token_id=ids[fam.vision_start_token],
                        vision_end_token_id=ids[fam.vision_end_token])


def _glm_config(line: str, model_cls: str):
    import transformers

    from mmpipe.offline.glm4v import build_tokenizer, media_token_ids

    tok = build_tokenizer()
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    text = dict(_TEXT, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=len(tok), pad_token_id=pad,
                eos_token_id=pad,
                # head_dim 64, half rotary: 16 frequencies split (t, h, w) as the checkpoints' 32 are [8, 12, 12]
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [4, 6, 6]})
    if line in ("glm4v_moe", "glm46v_moe"):  # layer 0 dense, layer 1 MoE (first_k_dense_replace 1)
        # head_dim, use_qk_norm: transformers' Glm4vMoeTextConfig has neither (it derives head_dim
        # from hidden / heads and has no q/k norm); vLLM 0.32's GLM-4.5V reads both
        # (AttributeError at start-up without them); the published config.json carry them
        text.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
                    first_k_dense_replace=1, head_dim=HEAD_DIM, use_qk_norm=False)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=_TEXT["hidden_size"],
                  in_channels=3, image_size=112, patch_size=GLM4V.patch_size, spatial_merge_size=GLM4V.merge_size,
                  temporal_patch_size=GLM4V.temporal_patch_size)
    if line == "glm46v":
        text["model_type"] = "glm4v_text"
    config_class = getattr(transformers, model_cls).config_class
    return config_class(text_config=text, vision_config=vision, **media_token_ids())


def line_config(line: str):
    """The transformers config of ``line``'s tiny vLLM-loadable model (head_dim 64)."""
    _, model_cls, _ = _check_line(line)
    return _qwen_config(line, model_cls) if line.startswith("qwen") else _glm_config(line, model_cls)


def _require_torchvision(line: str) -> None:
    import transformers

    if not transformers.utils.is_torchvision_available():
        raise ArgumentError(
            f"a vLLM-loadable {line} checkpoint needs the stock processor with a video processor, which needs "
            "torchvision's Python transforms; build it in the vLLM environment (scripts/envs/vllm.sh)")


def build_line_processor(line: str):
    """The stock processor ``line``'s checkpoints ship (Qwen3-VL's for the Qwen lines, Glm4vProcessor
    for GLM-4.5V, Glm46VProcessor for GLM-4.6V) with the offline tokenizer, the real image
    processor (mmpipe's small offline pixel bounds) and the model type's video processor."""
    import transformers

    _, _, proc_cls = _check_line(line)
    _require_torchvision(line)
    if line.startswith("qwen"):
        from mmpipe.offline.checkpoints import build_checkpoint_processor

        return build_checkpoint_processor(QWEN3_VL.name)
    from mmpipe.offline import glm4v

    lo, hi = glm4v.default_pixel_bounds()
    sizes = dict(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=GLM4V.patch_size,
                 temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
                 image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std))
    tok = glm4v.build_tokenizer()
    if proc_cls == "Glm4vProcessor":
        return transformers.Glm4vProcessor(image_processor=glm4v.build_image_processor(), tokenizer=tok,
                                           video_processor=transformers.Glm4vVideoProcessor(**sizes),
                                           chat_template=glm4v.GLM4V_CHAT_TEMPLATE)
    from mmpipe.offline.glm46v import GLM46V_CHAT_TEMPLATE

    tok.chat_template = GLM46V_CHAT_TEMPLATE
    return transformers.Glm46VProcessor(image_processor=transformers.Glm46VImageProcessorPil(**sizes), tokenizer=tok,
                                        video_processor=transformers.Glm46VVideoProcessor(**sizes),
                                        chat_template=GLM46V_CHAT_TEMPLATE)


def _stop_ids(line: str) -> tuple[list[int], int]:
    if line.startswith("qwen"):
        from mmpipe.offline.tokenizer import special_token_ids

        ids = special_token_ids(QWEN3_VL.name)
        return [ids["<|im_end|>"], ids["<|endoftext|>"]], ids["<|endoftext|>"]
    from mmpipe.offline.glm4v import build_tokenizer

    tok = build_tokenizer()
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    return stops, stops[0]


def _transpose_on_disk(file: Path, suffixes: tuple[str, ...]) -> None:
    """Rewrite ``file`` with the 3-D tensors whose names end in ``suffixes`` transposed (1, 2)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in tensors.items():
        if k.endswith(suffixes):
            tensors[k] = v.transpose(1, 2).contiguous()
    save_file(tensors, str(file), metadata=meta)


def save_checkpoint(line: str, path: Union[str, Path], *, seed: int = 0) -> Path:
    """Write ``line``'s tiny float32 checkpoint (model from ``seed``, generation config, stock
    processor) to ``path``; returns it. Idempotent for the same arguments (a stamp file)."""
    import torch
    import transformers

    _, model_cls, _ = _check_line(line)
    path = Path(path)
    stamp = {"line": line, "seed": int(seed), "head_dim": HEAD_DIM, "dtype": VLLM_DTYPE.get(line, "float32"),
             "transformers": transformers.__version__}
    stamp_file = path / "mmpipe_checkpoint.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    processor = build_line_processor(line)
    model = seeded_model(model_cls, line_config(line), int(seed))
    if VLLM_DTYPE.get(line) == "bfloat16":
        model = model.to(torch.bfloat16).to(torch.float32)
    stops, pad = _stop_ids(line)
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = stops, pad, pad
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if line in _TRANSPOSED_ON_DISK:
        _transpose_on_disk(path / "model.safetensors", _TRANSPOSED_ON_DISK[line])
    processor.save_pretrained(path)
    stamp_file.write_text(json.dumps(stamp))
    return path
