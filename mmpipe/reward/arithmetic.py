"""Reward arithmetic: two parsed answers (+ the episode's previous progress) -> a reward.

With c the action confidence, p this frame's progress and p_prev the progress of the
episode's previous evaluated frame (d = p - p_prev)::

    mode           reasonable   unreasonable   progress term ("delta")   progress term ("potential")
    bonus_only         +c            0              max(0, d)              gamma * p - p_prev
    symmetric          +c           -c              d                      gamma * p - p_prev
    penalty_only        0           -c              min(0, d)              gamma * p - p_prev

    vlm_reward = binary_weight * action_term + progress_weight * progress_term
    reward     = vlm_reward_scale * vlm_reward          (added to the environment reward)

The action columns are the design's reward-mode table; the "delta" column is the design's
progress reward. "potential" is potential-based shaping (Ng et al., 1999) with potential
``Phi(s) = progress(s)``: it is never clipped, so over an episode the terms telescope
(with gamma = 1 they sum to exactly ``p_last - p_first``; with gamma < 1 the discounted
sum does) and a policy cannot farm reward by letting progress fall and rise again, which
the clipped "delta" of ``bonus_only`` pays for on every rise.

Neutral values: an invalid action answer gives action term 0; an invalid progress answer
gives progress term 0 and leaves the baseline unchanged (the next valid progress is
compared to the last valid one); the first evaluated frame of an episode (no p_prev) has
progress term 0. The neutral reward is 0.0 in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from mmpipe.errors import ArgumentError
from mmpipe.records.reward import ActionVerdict, ProgressEstimate, RewardParts

RewardMode = Literal["bonus_only", "symmetric", "penalty_only"]
MODES = ("bonus_only", "symmetric", "penalty_only")
PROGRESS_TERMS = ("delta", "potential")
CONFIDENCES = ("stated", "logprobs")


@dataclass(frozen=True)
class RewardConfig:
    """How answers become a reward (defaults are the design's).

    Args:
        mode: ``"bonus_only" | "symmetric" | "penalty_only"`` (table in the module doc).
        binary_weight: ``float`` weight of the action term.
        progress_weight: ``float`` weight of the progress term.
        vlm_reward_scale: ``float`` factor on the weighted sum; the result is what the
            environment reward gets added.
        progress_term: ``"delta"`` (design: clipped by mode) or ``"potential"``
            (``gamma * p - p_prev``, unclipped, cannot be farmed).
        gamma: ``float`` discount of the potential term (use the RL discount; applied once
            per evaluated frame, so with ``eval_frequency = k`` pass ``gamma**k``).
        confidence: ``"stated"`` (the model's "confidence" field) or ``"logprobs"`` (the
            probability of the verdict token, needs ``JudgeClient(logprobs=True)``; falls
            back to the stated confidence when the server returned no logprobs).
    """

    mode: RewardMode = "bonus_only"
    binary_weight: float = 0.5
    progress_weight: float = 0.5
    vlm_reward_scale: float = 0.5
    progress_term: Literal["delta", "potential"] = "delta"
    gamma: float = 0.99
    confidence: Literal["stated", "logprobs"] = "stated"

    def __post_init__(self) -> None:
        for name, allowed in (("mode", MODES), ("progress_term", PROGRESS_TERMS), ("confidence", CONFIDENCES)):
            if getattr(self, name) not in allowed:
                raise ArgumentError(f"RewardConfig.{name}: expected one of {allowed}, found {getattr(self, name)!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ArgumentError(f"RewardConfig.gamma: expected a discount in [0, 1], found {self.gamma}")


def confidence_of(verdict: ActionVerdict, config: RewardConfig) -> float:
    """The c of the table: stated confidence, or the probability of the given verdict."""
    if config.confidence == "logprobs" and verdict.p_true is not None:
        return verdict.p_true if verdict.reasonable else 1.0 - verdict.p_true
    return verdict.confidence


def action_term(verdict: Optional[ActionVerdict], config: RewardConfig) -> tuple[float, Optional[float]]:
    """(action term, c) for one verdict; (0.0, None) when the answer is invalid."""
    if verdict is None:
        return 0.0, None
    c = confidence_of(verdict, config)
    if verdict.reasonable:
        return (0.0 if config.mode == "penalty_only" else c), c
    return (0.0 if config.mode == "bonus_only" else -c), c


def progress_term(progress: Optional[float], prev_progress: Optional[float], config: RewardConfig) -> float:
    """The progress term; 0.0 when either progress is unknown (None or NaN: the judge's own
    ``{prefix}progress`` column stores an invalid progress as NaN, and users feed it back as
    the next frame's ``prev_progress``)."""
    if _unknown(progress) or _unknown(prev_progress):
        return 0.0
    if config.progress_term == "potential":
        return config.gamma * progress - prev_progress
    d = progress - prev_progress
    if config.mode == "bonus_only":
        return max(0.0, d)
    if config.mode == "penalty_only":
        return min(0.0, d)
    return d


def _unknown(value: Optional[float]) -> bool:
    """None or NaN: no progress known (NaN is how an invalid progress is stored in Arrow)."""
    return value is None or value != value  # NaN (also numpy's float32) is unequal to itself


def combine(
    action: Optional[ActionVerdict],
    progress: Optional[ProgressEstimate],
    prev_progress: Optional[float],
    config: RewardConfig,
) -> RewardParts:
    """Both parsed answers (None = invalid) + the episode's previous progress -> `RewardParts`.

    Example (bonus_only, weights 0.5/0.5, scale 0.5; c = 0.8, progress 0.4 -> 0.6)::

        >>> parts = combine(ActionVerdict(True, 0.8), ProgressEstimate(0.6), 0.4, RewardConfig())
        >>> round(parts.vlm_reward, 6), round(parts.reward, 6)   # 0.5*0.8 + 0.5*0.2, * 0.5
        (0.5, 0.25)
    """
    binary, c = action_term(action, config)
    p = progress.progress if progress is not None else None
    prev_progress = None if _unknown(prev_progress) else prev_progress
    term = progress_term(p, prev_progress, config)
    vlm = config.binary_weight * binary + config.progress_weight * term
    return RewardParts(
        binary=binary,
        progress_term=term,
        vlm_reward=vlm,
        reward=config.vlm_reward_scale * vlm,
        confidence=c,
        baseline=p if p is not None else prev_progress,
    )
