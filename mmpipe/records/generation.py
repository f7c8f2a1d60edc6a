"""Engine-neutral generation records: what any rollout engine returns for a batch.

Every engine (transformers ``generate``, ``vllm.LLM``) is adapted to return, per prompt,
a `Generation` holding ``n`` `Completion` s. Downstream stages (unbatching rollout results,
multi-turn appends, data packers) only speak these.

    >>> c = Completion(token_ids=[11, 12, 555], logprobs=[-0.1, -2.0, -0.3], finish_reason="stop")
    >>> Generation(prompt_index=0, completions=[c]).n
    1
"""

from __future__ import annotations

import warnings
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
        token_ids_exact: False when the engine never saw the sampled ids and rebuilt them by
            re-tokenizing the returned text (a server that returns text only): such ids may
            differ from the sampled ones, and their logprobs are None.
    """

    token_ids: list[int]
    logprobs: Optional[list[float]] = None
    finish_reason: str = "stop"
    stop_reason: Optional[Union[int, str]] = None
    token_ids_exact: bool = True


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
    """Engine-neutral sampling settings (translated by each engine).

    ``temperature`` 0 is greedy (the default). ``n > 1`` with temperature 0 gives ``n``
    identical completions (a GRPO group with zero variance, hence zero advantage): it is
    allowed, for tests that want repeated greedy rows, but warns (`UserWarning`) naming the
    fix, ``temperature=1.0``. (vLLM itself refuses ``n > 1`` when greedy.)

    ``allow_vision_tokens``: False (default) makes every engine ban the family's vision special
    tokens (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``,
    `mmpipe.records.vision_tokens.VisionTokens`) at sampling: a response holding one breaks
    the image-token count once it is trained on. The reported logprobs stay those of the
    unconstrained model (what a teacher-forced forward computes). True samples them freely.
    """

    max_new_tokens: int = 64
    n: int = 1
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = True
    allow_vision_tokens: bool = False

    def __post_init__(self):
        if self.n > 1 and self.temperature <= 0:
            warnings.warn(
                f"SamplingParams(n={self.n}, temperature={self.temperature}) samples greedily: the {self.n} "
                "completions of a prompt are identical (zero variance in a GRPO group); pass temperature=1.0 "
                "(or n=1)", UserWarning, stacklevel=3,
            )


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates continuations for a batch of encoded prompts; the model sees the images."""

    def generate(self, rows: Sequence, params: SamplingParams) -> list[Generation]:
        """rows: prompt `MultiModalInputs` (or stored dicts); one `Generation` per row, in order."""
        ...


@runtime_checkable
class AsyncRolloutEngine(Protocol):
    """`RolloutEngine` whose ``generate`` is a coroutine (``mmpipe.rollout.async_engine``,
    ``mmpipe.rollout.openai_engine``): many callers (agent trajectories) await it at once and
    the engine bounds how many model calls run together."""

    async def generate(self, rows: Sequence, params: SamplingParams) -> list[Generation]:
        """rows: prompt `MultiModalInputs` (or stored dicts); one `Generation` per row, in order."""
        ...
