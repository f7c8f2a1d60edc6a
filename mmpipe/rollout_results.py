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

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from .generation import Generation
from .records import IGNORE_INDEX, BatchedMultiModalInputs, MultiModalInputs


@dataclass(eq=False)
class RolloutSample:
    """One sampled completion of one prompt.

    Attributes:
        prompt:         the prompt row (shared, not copied, by the samples of one prompt).
        prompt_index:   index of the prompt in the rollout batch.
        sample_index:   0..n-1 within the prompt's group.
        response_ids:   int64 [R] generated ids (EOS included when emitted).
        logprobs:       float32 [R] rollout-time logprobs of the sampled tokens, or None.
        finish_reason:  "stop", "length" or "abort".
        stop_reason:    the stop token/string, if any.
    """

    prompt: MultiModalInputs
    prompt_index: int
    sample_index: int
    response_ids: np.ndarray
    logprobs: Optional[np.ndarray]
    finish_reason: str
    stop_reason: object = None

    @property
    def prompt_ids(self) -> np.ndarray:
        """int64 [P] the prompt's ids, unpadded, placeholders expanded."""
        return self.prompt.input_ids

    @property
    def response_mask(self) -> np.ndarray:
        """int64 [R]: 1 on every generated token (the completion is already cut at EOS)."""
        return np.ones(len(self.response_ids), dtype=np.int64)

    @property
    def response_positions(self) -> np.ndarray:
        """int64 [3, R]: generated token k at ``max(prompt positions) + 1 + k`` on all axes."""
        start = int(self.prompt.position_ids.max()) + 1 if self.prompt.num_tokens else 0
        pos = start + np.arange(len(self.response_ids), dtype=np.int64)
        return np.broadcast_to(pos, (3, len(pos))).copy()

    @property
    def position_ids(self) -> np.ndarray:
        """int64 [3, P+R] M-RoPE positions of prompt + response."""
        return np.concatenate([self.prompt.position_ids, self.response_positions], axis=1)

    def to_row(self) -> MultiModalInputs:
        """The training row: prompt + response, labels = response ids (-100 on the prompt).

        Pixel arrays are the prompt's own objects (no copy)."""
        p, r = self.prompt, self.response_ids.astype(np.int64)
        R = len(r)
        return replace(
            p,
            input_ids=np.concatenate([p.input_ids, r]),
            attention_mask=np.ones(p.num_tokens + R, dtype=np.int64),
            mm_token_type_ids=np.concatenate([p.mm_token_type_ids, np.zeros(R, np.int64)]),
            position_ids=self.position_ids,
            rope_delta=p.rope_delta,  # each response token advances positions by exactly 1
            labels=np.concatenate([np.full(p.num_tokens, IGNORE_INDEX, np.int64), r]),
        )

    def __repr__(self) -> str:
        return (
            f"RolloutSample(prompt={self.prompt_index}.{self.sample_index}, prompt_tokens={self.prompt.num_tokens}, "
            f"images={self.prompt.num_images}, response_tokens={len(self.response_ids)}, finish={self.finish_reason!r})"
        )

    def _repr_html_(self) -> str:
        """Jupyter display: prompt images, prompt + response tokens (`mmpipe.display.rollout_html`)."""
        from .display import rollout_html

        return rollout_html(self)

    def describe(self, *, tokenizer=None) -> str:
        """Plain-text description for terminals (`mmpipe.display.describe`)."""
        from .display import describe

        return describe(self, tokenizer=tokenizer)


def unbatch_rollout(prompts, generations: Sequence[Generation]) -> list[RolloutSample]:
    """Engine outputs for a batch -> one `RolloutSample` per completion, prompt-major.

    Args:
        prompts: the prompt rows (``MultiModalInputs`` / stored dicts) or the
            `BatchedMultiModalInputs` they were collated into (unbatched here).
        generations: one `Generation` per prompt, ``generations[i].prompt_index == i``.
    """
    if isinstance(prompts, BatchedMultiModalInputs):
        from .unbatch import unbatch

        rows = unbatch(prompts)
    else:
        rows = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(prompts)]
    if len(generations) != len(rows):
        raise ValueError(
            f"{len(generations)} generations for {len(rows)} prompts; trim data-parallel padding rows "
            "first (mmpipe.rollout_inputs.trim) and keep one Generation per prompt"
        )
    out = []
    for i, (row, gen) in enumerate(zip(rows, generations)):
        if gen.prompt_index != i:
            raise ValueError(f"generation {i} is for prompt {gen.prompt_index}; generations must be in prompt order")
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
                )
            )
    return out
