"""ReMA's actor with images: a replacement for ``DataParallelReMAPPOActor._forward_micro_batch``
(ReMA-public ``verl/workers/actor/dp_rema_actor.py``) that takes vision batches.

ReMA's own forward raises ``NotImplementedError`` for ``multi_modal_inputs`` and for 3-D
``position_ids``. `forward_micro_batch` is called as ReMA's actor calls it
(``self._forward_micro_batch(micro_batch, temperature=t)``, in ``_compute_log_prob`` under
``no_grad`` and in ``update_policy`` for the PPO loss) and returns what it returns:
``(entropy, log_probs)``, both float32 [b, L], L = the full sequence. ReMA does not cut a
response slice: its ``labels`` are already shifted (the label at t is the target of the
logits at t, -100 elsewhere), so the log-prob at t is ``log_softmax(logits[t] / T)[labels[t]]``
and 0 where the label is -100 (flash-attn's cross entropy, which ReMA's ``logprobs_from_logits``
needs, ignores -100). Entropy is taken at every position, as ReMA's.

The micro batch (a dict, or ``{**DataProto.batch, **DataProto.non_tensor_batch}``):

- ``input_ids`` / ``labels`` / ``attention_mask``: int64 [b, L] (ReMA asserts equal lengths).
- ``position_ids``: int64 [b, L] (text), [b, 3, L] (M-RoPE batch-first, as a DataProto holds
  it: `mmpipe.records.rema`) or [3, b, L] (the model's layout); 4 rows (text + M-RoPE) too.
- ``multi_modal_inputs`` (optional): b per-row dicts ``{"pixel_values": float32 [N_i, D],
  "image_grid_thw": int64 [I_i, 3]}`` (verl's per-row layout; a row without images: an empty
  dict, None, or 0 grids); concatenated in row order, as the model takes them.
- other keys (``step_ids``, ``old_log_probs``, ``advantages``...) are ignored.

Use::

    patch_actor(actor)                          # a DataParallelReMAPPOActor instance
    mb = actor_micro_batch(batch)               # an mmpipe ReMABatch, roles merged as ReMA merges them
    entropy, log_probs = actor._forward_micro_batch(mb, temperature=1.0)

On CUDA the forward runs under bfloat16 autocast as ReMA's does; elsewhere in the model's
dtype. ReMA's remove-padding path (flash-attn varlen) is replaced by the padded forward with
the attention mask (the same log-probs up to kernel numerics); Ulysses sequence parallelism is
not supported.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError

if TYPE_CHECKING:
    import torch

    from mmpipe.records.rema import ReMABatch

IGNORE_INDEX = -100
_MM_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


def _model_positions(pos: "torch.Tensor", b: int) -> "torch.Tensor":
    """[b, L] / [b, 3|4, L] / [3|4, b, L] -> the model's [b, L] or [3|4, b, L]. A DataProto
    holds batch-first tensors, so [b, C, L] wins when both readings fit (b = 3 or 4)."""
    if pos.dim() == 2:
        return pos
    if pos.dim() == 3 and pos.shape[0] == b and pos.shape[1] in (3, 4):
        return pos.transpose(0, 1)
    if pos.dim() == 3 and pos.shape[0] in (3, 4) and pos.shape[1] == b:
        return pos
    raise InputError("position_ids do not fit the batch", column="position_ids", stage="validate",
                     expected=f"[{b}, L], [{b}, 3, L] or [3, {b}, L]", found=list(pos.shape),
                     fix="pass the batch's position_ids as the rollout wrote them")


def _vision_kwargs(rows: Any, b: int, device) -> dict:
    """Per-row ``multi_modal_inputs`` -> one dict of tensors concatenated in row order."""
    import torch

    if rows is None:
        return {}
    rows = list(rows)
    if len(rows) != b:
        raise InputError("one multi_modal_inputs entry per row is needed", column="multi_modal_inputs",
                         stage="validate", expected=f"{b} entries", found=f"{len(rows)}",
                         fix="select multi_modal_inputs with the same rows as input_ids")
    parts: dict[str, list] = {}
    for i, row in enumerate(rows):
        for key, value in dict(row or {}).items():
            if value is None:
                continue
            if key not in _MM_KEYS:
                raise InputError(f"unknown multi_modal_inputs key {key!r}", row=i,
                                 column="multi_modal_inputs", stage="validate",
                                 expected=f"keys among {list(_MM_KEYS)}", found=sorted(row),
                                 fix="pass the processor's image/video tensors per row")
            t = torch.as_tensor(value)
            if t.shape[0]:
                parts.setdefault(key, []).append(t)
    return {k: torch.cat(v, dim=0).to(device) for k, v in parts.items()}


def forward_micro_batch(self, micro_batch: Mapping[str, Any], temperature: float,
                        calculate_entropy: bool = True) -> tuple[Optional["torch.Tensor"], "torch.Tensor"]:
    """ReMA's ``_forward_micro_batch`` for text and vision batches (bind it with `patch_actor`).

    Args:
        self: the actor (``actor_module`` is the model).
        micro_batch: see the module doc: input_ids / labels / attention_mask int64 [b, L],
            position_ids [b, L] / [b, 3, L] / [3, b, L], optional multi_modal_inputs (b dicts).
        temperature: the logits are divided by it before log-probs and entropy (ReMA's rule).
        calculate_entropy: False returns None for entropy (later verl actors' keyword; ReMA
            always computes it).

    Returns:
        (entropy, log_probs): float32 [b, L]; log_probs[t] = log p(labels[t] | tokens <= t),
        0 where labels[t] == -100; entropy of the tempered distribution at every t.
    """
    import torch
    import torch.nn.functional as F

    ids, labels, mask = micro_batch["input_ids"], micro_batch["labels"], micro_batch["attention_mask"]
    if labels.shape != ids.shape:
        raise InputError("labels must be shifted to the length of input_ids (ReMA's layout)", column="labels",
                         stage="validate", expected=list(ids.shape), found=list(labels.shape),
                         fix="use the rollout's {role}_labels, which are shifted already")
    b, L = ids.shape
    kwargs = {"input_ids": ids, "attention_mask": mask,
              "position_ids": _model_positions(micro_batch["position_ids"], b)}
    # `in` + [] rather than .get: without images ReMA passes a TensorDict, whose get() may raise
    mm = micro_batch["multi_modal_inputs"] if "multi_modal_inputs" in micro_batch else None
    kwargs.update(_vision_kwargs(mm, b, ids.device))
    if "mm_token_type_ids" in micro_batch:
        kwargs["mm_token_type_ids"] = micro_batch["mm_token_type_ids"]
    cuda = ids.device.type == "cuda"
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=cuda):
        logits = self.actor_module(**kwargs, use_cache=False).logits
    logits = logits.float() / temperature
    log_probs = -F.cross_entropy(logits.reshape(b * L, -1), labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                 reduction="none").view(b, L)
    entropy = None
    if calculate_entropy:
        entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return entropy, log_probs


def patch_actor(actor: Any) -> Any:
    """Bind `forward_micro_batch` as ``actor._forward_micro_batch`` (one instance; returns it)."""
    if not hasattr(actor, "actor_module"):
        raise ArgumentError("patch_actor needs ReMA's actor (an object with actor_module), "
                            f"got {type(actor).__name__}")
    if getattr(actor, "use_ulysses_sp", False):
        raise ArgumentError("patch_actor: Ulysses sequence parallelism is not supported; "
                            "set ulysses_sequence_parallel_size=1")
    actor._forward_micro_batch = types.MethodType(forward_micro_batch, actor)
    return actor


ACTOR_KEYS = ("input_ids", "labels", "attention_mask", "position_ids", "step_ids")


def actor_micro_batch(batch: "ReMABatch", roles: Optional[Sequence[str]] = None,
                      rows: Optional[Sequence[int]] = None) -> dict:
    """The dict ReMA's actor hands to its forward, from an mmpipe `ReMABatch`: roles merged as
    ReMA's ``merge_roles_data`` merges them (role-major: all rows of ``roles[0]``, then of
    ``roles[1]``...), keys `ACTOR_KEYS` int64 [R*b, L] (position_ids [R*b, 3, L] for vision
    families), plus ``multi_modal_inputs`` (object array of R*b per-row dicts, each row's
    question images repeated for every role) when the batch has images.
    ``rows``: the question rows to take (default all)."""
    import torch

    roles = list(roles or batch.agent_roles)
    rows = list(range(len(batch))) if rows is None else list(rows)
    for r in roles:
        if r not in batch.agent_roles:
            raise ArgumentError(f"role {r!r} is not in this batch's agent_roles {list(batch.agent_roles)}")
    idx = torch.as_tensor(rows, dtype=torch.long)
    out = {k: torch.cat([batch.batch[f"{r}_{k}"][idx] for r in roles]) for k in ACTOR_KEYS}
    if batch.image_grid_thw.shape[0]:
        per_row = [batch.multi_modal_inputs(i) for i in rows]
        mm = np.empty(len(roles) * len(rows), dtype=object)
        mm[:] = per_row * len(roles)
        out["multi_modal_inputs"] = mm
    return out
