"""`VLMRewardGymWrapper`: `VLMRewardWrapper` as a real ``gymnasium.Wrapper``.

A subclass of ``gymnasium.Wrapper``, so gymnasium's own wrappers
(``RecordEpisodeStatistics``, ``TimeLimit``, ...) and vector envs (``SyncVectorEnv``,
``AsyncVectorEnv``) take it like any env. Needs ``gymnasium`` (``pip install
"mmpipe[gym]"``); `VLMRewardWrapper` itself stays duck-typed and needs no gymnasium.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    import gymnasium
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('VLMRewardGymWrapper needs gymnasium; pip install "mmpipe[gym]"  (or: pip install gymnasium)') from e

from mmpipe.records.reward import StepScore
from mmpipe.reward.env import VLMRewardWrapper
from mmpipe.reward.judge import VLMJudge


class VLMRewardGymWrapper(gymnasium.Wrapper):
    """The judge's reward on a ``gymnasium.Env`` (5-tuple steps), as a ``gymnasium.Wrapper``.

    Args:
        env: ``gymnasium.Env`` whose ``render()`` returns a uint8 ``[H, W, 3]`` frame
            (``render_mode="rgb_array"``) unless ``render_fn`` is given.
        judge: `VLMJudge`.
        **options: `VLMRewardWrapper`'s keyword arguments (``mode``, ``eval_frequency``,
            ``render_fn``, ``primitive_fn``, ``task``, ``frame``, ``max_pending``).

    ``step`` returns ``(obs, env_reward + vlm_reward, terminated, truncated, info)`` with
    the ``vlm_*`` info keys of `VLMRewardWrapper`. Example::

        env = RecordEpisodeStatistics(VLMRewardGymWrapper(gymnasium.make(..., render_mode="rgb_array"), judge))
    """

    def __init__(self, env: "gymnasium.Env", judge: VLMJudge, **options: Any):
        super().__init__(env)
        self.vlm = VLMRewardWrapper(env, judge, **options)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple:
        return self.vlm.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple:
        return self.vlm.step(action)

    def flush(self) -> list[StepScore]:
        """Pending async scores, in step order (see `VLMRewardWrapper.flush`)."""
        return self.vlm.flush()

    def close(self, wait: bool = True) -> list[StepScore]:  # type: ignore[override]
        """Pending scores (see `VLMRewardWrapper.close`), then close the env."""
        return self.vlm.close(wait=wait)
