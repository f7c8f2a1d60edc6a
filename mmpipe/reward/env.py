"""`VLMRewardWrapper`: add the judge's reward to a gymnasium-style environment.

Duck-typed (no gymnasium import): the wrapped env needs ``reset(...)`` and ``step(action)``
returning gymnasium's 5-tuple ``(obs, reward, terminated, truncated, info)`` or the old
gym 4-tuple ``(obs, reward, done, info)`` (returned in the same form), and a frame source
(``env.render()`` with ``render_mode="rgb_array"``, or ``render_fn``).

Modes:

- ``"sync"``: an evaluated step blocks until the judge answers; its reward is
  ``env_reward + result.reward`` and ``info["vlm_scores"]`` holds that one `StepScore`.
- ``"async"``: an evaluated step only submits the frame; the step returns the env reward
  unchanged (``info["vlm_reward"] == 0.0``). Each finished score is delivered, in step
  order, in ``info["vlm_scores"]`` of a later step (or by `flush`) as a `StepScore` whose
  ``episode``/``step`` name the transition it belongs to: add ``score.reward`` to *that*
  transition (e.g. in the replay buffer). Nothing is moved onto the next transition.

Both modes combine scores in step order with the same per-episode progress baseline, so
for the same frames and answers they give the same reward to the same step.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any, Callable, Literal, Optional

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.reward.judge import VLMJudge
from mmpipe.records.reward import FrameAnswers, StepScore


class VLMRewardWrapper:
    """Judge every ``eval_frequency``-th step of ``env`` and add the VLM reward.

    Args:
        env: the environment (see the module doc for the protocol).
        judge: `VLMJudge` (its ``reward`` config sets mode, weights and scale).
        mode: ``"sync"`` or ``"async"`` (module doc).
        eval_frequency: ``int`` judge steps ``t`` (0-based, per episode) with
            ``(t + 1) % eval_frequency == 0``: every k-th step, as in the design.
        render_fn: ``Callable[[env], image]``; default ``env.render()``. Any image value
            (uint8 ``[H, W, 3]`` array, PIL image, ...); arrays are copied at once.
        primitive_fn: ``Callable[[action], str]`` the chosen primitive's name; default:
            the action itself if it is a str, ``judge.primitives[action]`` for an int, or
            ``action["primitive"]`` for a dict.
        task: ``str | None`` task description; None uses ``judge.task``.
        frame: ``"after"`` (default, the design: the frame after the step, whose progress
            the potential term needs) or ``"before"`` (the frame the action was chosen in).
        max_pending: ``int`` async only: most frames in flight; a step beyond it waits for
            the oldest (back-pressure, nothing is dropped).

    Every step's ``info`` gets: ``env_reward``, ``vlm_reward`` (added to this step's
    reward), ``vlm_evaluated``, ``vlm_episode``, ``vlm_step``, ``vlm_scores`` (list of
    `StepScore` delivered now), ``vlm_pending``; in sync mode an evaluated step also gets
    ``vlm_parts`` (the `RewardParts` as a dict) and ``vlm_valid``.
    """

    def __init__(
        self,
        env: Any,
        judge: VLMJudge,
        *,
        mode: Literal["sync", "async"] = "sync",
        eval_frequency: int = 1,
        render_fn: Optional[Callable[[Any], Any]] = None,
        primitive_fn: Optional[Callable[[Any], str]] = None,
        task: Optional[str] = None,
        frame: Literal["after", "before"] = "after",
        max_pending: int = 64,
    ):
        if mode not in ("sync", "async") or frame not in ("after", "before"):
            raise ArgumentError(f"VLMRewardWrapper: expected mode 'sync'|'async' and frame 'after'|'before', "
                             f"found mode={mode!r}, frame={frame!r}")
        if eval_frequency < 1 or max_pending < 1:
            raise ArgumentError(f"VLMRewardWrapper: expected eval_frequency >= 1 and max_pending >= 1, found "
                                f"{eval_frequency}, {max_pending}")
        self.env, self.judge, self.mode = env, judge, mode
        self.eval_frequency, self.frame, self.max_pending = int(eval_frequency), frame, int(max_pending)
        self.render_fn = render_fn or (lambda e: e.render())
        self.primitive_fn = primitive_fn or self._default_primitive
        self.task = task
        self._episode, self._t, self._global = -1, 0, 0
        self._pending: deque[tuple[tuple, Future]] = deque()
        self._cancel = threading.Event()  # set by close(wait=False) or an interrupt: queued frames not sent
        self._scored_episode, self._baseline = None, None

    def __getattr__(self, name: str) -> Any:  # action_space, observation_space, unwrapped, ...
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    # -- gym API -----------------------------------------------------------------------------
    def reset(self, *args: Any, **kwargs: Any) -> Any:
        """Reset the env; a new episode starts its own progress baseline. Pending async
        scores of the previous episode are still delivered (tagged with their episode)."""
        out = self.env.reset(*args, **kwargs)
        if self._cancel.is_set():  # an interrupted flush/close: the next frames are sent again
            self._cancel = threading.Event()
        self._episode += 1
        self._t = 0
        return out

    def step(self, action: Any) -> tuple:
        if self._episode < 0:
            raise RuntimeError("VLMRewardWrapper.step: call reset() first")
        t, g = self._t, self._global
        self._t, self._global = t + 1, g + 1
        evaluate = (t + 1) % self.eval_frequency == 0
        image = self._render() if evaluate and self.frame == "before" else None
        out = self.env.step(action)
        if len(out) not in (4, 5):
            raise ArgumentError(f"VLMRewardWrapper: env.step returned {len(out)} values; expected gymnasium's "
                                "(obs, reward, terminated, truncated, info) or gym's (obs, reward, done, info)")
        env_reward, info = out[1], dict(out[-1] or {})
        delivered: list[StepScore] = []
        vlm_reward = 0.0
        if evaluate:
            if image is None:
                image = self._render()
            meta = (self._episode, t, g, float(env_reward))
            primitive = self.primitive_fn(action)
            if self.mode == "sync":
                score = self._score(meta, self.judge.ask(image, primitive, task=self.task))
                delivered.append(score)
                vlm_reward = score.reward
                info["vlm_parts"] = asdict(score.result.parts)
                info["vlm_valid"] = score.result.valid
            else:
                while len(self._pending) >= self.max_pending:
                    delivered.extend(self._deliver(block=True, limit=1))
                self._pending.append((meta, self.judge.submit(image, primitive, task=self.task,
                                                              cancel=self._cancel)))
        if self.mode == "async":
            delivered.extend(self._deliver(block=False))
        info.update(env_reward=env_reward, vlm_reward=vlm_reward, vlm_evaluated=evaluate, vlm_episode=self._episode,
                    vlm_step=t, vlm_scores=delivered, vlm_pending=len(self._pending))
        return (out[0], env_reward + vlm_reward, *out[2:-1], info)

    def flush(self) -> list[StepScore]:
        """Wait for every pending async score and return them, in step order. Interrupted
        (``KeyboardInterrupt``), the frames not yet sent are cancelled (not sent)."""
        return self._deliver(block=True)

    def close(self, wait: bool = True) -> list[StepScore]:
        """Return the pending scores in step order, then close the env (the judge stays open).

        ``wait=True``: every pending frame is judged first (`flush`). ``wait=False``: stop
        sending now: frames and questions not yet sent are cancelled and delivered as not
        scored (``result.valid`` False, error ``"cancelled: ..."``, neutral reward); only
        the requests already in flight are waited for. Interrupted while waiting (Ctrl-C),
        the frames not yet sent are cancelled and the env is closed all the same before the
        interrupt propagates."""
        if not wait:
            self._cancel.set()
        try:
            return self.flush()
        finally:  # an interrupted flush must not leave the env (a simulator, a renderer) open
            if hasattr(self.env, "close"):
                self.env.close()

    # -- internals ---------------------------------------------------------------------------
    def _render(self) -> Any:
        image = self.render_fn(self.env)
        if image is None:
            raise ArgumentError("VLMRewardWrapper: the render function returned None; create the env with "
                                "render_mode='rgb_array' or pass render_fn=lambda env: <uint8 [H, W, 3] frame>")
        # Renderers reuse their buffers: take a copy now, encode on the worker.
        return np.array(image, copy=True) if isinstance(image, np.ndarray) else image

    def _default_primitive(self, action: Any) -> str:
        names = list(self.judge.primitives)
        if isinstance(action, str):
            return action
        if isinstance(action, dict) and "primitive" in action:
            return str(action["primitive"])
        if isinstance(action, (int, np.integer)) and 0 <= int(action) < len(names):
            return names[int(action)]
        raise TypeError(
            f"VLMRewardWrapper: cannot name the primitive of action {action!r} ({type(action).__name__}); "
            "expected a str, an int index into judge.primitives or a dict with 'primitive'; pass "
            "primitive_fn=lambda action: <primitive name>"
        )

    def _score(self, meta: tuple, answers: FrameAnswers) -> StepScore:
        # Called in step order in both modes, so the progress baseline sees frames in order.
        episode, t, g, env_reward = meta
        if episode != self._scored_episode:
            self._scored_episode, self._baseline = episode, None
        result = self.judge.result(answers, self._baseline)
        self._baseline = result.parts.baseline
        return StepScore(episode, t, g, env_reward, result)

    def _deliver(self, block: bool, limit: Optional[int] = None) -> list[StepScore]:
        out: list[StepScore] = []
        while self._pending and (block or self._pending[0][1].done()) and (limit is None or len(out) < limit):
            try:
                answers = self._pending[0][1].result()
            except BaseException:  # KeyboardInterrupt while waiting: send no more of the queue
                self._cancel.set()
                raise
            meta, _ = self._pending.popleft()
            out.append(self._score(meta, answers))
        return out
