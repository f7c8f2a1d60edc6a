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
"""

from __future__ import annotations

import contextlib
import threading

import torch

from mmpipe.compat import is_transformers_5
from mmpipe.rope import get_rope_index

__all__ = ["needs_training_positions", "training_positions"]

_LOCK = threading.Lock()
_HELD: dict = {}  # id(inner model) -> [inner model, times entered]


def needs_training_positions(family, batch) -> bool:
    """Whether ``generate`` over ``batch`` must number positions by mmpipe's rule: transformers 4.x,
    a family whose video positions scale by ``second_per_grid_ts`` (Qwen2.5-VL), a batch with videos."""
    return bool(batch.video_grid_thw.shape[0]) and family.takes_second_per_grid_ts and not is_transformers_5()


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
