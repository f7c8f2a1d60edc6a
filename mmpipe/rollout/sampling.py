"""One ``model.generate`` call turned into `Generation` s: what `TransformersEngine` does for
every family once its batch's model inputs are built (`transformers_engine`)::

    gens = sample(model, kw, params, stop=(eos_id,), pad_id=pad, suppress=banned, num_prompts=B)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.records.generation import Completion, Generation, SamplingParams

__all__ = ["sample"]


def sample(model, kw: dict, params: SamplingParams, *, stop: Sequence[int], pad_id: int,
           suppress: Sequence[int], num_prompts: int) -> list[Generation]:
    """``model.generate(**kw)`` under ``params`` -> one `Generation` per prompt.

    ``kw``: the model inputs of ``num_prompts * params.n`` rows, each prompt's ``n`` copies next
    to each other (``input_ids`` [B*n, P], ...). ``stop``: ids that end a completion (kept as its
    last token); ``suppress``: ids never sampled (``[]``: none). A completion holds the
    generated ids up to and including the first stop id, and with ``params.logprobs`` each
    sampled token's log-probability under the raw logits (float), what teacher forcing computes.
    """
    import torch

    gen_kw = dict(max_new_tokens=params.max_new_tokens, eos_token_id=list(stop), pad_token_id=pad_id,
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
        hits = np.flatnonzero(np.isin(ids, stops))
        end = int(hits[0]) + 1 if len(hits) else len(ids)
        gens[k // params.n].completions.append(Completion(
            token_ids=[int(x) for x in ids[:end]], logprobs=None if lp is None else [float(x) for x in lp[k, :end]],
            finish_reason="stop" if len(hits) else "length", stop_reason=int(ids[end - 1]) if len(hits) else None))
    return gens
