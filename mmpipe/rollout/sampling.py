"""One ``model.generate`` call turned into `Generation` s: what `TransformersEngine` does for
every family once its batch's model inputs are built (`transformers_engine`)::

    gens = sample(model, kw, params, stop=(eos_id,), pad_id=pad, suppress=banned, num_prompts=B)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError, is_finite_number, is_integer
from mmpipe.records.generation import Completion, Generation, SamplingParams

__all__ = ["check_params", "sample"]


def check_params(params) -> None:
    """`ArgumentError` unless ``params`` is a `SamplingParams` every engine can run, the same
    rule for each (called by every engine's ``generate``):

    - ``n`` and ``max_new_tokens``: ints >= 1 (``n=0`` would surface as an empty-collate error);
    - ``temperature``: a finite number >= 0 (0 = greedy); a negative one was sampled greedily
      by transformers without a word while vLLM refuses it;
    - ``top_p``: in (0, 1]; ``top_p=0`` kept no token in vLLM and was greedy in transformers;
    - ``top_k``: an int >= 0 (0 = all tokens); ``seed``: None or an int;
    - ``stop_token_ids``: ints >= 0 (a stop string is not supported here).
    """
    if not isinstance(params, SamplingParams):
        raise ArgumentError(f"params must be a mmpipe.records.SamplingParams, got {type(params).__name__}: "
                            "SamplingParams(max_new_tokens=..., n=..., temperature=...)")
    bad = [f"{k}={getattr(params, k)!r} (an int >= 1)" for k in ("n", "max_new_tokens")
           if not is_integer(getattr(params, k)) or getattr(params, k) < 1]
    if not is_finite_number(params.temperature) or params.temperature < 0:
        bad.append(f"temperature={params.temperature!r} (a finite number >= 0; 0 samples greedily)")
    if not is_finite_number(params.top_p) or not 0 < params.top_p <= 1:
        bad.append(f"top_p={params.top_p!r} (in (0, 1]; 1.0 keeps every token)")
    if not is_integer(params.top_k) or params.top_k < 0:
        bad.append(f"top_k={params.top_k!r} (an int >= 0; 0 keeps every token)")
    if params.seed is not None and not is_integer(params.seed):
        bad.append(f"seed={params.seed!r} (None or an int)")
    stops = params.stop_token_ids
    if isinstance(stops, (str, bytes)) or not all(is_integer(t) and t >= 0 for t in stops):
        bad.append(f"stop_token_ids={stops!r} (token ids, ints >= 0; a stop string is not supported here)")
    if bad:
        raise ArgumentError(f"SamplingParams the engine cannot run: {', '.join(bad)}; fix these values, e.g. "
                            "SamplingParams(max_new_tokens=256, n=8, temperature=1.0)")


def sample(model, kw: dict, params: SamplingParams, *, stop: Sequence[int], pad_id: int,
           suppress: Sequence[int], num_prompts: int) -> list[Generation]:
    """``model.generate(**kw)`` under ``params`` -> one `Generation` per prompt.

    ``kw``: the model inputs of ``num_prompts * params.n`` rows, each prompt's ``n`` copies next
    to each other (``input_ids`` [B*n, P], ...). ``stop``: ids that end a completion (kept as its
    last token); ``suppress``: ids never sampled (``[]``: none). A completion holds the
    generated ids up to and including the first stop id, and with ``params.logprobs`` each
    sampled token's log-probability under the raw logits (float), what teacher forcing computes.
    A completion ends where its prompt + response fill the model's context
    (``max_position_embeddings``, finish reason "length"), as vLLM ends it at ``max_model_len``;
    a prompt that fills it alone raises `InputError` (`_room`).
    """
    import torch

    lens = kw["attention_mask"].sum(-1).cpu().numpy() if "attention_mask" in kw else \
        np.full(kw["input_ids"].shape[0], kw["input_ids"].shape[1])
    room = _room(model, lens, params.n)  # per row [B*n]: tokens left in the model's context
    gen_kw = dict(max_new_tokens=int(min(params.max_new_tokens, room.max())), eos_token_id=list(stop),
                  pad_token_id=pad_id,
                  return_dict_in_generate=True, output_logits=params.logprobs)
    if suppress:
        gen_kw["suppress_tokens"] = list(suppress)
    if params.temperature > 0:
        gen_kw.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
    else:
        gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if params.seed is not None:
        torch.manual_seed(params.seed)
    with torch.no_grad():
        out = model.generate(**kw, **gen_kw)
    P = kw["input_ids"].shape[1]
    new = out.sequences[:, P:].cpu().numpy()
    lp = None
    if params.logprobs:
        logits = torch.stack(out.logits, dim=1).float()  # [B*n, T, V]
        lp = torch.log_softmax(logits, -1).gather(-1, out.sequences[:, P:, None].to(logits.device))[..., 0].cpu().numpy()
    gens = [Generation(prompt_index=i) for i in range(num_prompts)]
    stops = list(stop)
    for k, ids in enumerate(new):
        ids = ids[:room[k]]  # what vLLM does at max_model_len: the completion ends there ("length")
        hits = np.flatnonzero(np.isin(ids, stops))
        end = int(hits[0]) + 1 if len(hits) else len(ids)
        gens[k // params.n].completions.append(Completion(
            token_ids=[int(x) for x in ids[:end]], logprobs=None if lp is None else [float(x) for x in lp[k, :end]],
            finish_reason="stop" if len(hits) else "length", stop_reason=int(ids[end - 1]) if len(hits) else None))
    return gens


def model_context(model) -> "int | None":
    """The model's context in tokens: ``max_position_embeddings`` of its text config (or its own);
    None when it names none or its RoPE is scaled past it (a ``factor`` > 1: YaRN and the like,
    whose context vLLM stretches by that factor)."""
    cfg = getattr(model, "config", None)
    for c in (getattr(cfg, "text_config", None), cfg):
        n = getattr(c, "max_position_embeddings", None)
        if is_integer(n) and n > 0:
            rope = getattr(c, "rope_scaling", None) or getattr(c, "rope_parameters", None) or {}
            factor = rope.get("factor") if isinstance(rope, dict) else None
            return None if is_finite_number(factor) and factor > 1 else int(n)
    return None


def engine_context(engine) -> "int | None":
    """The context in tokens of the model behind a rollout ``engine`` (or behind the engine it
    wraps, ``.engine`` / ``._sync``: `ThreadedEngine`, `AsyncVLLMEngine`): a transformers model's
    (`model_context`), vLLM's ``max_model_len``; None where it names none (an HTTP server)."""
    for _ in range(4):
        if getattr(engine, "model", None) is not None and hasattr(engine.model, "config"):
            return model_context(engine.model)
        llm = getattr(engine, "llm", None)
        n = getattr(getattr(getattr(llm, "llm_engine", llm), "model_config", None), "max_model_len", None)
        if is_integer(n) and n > 0:
            return int(n)
        engine = getattr(engine, "engine", None) or getattr(engine, "_sync", None)
    return None


def _room(model, lens: np.ndarray, n: int) -> np.ndarray:
    """Tokens each row (prompt lengths int [B*n]) may still generate within the model's context
    (`model_context`; unbounded without one): int64 [B*n]. A prompt that leaves no room: `InputError`
    naming the prompt (``generate`` would silently run past the positions the model knows, where
    vLLM refuses the prompt)."""
    ctx = model_context(model)
    lens = np.asarray(lens, dtype=np.int64)
    if ctx is None:
        return np.full(len(lens), np.iinfo(np.int64).max // 2, dtype=np.int64)
    full = np.flatnonzero(lens >= ctx)
    if len(full):
        k = int(full[0])
        raise InputError("a rollout prompt", row=k // n, column="input_ids", stage="rollout",
                         expected=f"fewer tokens than the model's context ({ctx}, max_position_embeddings)",
                         found=f"{int(lens[k])} prompt tokens (images expanded): no room for a response",
                         fix="filter or shorten long prompts (encode with max_length below the context), or "
                             "end the multi-turn conversation before it fills the context")
    return ctx - lens
