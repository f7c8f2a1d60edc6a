"""Video positions for ``generate`` on transformers 4.x (`TransformersEngine`).

On 4.x, ``generate`` cannot take the batch's own positions (it extends them in decoding from rope
deltas it sets only when it computes them itself, `mmpipe.rollout.inputs.to_generate_kwargs`), so
the model's ``get_rope_index`` numbers the prompt. transformers 4.57's Qwen2.5-VL one casts each
video's ``second_per_grid_ts`` to the int64 of its frame range before scaling (0.667 -> 0, 1.33 -> 1):
a video sampled at any rate other than 1 or 2 fps gets other temporal positions than the original
Qwen rule that training rows, verl and vLLM use (rollout logprobs 1e-3 from the training forward,
measured on the tiny model). `training_positions` swaps the model's ``get_rope_index`` for
`mmpipe.rope.get_rope_index` (the rule the rows hold, token types read from the ids) while
``generate`` runs; decoding then extends mmpipe's positions by the deltas it returns.

Called directly, `mmpipe.rollout.inputs.to_generate_kwargs` cannot carry positions into 4.x's
``generate`` (it refuses ``position_ids=True`` there); for a batch whose videos 4.57 would number
otherwise (`tf4_video_mismatches`) it warns, naming the rows and this context manager::

    with training_positions(model, batch.fam, processor.tokenizer):
        out = model.generate(**to_generate_kwargs(batch, model=model), max_new_tokens=64)
"""

from __future__ import annotations

import contextlib
import threading

import torch

from mmpipe.compat import is_transformers_5
from mmpipe.rope import get_rope_index

__all__ = ["needs_training_positions", "training_positions", "tf4_video_mismatches"]

_LOCK = threading.Lock()
_HELD: dict = {}  # id(inner model) -> [inner model, times entered]


def needs_training_positions(family, batch) -> bool:
    """Whether ``generate`` over ``batch`` must number positions by mmpipe's rule: transformers 4.x,
    a family whose video positions scale by ``second_per_grid_ts`` (Qwen2.5-VL), a batch with videos."""
    return bool(batch.video_grid_thw.shape[0]) and family.takes_second_per_grid_ts and not is_transformers_5()


def tf4_video_mismatches(family, batch) -> list[int]:
    """The videos of ``batch`` (indices into ``video_grid_thw [V, 3]``) that transformers 4.x's
    Qwen2.5-VL ``get_rope_index`` numbers otherwise than the rows: its temporal index is
    ``i * int64(s) * tokens_per_second`` (``s = second_per_grid_ts[v]``, float32 [V]), the rows'
    ``floor(i * tokens_per_second * s)`` (`mmpipe.rope`), i < the video's grid t. Empty unless
    `needs_training_positions` (and for videos whose ``s`` is whole, e.g. sampled at 1 or 2 fps)."""
    if not needs_training_positions(family, batch):
        return []
    from mmpipe.rope_checks import video_time_scale

    grids = torch.as_tensor(batch.video_grid_thw).reshape(-1, 3).long().cpu()
    tps = float(family.tokens_per_second)
    sec = batch.second_per_grid_ts
    scale = video_time_scale(sec, grids.shape[0], tps, "vllm", torch.device("cpu")).cpu()
    whole = torch.ones(grids.shape[0], dtype=torch.float64) if sec is None else \
        torch.as_tensor(sec).reshape(-1).cpu().to(torch.int64).to(torch.float64)
    out = []
    for v, t in enumerate(grids[:, 0].tolist()):
        i = torch.arange(t, dtype=torch.float64)
        if not torch.equal(torch.floor(i * scale[v].double()), torch.floor(i * whole[v] * tps)):
            out.append(v)
    return out


def inside_training_positions(model) -> bool:
    """Whether ``model``'s ``get_rope_index`` is `training_positions`' rule now (inside its block)."""
    inner = _inner(model)
    return inner is not None and "get_rope_index" in vars(inner)


def _inner(model):
    inner = getattr(model, "model", None)
    return inner if inner is not None and hasattr(inner, "get_rope_index") else None


@contextlib.contextmanager
def training_positions(model, family, tokenizer):
    """While inside: ``model.model.get_rope_index`` is mmpipe's rule for ``family`` (token types from
    the ids: the family's image / video pads in ``tokenizer``); restored on exit (re-entrant across
    threads sharing the model: the last one out restores it). A model without it: unchanged."""
    inner = _inner(model)
    if inner is None:
        yield
        return
    ids = family.vision_token_ids(tokenizer)
    image_id, video_id = ids["image"], ids["video"]

    def rule(input_ids=None, image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None,
             attention_mask=None, **_):
        types = (input_ids == image_id).long() + 2 * (input_ids == video_id).long()
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        pos, deltas = get_rope_index(input_ids, types, image_grid_thw, video_grid_thw, second_per_grid_ts, mask,
                                     family=family)
        # 4.x's deltas count from the padded length (decoding adds them to the cache position)
        return pos, deltas + mask.long().sum(-1, keepdim=True) - input_ids.shape[-1]

    with _LOCK:
        held = _HELD.setdefault(id(inner), [inner, 0])
        if held[1] == 0:
            inner.get_rope_index = rule  # an instance attribute over the class's method
        held[1] += 1
    try:
        yield
    finally:
        with _LOCK:
            held[1] -= 1
            if held[1] == 0:
                del inner.__dict__["get_rope_index"]
                del _HELD[id(inner)]
