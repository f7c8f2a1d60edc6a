"""Engine-neutral generation records: what any rollout engine returns for a batch.

Every engine (transformers ``generate``, ``vllm.LLM``) is adapted to return, per prompt,
a `Generation` holding ``n`` `Completion` s. Downstream stages (unbatching rollout results,
multi-turn appends, data packers) only speak these.

    >>> c = Completion(token_ids=[11, 12, 555], logprobs=[-0.1, -2.0, -0.3], finish_reason="stop")
    >>> Generation(prompt_index=0, completions=[c]).n
    1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, Union, runtime_checkable

FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class Completion:
    """One sampled continuation.

    Attributes:
        token_ids: int ids [R], generated only (no prompt, no padding), EOS/stop token included when
            the engine emitted it.
        logprobs: float [R] per generated token, the log-probability of the sampled token under
            the sampling distribution's logits (before temperature/top-p processing unless the
            engine says otherwise); None when not requested.
        finish_reason: "stop" (EOS or a stop string/token), "length" (max tokens), "abort".
        stop_reason: the stop token id (int) or stop string that ended it, or None.
    """

    token_ids: list[int]
    logprobs: Optional[list[float]] = None
    finish_reason: str = "stop"
    stop_reason: Optional[Union[int, str]] = None


@dataclass
class Generation:
    """All completions for one prompt (``n > 1`` for GRPO-style groups)."""

    prompt_index: int
    completions: list[Completion] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.completions)


@dataclass(frozen=True)
class SamplingParams:
    """Engine-neutral sampling settings (translated by each engine)."""

    max_new_tokens: int = 64
    n: int = 1
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = True


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates continuations for a batch of encoded prompts; the model sees the images."""

    def generate(self, rows: Sequence, params: SamplingParams) -> list[Generation]:
        """rows: prompt `MultiModalInputs` (or stored dicts); one `Generation` per row, in order."""
        ...
