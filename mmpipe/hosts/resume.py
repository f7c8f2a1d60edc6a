"""Resuming a transformers ``Trainer`` / TRL ``SFTTrainer`` run: restore the weights the checkpoint holds.

::

    trainer = restore_checkpoint_weights(Trainer(model=model, args=args, ...))
    trainer.train(resume_from_checkpoint=True)

Why: transformers 5 saves a checkpoint in the published key layout (``save_pretrained`` reverts
the model's weight renamings: Qwen2-VL / Qwen2.5-VL save ``visual.*`` and ``model.layers.*`` for
the model's ``model.visual.*`` and ``model.language_model.layers.*``; Gemma 3, InternVL and
LLaVA-OneVision likewise; transformers 4.57 does the same through ``_checkpoint_conversion_mapping``),
but ``Trainer._load_from_checkpoint`` and ``_load_best_model`` load that file with a plain non-strict
``load_state_dict``: no key matches, a warning lists them, and the run silently continues from the
weights the model had before the resume (the optimizer and the data order are restored, the weights
are not; transformers issues #43701 and #48805, up to 5.23 at least; 4.57 likewise).
`restore_checkpoint_weights` makes both loads go through the model's own renamings.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mmpipe.errors import ArgumentError

__all__ = ["restore_checkpoint_weights", "load_checkpoint_weights"]


def restore_checkpoint_weights(trainer: Any) -> Any:
    """Make ``trainer``'s ``resume_from_checkpoint`` and ``load_best_model_at_end`` load the
    checkpoint's weights under the model's own parameter names; returns ``trainer``. Models whose
    checkpoints need no renaming (Qwen3-VL, text models), PEFT, FSDP and DeepSpeed runs keep the
    stock loading."""
    stock_resume, stock_best = trainer._load_from_checkpoint, trainer._load_best_model

    def load_from_checkpoint(resume_from_checkpoint, model=None):
        target = trainer.model if model is None else model
        if not _ours(trainer, target, resume_from_checkpoint):
            return stock_resume(resume_from_checkpoint, model)
        load_checkpoint_weights(target, resume_from_checkpoint)

    def load_best_model():
        path = trainer.state.best_model_checkpoint
        if not _ours(trainer, trainer.model, path):
            return stock_best()
        load_checkpoint_weights(trainer.model, path)

    trainer._load_from_checkpoint, trainer._load_best_model = load_from_checkpoint, load_best_model
    return trainer


def _ours(trainer, model, path) -> bool:
    """True when the stock loader would mis-key this checkpoint and ours can read it."""
    plain = not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or hasattr(model, "peft_config"))
    return plain and path is not None and bool(_weight_files(path)) and _saved_to_model_names(model) is not None


def load_checkpoint_weights(model, checkpoint_dir: str) -> None:
    """Load ``checkpoint_dir``'s ``model.safetensors`` (or ``pytorch_model.bin``, or their shards)
    into ``model``, mapping the saved names through the model's renamings. Every parameter must be
    found (tied ones may share a loaded tensor), every saved tensor must have a parameter: otherwise
    `ArgumentError` names them."""
    names = _saved_to_model_names(model) or {k: k for k in model.state_dict()}
    files = _weight_files(checkpoint_dir)
    if not files:
        raise ArgumentError(f"{checkpoint_dir!r} holds no model.safetensors / pytorch_model.bin (or shards): "
                            "pass a Trainer checkpoint folder")
    state, unknown = {}, []
    for path in files:
        for key, tensor in _load_file(path).items():
            if key in names:
                state[names[key]] = tensor
            else:
                unknown.append(key)
    result = model.load_state_dict(state, strict=False)
    params = model.state_dict()
    loaded = {params[k].data_ptr() for k in state if k in params}
    missing = [k for k in result.missing_keys if params[k].data_ptr() not in loaded]
    if unknown or missing:
        raise ArgumentError(
            f"checkpoint {checkpoint_dir!r} does not match {type(model).__name__}: saved tensors without a parameter "
            f"{unknown[:5]}, parameters not in the checkpoint {missing[:5]}; resume with the model class and config "
            "the checkpoint was trained with")


# what save_pretrained writes: safetensors, or (transformers 4.x, save_safetensors=False) torch pickles
_WEIGHT_NAMES = (("model.safetensors", "model.safetensors.index.json"),
                 ("pytorch_model.bin", "pytorch_model.bin.index.json"))


def _weight_files(checkpoint_dir: str) -> list[str]:
    for single, index in _WEIGHT_NAMES:
        single, index = os.path.join(checkpoint_dir, single), os.path.join(checkpoint_dir, index)
        if os.path.isfile(single):
            return [single]
        if os.path.isfile(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(checkpoint_dir, s) for s in shards]
    return []


def _load_file(path: str) -> dict:
    """{saved name: tensor} of one weight file, on the CPU."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _saved_to_model_names(model) -> dict[str, str] | None:
    """{saved name: parameter name} when ``save_pretrained`` renames this model's weights (and
    only renames them); None when it keeps the names or also transforms tensors."""
    import torch

    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4.x: save_pretrained reverses _checkpoint_conversion_mapping
        return _saved_to_model_names_4x(model)

    # one distinct empty tensor per name: a pure renaming hands back the same objects under new keys
    marks = {k: torch.empty(0) for k in model.state_dict()}
    owner = {id(t): k for k, t in marks.items()}
    try:
        saved = revert_weight_conversion(model, dict(marks))
    except Exception:  # a converter (fused experts ...) that cannot run on the marks: not a renaming
        return None
    if any(id(t) not in owner for t in saved.values()):
        return None
    names = {k: owner[id(t)] for k, t in saved.items()}
    return None if all(k == v for k, v in names.items()) else names


def _saved_to_model_names_4x(model) -> dict[str, str] | None:
    """transformers 4.x: {saved name: parameter name} as 4.57's ``save_pretrained`` writes a VLM
    (its ``VLMS`` classes): the first pattern of the reversed ``_checkpoint_conversion_mapping``
    that matches a key renames it (Qwen2-VL: ``model.visual.*`` -> ``visual.*``). None when the
    model has no mapping or save_pretrained keeps its names."""
    import re

    from transformers import modeling_utils

    mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    vlms = getattr(modeling_utils, "VLMS", ())
    if not mapping or not any(v in c.__name__.lower() for c in type(model).__mro__[:-1] for v in vlms):
        return None
    reverse = [(v, re.sub(r"\(.*\)", "", k.lstrip("^"))) for k, v in mapping.items()]
    names = {}
    for key in model.state_dict():
        saved = key
        for pattern, replacement in reverse:
            saved, n = re.subn(pattern, replacement, key)
            if n:
                break
        names[saved] = key
    return None if all(k == v for k, v in names.items()) else names
