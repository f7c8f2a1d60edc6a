"""The typed records of the VLM-judge reward stage.

Flow of one frame::

    image --frames.py--> (data URL, sha256) --client.py--> Reply (raw text, per question)
          --parsing.py--> ActionVerdict / ProgressEstimate  (one Answer each: FrameAnswers)
          --arithmetic.py--> RewardParts --> JudgeResult  (what a dataset row / env step gets)

An answer that could not be obtained or parsed is kept, never raised: ``Answer.valid`` is
False, ``Answer.raw`` holds whatever text came back and ``Answer.error`` says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional, Union


@dataclass(frozen=True)
class Reply:
    """One chat-completion call as the transport saw it (after retries).

    Attributes:
        text: ``str`` the assistant message content; ``""`` when none came back.
        error: ``str | None`` why no usable reply came back (``"HTTP 400: ..."``,
            ``"timeout after 2 attempts"``); None on success.
        status: ``int | None`` the last HTTP status seen (None for transport errors).
        attempts: ``int`` HTTP requests sent for this call (1 + retries).
        latency_s: ``float`` wall time of the whole call, retries and backoff included.
        p_true: ``float | None`` P("true") / (P("true") + P("false")) at the token that
            carries the ``reasonable`` verdict, from the token log-probabilities (only when
            the client asked for logprobs and the server returned them).
        finish_reason: ``str | None`` the server's finish reason ("stop", "length", ...).
    """

    text: str = ""
    error: Optional[str] = None
    status: Optional[int] = None
    attempts: int = 0
    latency_s: float = 0.0
    p_true: Optional[float] = None
    finish_reason: Optional[str] = None


@dataclass(frozen=True)
class ActionVerdict:
    """Parsed answer to "is the chosen action primitive reasonable?".

    Attributes:
        reasonable: ``bool`` the verdict.
        confidence: ``float`` in [0, 1], as the model wrote it.
        reason: ``str`` the model's explanation ("" when it gave none).
        p_true: ``float | None`` probability of the verdict token "true" (see `Reply.p_true`).
    """

    reasonable: bool
    confidence: float
    reason: str = ""
    p_true: Optional[float] = None


@dataclass(frozen=True)
class ProgressEstimate:
    """Parsed answer to "how far has the task progressed?".

    Attributes:
        progress: ``float`` in [0, 1].
        stage: ``str`` the model's description of the current stage ("" when none).
        next_step: ``str`` what the model thinks should happen next ("" when none).
    """

    progress: float
    stage: str = ""
    next_step: str = ""


@dataclass(frozen=True)
class Answer:
    """One question about one frame: the parsed value (None when invalid) and the evidence.

    Attributes:
        value: ``ActionVerdict | ProgressEstimate | None``; None when ``valid`` is False.
        raw: ``str`` the text the server returned (kept also when it could not be parsed).
        error: ``str | None`` why the answer is invalid (transport or parse), else None.
        cached: ``bool`` served from the judge's cache (no request sent).
        latency_s: ``float`` wall time spent on this question (0.0 when cached).
        attempts: ``int`` HTTP requests sent for this question.
    """

    value: Optional[Union[ActionVerdict, ProgressEstimate]] = None
    raw: str = ""
    error: Optional[str] = None
    cached: bool = False
    latency_s: float = 0.0
    attempts: int = 0

    @property
    def valid(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class FrameAnswers:
    """Both questions about one frame, before any reward arithmetic.

    Attributes:
        action: `Answer` whose value is an `ActionVerdict`.
        progress: `Answer` whose value is a `ProgressEstimate`.
        latency_s: ``float`` wall time for the frame (both questions, sequential).
    """

    action: Answer
    progress: Answer
    latency_s: float

    @property
    def valid(self) -> bool:
        return self.action.valid and self.progress.valid


@dataclass(frozen=True)
class RewardParts:
    """The reward arithmetic of one frame (see `mmpipe.reward.arithmetic.combine`).

    Attributes:
        binary: ``float`` the action term (+c, 0 or -c by mode; 0 when the action answer is
            invalid).
        progress_term: ``float`` the progress term (clipped delta or potential difference; 0
            on an episode's first evaluated frame or when the progress answer is invalid).
        vlm_reward: ``float`` ``binary_weight * binary + progress_weight * progress_term``.
        reward: ``float`` ``vlm_reward_scale * vlm_reward``: what is added to the env reward.
        confidence: ``float | None`` the confidence c used by the action term.
        baseline: ``float | None`` the progress the next frame of the episode is compared to
            (this frame's progress when valid, else the previous baseline).
    """

    binary: float = 0.0
    progress_term: float = 0.0
    vlm_reward: float = 0.0
    reward: float = 0.0
    confidence: Optional[float] = None
    baseline: Optional[float] = None


@dataclass(frozen=True)
class JudgeResult:
    """The judge's score of one frame: what a dataset row or an environment step receives.

    Attributes:
        reward: ``float`` scaled VLM reward to add to the environment reward
            (``parts.reward``); 0.0, the neutral value, for every invalid part.
        parts: `RewardParts` the arithmetic behind ``reward``.
        action: `Answer` (value `ActionVerdict` or None).
        progress: `Answer` (value `ProgressEstimate` or None).
        valid: ``bool`` both answers were obtained and parsed.
        latency_s: ``float`` wall time for the frame.
        cache_hit: ``bool`` both answers came from the cache.
    """

    reward: float
    parts: RewardParts
    action: Answer
    progress: Answer
    valid: bool
    latency_s: float
    cache_hit: bool

    @property
    def error(self) -> Optional[str]:
        """Both answers' errors joined ("action: ...; progress: ..."), None when valid."""
        errs = [f"{k}: {a.error}" for k, a in (("action", self.action), ("progress", self.progress)) if a.error]
        return "; ".join(errs) or None

    def to_row(self) -> dict[str, Any]:
        """`to_dict` with no None: what the dataset stage stores.

        Arrow fixes a column's type from the first batch written, so a first batch of
        failures must not write all-None columns: a value that belongs to an invalid answer
        is stored as NaN (numbers), "" (text) or False (``reasonable``); ``action_valid`` /
        ``progress_valid`` say which answers are real.
        """
        return {k: (RESULT_FILL[k] if v is None else v) for k, v in self.to_dict().items()}

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON-friendly view (what the CLI prints); None where an answer is invalid."""
        act: Optional[ActionVerdict] = self.action.value
        prog: Optional[ProgressEstimate] = self.progress.value
        return {
            "reward": self.reward,
            "valid": self.valid,
            "action_valid": self.action.valid,
            "progress_valid": self.progress.valid,
            "reasonable": act.reasonable if act else None,
            "confidence": act.confidence if act else None,
            "reason": act.reason if act else None,
            "p_true": act.p_true if act else None,
            "progress": prog.progress if prog else None,
            "stage": prog.stage if prog else None,
            "next_step": prog.next_step if prog else None,
            **{f"part_{k}": v for k, v in asdict(self.parts).items()},
            "action_raw": self.action.raw,
            "progress_raw": self.progress.raw,
            "error": self.error,
            "latency_s": self.latency_s,
            "cache_hit": self.cache_hit,
        }


@dataclass(frozen=True)
class StepScore:
    """A judged environment step, tagged with the transition it belongs to.

    In async mode a score arrives in the ``info`` of a *later* step; ``episode`` and
    ``step`` say which transition to add ``result.reward`` to.

    Attributes:
        episode: ``int`` episode index (0 for the first ``reset``).
        step: ``int`` 0-based index of the transition within its episode.
        global_step: ``int`` 0-based index over all episodes.
        env_reward: ``float`` the environment's own reward for that transition.
        result: `JudgeResult`.
    """

    episode: int
    step: int
    global_step: int
    env_reward: float
    result: JudgeResult

    @property
    def reward(self) -> float:
        """The scaled VLM reward for this transition."""
        return self.result.reward

    @property
    def total(self) -> float:
        """``env_reward + reward``: the combined reward of this transition."""
        return self.env_reward + self.result.reward


_NAN = float("nan")

# The keys of `JudgeResult.to_dict` (the columns the dataset stage writes, unprefixed) and
# the value `JudgeResult.to_row` stores for None.
RESULT_FILL: dict[str, Any] = {
    "reward": 0.0, "valid": False, "action_valid": False, "progress_valid": False,
    "reasonable": False, "confidence": _NAN, "reason": "", "p_true": _NAN,
    "progress": _NAN, "stage": "", "next_step": "",
    "part_binary": 0.0, "part_progress_term": 0.0, "part_vlm_reward": 0.0, "part_reward": 0.0,
    "part_confidence": _NAN, "part_baseline": _NAN,
    "action_raw": "", "progress_raw": "", "error": "", "latency_s": 0.0, "cache_hit": False,
}
RESULT_KEYS = tuple(RESULT_FILL)
