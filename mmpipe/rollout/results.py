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

from mmpipe.errors import ArgumentError
from mmpipe.records.generation import Generation
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.vision_tokens import VisionTokens, check_policy
from mmpipe.rollout.inputs import as_rows
from mmpipe.rollout.support import check_processor, check_rows

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
    if processor is not None:
        vt = VisionTokens.from_processor(processor, family=check_processor(processor, "samples"),
                                         policy=on_vision_token)
    elif check_policy(on_vision_token) == "mask":
        raise ArgumentError("unbatch_rollout(on_vision_token='mask') needs processor=: the replacement is the "
                            "tokenizer's pad id")
    else:
        vt = None
    if len(generations) != len(rows):
        raise ArgumentError(
            f"{len(generations)} generations for {len(rows)} prompts; unbatch_rollout takes one Generation per "
            "prompt: trim data-parallel padding rows first (mmpipe.rollout.data_parallel.trim) and keep one "
            "Generation per prompt"
        )
    out = []
    for i, (row, gen) in enumerate(zip(rows, generations)):
        if gen.prompt_index != i:
            raise ArgumentError(
                f"generation {i} is for prompt {gen.prompt_index}; generations must be in prompt order "
                "(generations[i].prompt_index == i)"
            )
        for j, c in enumerate(gen.completions):
            out.append(
                RolloutSample(
                    prompt=row,
                    prompt_index=i,
                    sample_index=j,
                    response_ids=np.asarray(c.token_ids, dtype=np.int64),
                    logprobs=np.asarray(c.logprobs, dtype=np.float32) if c.logprobs is not None else None,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    vision_tokens=vt,
                )
            )
    return out


def rollout_rows(prompts, generations: Sequence[Generation], processor=None, *,
                 on_vision_token: str = "raise") -> list[MultiModalInputs]:
    """Prompt rows + their `Generation` s -> one training row per completion, prompt-major
    (`unbatch_rollout`, then ``sample.to_row()``): the prompt's tokens and images, then the
    response (``mm_token_type_ids`` 0, labels on the response only, positions continued). A
    response holding one of the family's vision tokens is refused (`PlaceholderError` naming
    prompt, sample and position) or masked, as ``on_vision_token`` says."""
    return [s.to_row() for s in unbatch_rollout(prompts, generations, processor=processor,
                                                on_vision_token=on_vision_token)]
