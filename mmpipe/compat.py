"""What differs between the transformers lines mmpipe supports (4.57.x and 5.x).

mmpipe's core (ids, M-RoPE positions, pixel values, logits) is the same on both lines; what
differs is API surface:

- Qwen-VL ``forward`` / ``generate`` take ``mm_token_type_ids`` in 5.x only; 4.57's
  ``generate`` refuses it ("model_kwargs are not used by the model"). `forward_accepts`
  answers per model (from its forward signature; for a PEFT / ``torch.compile`` / DDP wrapper,
  the model inside), `is_transformers_5` per installed version.
- Building a tokenizer from a vocab dict: 5.x's ``Qwen2Tokenizer`` is tokenizers-backed and
  takes ``vocab=``/``merges=``; 4.57's is the slow (file-based) one, the fast class is
  ``Qwen2TokenizerFast(tokenizer_object=...)``. Named special tokens beyond eos/pad are
  ``extra_special_tokens`` in 5.x, ``additional_special_tokens`` in 4.57.
- Processors return ``mm_token_type_ids`` by default in 5.x only (`mm_token_type_ids_kwargs`).
- ``get_rope_index`` takes ``mm_token_type_ids`` in 5.x and finds vision blocks from the ids
  in 4.x (`hf_get_rope_index` calls either).
- Long videos: 5.x starts the text after a video block whose temporal extent exceeds
  max(h, w)/merge at ``start + max(h, w)//merge``; 4.x (and vLLM, mmpipe) at the block's max + 1.
"""

from __future__ import annotations

import functools
import inspect

__all__ = [
    "transformers_version", "is_transformers_5", "extra_special_tokens_key", "forward_accepts",
    "mm_token_type_ids_kwargs", "hf_get_rope_index", "unwrapped_model",
]


@functools.lru_cache(maxsize=None)
def transformers_version() -> tuple[int, int]:
    """(major, minor) of the installed transformers."""
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def is_transformers_5() -> bool:
    """Whether the installed transformers is 5.x or newer (imports transformers on first call)."""
    return transformers_version()[0] >= 5


def extra_special_tokens_key() -> str:
    """The ``add_special_tokens`` key for named special tokens beyond eos / pad."""
    return "extra_special_tokens" if is_transformers_5() else "additional_special_tokens"


def forward_accepts(model, name: str) -> bool:
    """Whether ``model.forward`` names the argument ``name`` (``**kwargs`` does not count:
    generate refuses kwargs the forward does not name). Asked of the model inside a wrapper
    (`unwrapped_model`: PEFT, ``torch.compile``, DDP / FSDP), whose own forward takes
    ``**kwargs`` and passes them on: the wrapper's signature would say no for every model."""
    try:
        params = inspect.signature(unwrapped_model(model).forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins / C extensions
        return True
    return name in params


_PARALLEL_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def unwrapped_model(model):
    """The model inside PEFT (``get_base_model()``), ``torch.compile`` (``_orig_mod``) and DDP /
    DataParallel / FSDP (``module``) wrappers, however nested; ``model`` itself when unwrapped."""
    for _ in range(16):
        inner = getattr(model, "_orig_mod", None)
        if inner is None and callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
        if inner is None and type(model).__name__ in _PARALLEL_WRAPPERS:
            inner = getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner
    return model


def mm_token_type_ids_kwargs() -> dict:
    """Processor-call kwargs that make a Qwen-VL processor return ``mm_token_type_ids``: none
    on 5.x (always returned), ``return_mm_token_type_ids=True`` on 4.x (off by default)."""
    return {} if is_transformers_5() else {"return_mm_token_type_ids": True}


def hf_get_rope_index(model, input_ids, mm_token_type_ids=None, *, image_grid_thw=None, video_grid_thw=None,
                      second_per_grid_ts=None, attention_mask=None):
    """transformers' own ``get_rope_index`` of a Qwen-VL model (or its inner model), called the
    way the installed line takes it. Returns (position_ids int64 [3, B, L], deltas [B, 1]).

    5.x: ``get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=, video_grid_thw=,
    [second_per_grid_ts=,] attention_mask=)`` - blocks found from the token types. 4.x:
    ``get_rope_index(input_ids, image_grid_thw, video_grid_thw, [second_per_grid_ts,]
    attention_mask)`` - blocks found from ``<|vision_start|>`` followed by a pad token, so
    ``input_ids`` must be real ids (``mm_token_type_ids`` is not used there).
    """
    inner = model if hasattr(model, "get_rope_index") else model.model
    kw = dict(image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw, attention_mask=attention_mask)
    if "second_per_grid_ts" in inspect.signature(inner.get_rope_index).parameters:
        kw["second_per_grid_ts"] = second_per_grid_ts
    if is_transformers_5():
        return inner.get_rope_index(input_ids, mm_token_type_ids, **kw)
    return inner.get_rope_index(input_ids, **kw)
