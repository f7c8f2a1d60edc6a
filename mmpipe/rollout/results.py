"""Rollout results -> per-sample rows: prompt, response, logprobs, finish reason, positions.

``unbatch_rollout(prompts, generations)`` gives one `RolloutSample` per completion
(prompt-major: prompt 0's n samples, then prompt 1's ...). Samples of one prompt share the
prompt record itself, so GRPO groups never copy pixel arrays. ``sample.to_row()`` is the
training row (prompt + response, labels on the response only, M-RoPE positions continued
over the response) that collate / the data packers turn into a policy batch.

Positions of generated tokens follow the rule the rollout engine used: generated token ``k``
sits at ``last_prompt_pos + 1 + k`` on every position row (``= n_prompt + rope_delta + k``),
which equals recomputing the M-RoPE rule over prompt + response with the response as text,
and is ``n_prompt + k`` for the 1-D families (Gemma 3, InternVL, LLaVA-OneVision). Every family
that rolls out comes here (`mmpipe.rollout.support`: the generic path's rows are refused).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError, is_integer
from mmpipe.records.generation import Generation
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.vision_tokens import VisionTokens, check_policy
from mmpipe.rollout.inputs import as_rows
from mmpipe.rollout.support import (check_no_early_stop, check_processor, check_row_families, check_rows, stop_ids,
                                    token_ids)

__all__ = ["unbatch_rollout", "rollout_rows"]


def unbatch_rollout(prompts, generations: Sequence[Generation], *, processor=None,
                    on_vision_token: str = "raise") -> list[RolloutSample]:
    """Engine outputs for a batch -> one `RolloutSample` per completion, prompt-major.

    Args:
        prompts: the prompt rows (``MultiModalInputs`` / stored dicts) or the
            `BatchedMultiModalInputs` they were collated into (unbatched here).
        generations: one `Generation` per prompt, ``generations[i].prompt_index == i``.
        processor: the processor (or tokenizer) the prompts were encoded with: its vision
            special tokens are what ``sample.to_row()`` looks for in each response. Without
            it ``to_row`` knows only the ids the prompt shows (its image pads and block borders).
        on_vision_token: ``"raise"`` (``to_row`` refuses a response holding a vision token,
            naming prompt, sample, position and token) or ``"mask"`` (needs ``processor``:
            each such token becomes the pad id with label -100, and ``response_mask`` 0);
            see `mmpipe.records.vision_tokens`.
    """
    rows = as_rows(prompts)
    check_rows(rows, "samples")
    stops = frozenset()
    if processor is not None:  # rows of another model would get that model's vision tokens checked
        check_row_families(rows, "samples", processor)
        fam = check_processor(processor, "samples")
        vt = VisionTokens.from_processor(processor, family=fam, policy=on_vision_token)
        stops = stop_ids(processor, fam)
    elif check_policy(on_vision_token) == "mask":
        raise ArgumentError("unbatch_rollout(on_vision_token='mask') needs processor=: the replacement is the "
                            "tokenizer's pad id")
    else:
        vt = None
    _check_generations(generations, len(rows))
    out = []
    for i, (row, gen) in enumerate(zip(rows, generations)):
        for j, c in enumerate(gen.completions):
            ids, lps = _completion_arrays(c, i, j, stops)
            out.append(
                RolloutSample(
                    prompt=row,
                    prompt_index=i,
                    sample_index=j,
                    response_ids=ids,
                    logprobs=lps,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    vision_tokens=vt,
                )
            )
    return out


def _check_generations(generations, n_prompts: int) -> None:
    """`ArgumentError` unless ``generations`` holds one `Generation` per prompt, in prompt order."""
    if isinstance(generations, (str, bytes)) or not hasattr(generations, "__len__"):
        raise ArgumentError(f"generations must be a list of Generation (one per prompt, as engine.generate "
                            f"returns), got {type(generations).__name__}")
    if len(generations) != n_prompts:
        raise ArgumentError(
            f"{len(generations)} generations for {n_prompts} prompts; unbatch_rollout takes one Generation per "
            "prompt: trim data-parallel padding rows first (mmpipe.rollout.data_parallel.trim) and keep one "
            "Generation per prompt"
        )
    for i, gen in enumerate(generations):
        if not (hasattr(gen, "prompt_index") and hasattr(gen, "completions")):
            raise ArgumentError(f"generation {i} is a {type(gen).__name__}, not a Generation (prompt_index, "
                                "completions); build one with mmpipe.records.generation.Generation / Completion")
        if gen.prompt_index != i:
            raise ArgumentError(
                f"generation {i} is for prompt {gen.prompt_index}; generations must be in prompt order "
                "(generations[i].prompt_index == i)"
            )


def _completion_arrays(c, i: int, j: int, stops=frozenset()) -> tuple[np.ndarray, "np.ndarray | None"]:
    """Completion ``j`` of prompt ``i`` -> (ids int64 [R], logprobs float32 [R] or None).

    Refused (`InputError`, stage "rollout"): ids that are not integers >= 0 (`token_ids`:
    ``np.asarray(..., int64)`` would silently floor 1.7 to 1 and keep -5); a stop id (``stops``,
    the processor's `stop_ids`, and the completion's own int ``stop_reason``) before the last
    token (`check_no_early_stop`: padding or text past the end would be trained on); logprobs
    of another length than the ids (column "logprobs": every per-token loss term would pair a
    token with another token's logprob) or that are no log-probabilities (`_logprob_array`)."""
    where = f"prompt {i}, sample {j}"
    if not hasattr(c, "token_ids"):
        raise ArgumentError(f"{where}: a completion must be a Completion (token_ids, logprobs, finish_reason), "
                            f"got {type(c).__name__}")
    ids = token_ids(c.token_ids, where=where, row=i)
    check_no_early_stop(ids, stops | {int(c.stop_reason)} if is_integer(c.stop_reason) else stops, where=where, row=i)
    if c.logprobs is None:
        return ids, None
    lps = _logprob_array(c.logprobs, where, i)
    if len(lps) != len(ids):
        raise InputError("a completion's logprobs", where=where, row=i, column="logprobs", stage="rollout",
                         expected=f"one logprob per token id ({len(ids)})", found=f"{len(lps)} logprobs",
                         fix="return the logprob of each sampled token, cut where the token ids are cut")
    return ids, lps


# a sampled token's log-probability is <= 0; float rounding of log_softmax stays far below this
_LOGPROB_SLACK = 1e-3


def _logprob_array(raw, where: str, i: int) -> np.ndarray:
    """A completion's logprobs -> float32 [R]. Refused (`InputError`, column "logprobs"): values
    that are not numbers (vLLM's per-position ``{token_id: Logprob}`` dicts: take the sampled
    token's ``.logprob``), NaN or infinite ones (one poisons every importance ratio of the batch),
    and values above 0 (probabilities or logits, not log-probabilities). A torch tensor is taken on
    any device and in any float dtype (a bf16 model's bfloat16 logprobs: numpy has no such dtype)."""
    if hasattr(raw, "detach") and hasattr(raw, "float"):  # torch: bf16 and GPU tensors do not convert to numpy
        raw = raw.detach().cpu().float()
    try:
        lps = np.asarray(raw, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as e:
        first = next(iter(raw), None) if hasattr(raw, "__iter__") else raw
        raise InputError("a completion's logprobs", where=where, row=i, column="logprobs", stage="rollout",
                         expected="one float per sampled token (its log-probability)",
                         found=f"{type(first).__name__} values ({str(first)[:60]}): {e}",
                         fix="pass the sampled token's logprob at each position (vLLM: "
                             "out.logprobs[k][out.token_ids[k]].logprob)") from None
    bad = np.flatnonzero(~np.isfinite(lps) | (lps > _LOGPROB_SLACK))
    if len(bad):
        k = int(bad[0])
        raise InputError("a completion's logprobs", where=where, row=i, column="logprobs", stage="rollout",
                         expected="finite log-probabilities <= 0", found=f"{lps[k]} at response position {k} "
                         f"({len(bad)} such of {len(lps)})",
                         fix="return log-probabilities of the sampled tokens (log_softmax of the logits, not "
                             "logits or probabilities); drop or re-sample responses whose logprob is NaN/inf")
    return lps


def rollout_rows(prompts, generations: Sequence[Generation], processor=None, *,
                 on_vision_token: str = "raise") -> list[MultiModalInputs]:
    """Prompt rows + their `Generation` s -> one training row per completion, prompt-major
    (`unbatch_rollout`, then ``sample.to_row()``): the prompt's tokens and images, then the
    response (``mm_token_type_ids`` 0, labels on the response only, positions continued). A
    response holding one of the family's vision tokens is refused (`PlaceholderError` naming
    prompt, sample and position) or masked, as ``on_vision_token`` says."""
    return [s.to_row() for s in unbatch_rollout(prompts, generations, processor=processor,
                                                on_vision_token=on_vision_token)]
