"""Rollout results -> per-sample rows: prompt, response, logprobs, finish reason, positions.

``unbatch_rollout(prompts, generations)`` gives one `RolloutSample` per completion
(prompt-major: prompt 0's n samples, then prompt 1's ...). Samples of one prompt share the
prompt record itself, so GRPO groups never copy pixel arrays. ``sample.to_row()`` is the
training row (prompt + response, labels on the response only, M-RoPE positions continued
over the response) that collate / the data packers turn into a policy batch.

Positions of generated tokens follow the rule the rollout engine used: generated token ``k``
sits at ``last_prompt_pos + 1 + k`` on all three axes (``= n_prompt + rope_delta + k``),
which equals recomputing the M-RoPE rule over prompt + response with the response as text.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.encoding.vision_tokens import VisionTokens, check_policy
from mmpipe.errors import ArgumentError
from mmpipe.families import tiled_family_of
from mmpipe.records.generation import Generation
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.kinds import is_tiled_row


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
            see `mmpipe.encoding.vision_tokens`.
    """
    if is_tiled_row(prompts[0] if isinstance(prompts, (list, tuple)) and prompts else prompts) \
            or (processor is not None and tiled_family_of(processor) is not None):
        raise ArgumentError("unbatch_rollout takes rows of the patch-grid families; for tiled-family prompts (Gemma 3, "
                            "InternVL, LLaVA-OneVision) use mmpipe.rollout.tiled_generate.tiled_rollout_rows(prompts, "
                            "generations, processor)")
    if processor is not None:
        vt = VisionTokens.from_processor(processor, policy=on_vision_token)
    elif check_policy(on_vision_token) == "mask":
        raise ArgumentError("unbatch_rollout(on_vision_token='mask') needs processor=: the replacement is the "
                            "tokenizer's pad id")
    else:
        vt = None
    if isinstance(prompts, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        rows = unbatch(prompts)
    else:
        rows = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(prompts)]
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
