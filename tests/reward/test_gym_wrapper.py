"""`VLMRewardGymWrapper` is a real ``gymnasium.Wrapper``: gymnasium's own wrappers and vector
envs take it, and its rewards are `VLMRewardWrapper`'s."""

from __future__ import annotations

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.vector import SyncVectorEnv  # noqa: E402
from gymnasium.wrappers import RecordEpisodeStatistics  # noqa: E402

import mmpipe.reward  # noqa: E402
from mmpipe.reward import VLMRewardWrapper  # noqa: E402

from judge_server import server  # noqa: E402,F401  (fixture)
from test_env import PRIMITIVES, FrameEnv, expected_by_hand, frame_answers, make_judge  # noqa: E402

STEPS = 4


class FrameGymEnv(gymnasium.Env):
    """`FrameEnv`'s frames and rewards as a gymnasium env (Discrete actions = primitive index)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, n_steps: int = STEPS):
        self.inner = FrameEnv(n_steps)
        self.render_mode = "rgb_array"
        self.observation_space = gymnasium.spaces.Discrete(n_steps + 1)
        self.action_space = gymnasium.spaces.Discrete(len(PRIMITIVES))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.inner.reset()
        return 0, {}

    def step(self, action):
        _, reward, terminated, truncated, info = self.inner.step(action)
        return self.inner.t, reward, terminated, truncated, info

    def render(self):
        return self.inner.render()


def test_is_a_gymnasium_wrapper_under_record_episode_statistics(server):
    server.reset(frame_answers(delay=0.0))
    wrapped = mmpipe.reward.VLMRewardGymWrapper(FrameGymEnv(), make_judge(server))
    assert isinstance(wrapped, gymnasium.Wrapper) and wrapped.unwrapped.__class__ is FrameGymEnv
    env = RecordEpisodeStatistics(wrapped)
    env.reset(seed=0)
    total, done, info = 0.0, False, {}
    while not done:
        _, reward, terminated, truncated, info = env.step(1)
        total += reward
        done = terminated or truncated
    expected = expected_by_hand(1, STEPS, 1)
    env_rewards = sum(0.01 * (t + 1) for t in range(STEPS))
    assert info["episode"]["r"] == pytest.approx(total) == pytest.approx(env_rewards + sum(expected.values()))
    assert info["episode"]["l"] == STEPS
    env.close()


def test_vector_env_of_wrapped_envs(server):
    server.reset(frame_answers(delay=0.0))
    judge = make_judge(server)
    envs = SyncVectorEnv([lambda: mmpipe.reward.VLMRewardGymWrapper(FrameGymEnv(), judge)] * 2)
    envs.reset(seed=0)
    _, rewards, _, _, infos = envs.step(np.array([0, 2]))
    assert rewards.shape == (2,) and infos["vlm_evaluated"].tolist() == [True, True]
    expected = expected_by_hand(1, STEPS, 1)[(0, 0)] + 0.01
    assert rewards == pytest.approx([expected, expected])
    envs.close()


def test_same_rewards_as_the_duck_typed_wrapper(server):
    server.reset(frame_answers(delay=0.0))
    a = mmpipe.reward.VLMRewardGymWrapper(FrameGymEnv(), make_judge(server))
    b = VLMRewardWrapper(FrameGymEnv(), make_judge(server))
    for env in (a, b):
        env.reset(seed=0)
    for t in range(STEPS):
        assert a.step(t % 4)[1] == pytest.approx(b.step(t % 4)[1])
