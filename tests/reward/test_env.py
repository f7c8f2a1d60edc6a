"""VLMRewardWrapper: sync and async evaluation give the same reward to the same step."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from mmpipe.reward import JudgeClient, RewardConfig, VLMJudge, VLMRewardWrapper, encode_frame
from mmpipe.testing import tiny_image

from judge_server import ok, overlapping, server  # noqa: F401  (fixture)

PRIMITIVES = ["reach", "grasp", "lift", "place"]
CFG = dict(mode="symmetric", binary_weight=0.6, progress_weight=0.4, vlm_reward_scale=0.5)


class FrameEnv:
    """A gymnasium-style env whose frame depends on (episode, t); `render` reuses one buffer,
    as real renderers do, so a wrapper that keeps the array instead of a copy sees it change."""

    def __init__(self, n_steps: int = 10, old_api: bool = False, render_none: bool = False):
        self.n_steps, self.old_api, self.render_none = n_steps, old_api, render_none
        self.episode, self.t, self.closed = -1, 0, False
        self._buf = np.zeros((16, 16, 3), np.uint8)

    @staticmethod
    def frame(episode: int, t: int) -> np.ndarray:
        return np.asarray(tiny_image(16, 16, seed=1000 * episode + t))

    def reset(self, seed=None, options=None):
        self.episode, self.t = self.episode + 1, 0
        return {"t": 0}, {}

    def step(self, action):
        self.t += 1
        reward, done = 0.01 * self.t, self.t >= self.n_steps
        if self.old_api:
            return {"t": self.t}, reward, done, {"action": action}
        return {"t": self.t}, reward, done, False, {"action": action}

    def render(self):
        if self.render_none:
            return None
        self._buf[...] = self.frame(self.episode, self.t)
        return self._buf

    def close(self):
        self.closed = True


def _digest(url: str) -> bytes:
    return hashlib.sha256(url.encode()).digest()


def frame_answers(delay: float):
    """Answers that are a fixed function of the image sent."""
    def script(request, index):
        h = _digest(request.image_url)
        if request.kind == "action":
            return ok({"reasonable": h[0] % 2 == 0, "confidence": round(h[1] / 255, 3), "reason": "x"}, delay=delay)
        return ok({"progress": round(h[2] / 255, 3), "stage": "s", "next_step": "n"}, delay=delay)
    return script


def expected_by_hand(episodes: int, steps: int, every: int) -> dict:
    """(episode, step) -> reward, symmetric mode, weights 0.6/0.4, scale 0.5, delta progress term."""
    out = {}
    for ep in range(episodes):
        prev = None
        for t in range(every - 1, steps, every):
            h = _digest(encode_frame(FrameEnv.frame(ep, t + 1)).url)  # the frame after step t
            c, p = round(h[1] / 255, 3), round(h[2] / 255, 3)
            action = c if h[0] % 2 == 0 else -c
            term = 0.0 if prev is None else p - prev
            out[(ep, t)] = 0.5 * (0.6 * action + 0.4 * term)
            prev = p
    return out


def make_judge(server, concurrency=4):
    client = JudgeClient(server.base_url, "judge-model", max_concurrency=concurrency, timeout_s=60)  # a hang bound
    return VLMJudge(client, task="stack", primitives=PRIMITIVES, reward=RewardConfig(**CFG), cache_size=0)


def run(wrapper, episodes: int, steps: int):
    """Play; return {(ep, t): (returned reward, env reward)}, {(ep, t): StepScore}, {(ep, t): delivered at}."""
    returned, scores, delivered_at = {}, {}, {}
    for ep in range(episodes):
        wrapper.reset()
        for t in range(steps):
            _, reward, _, _, info = wrapper.step(PRIMITIVES[t % 4])
            assert (info["vlm_episode"], info["vlm_step"]) == (ep, t)
            returned[(ep, t)] = (reward, info["env_reward"])
            for s in info["vlm_scores"]:
                assert (s.episode, s.step) not in scores, "a score was delivered twice"
                scores[(s.episode, s.step)] = s
                delivered_at[(s.episode, s.step)] = (ep, t)
    for s in wrapper.flush():
        scores[(s.episode, s.step)] = s
        delivered_at[(s.episode, s.step)] = (episodes, 0)  # after the last step
    return returned, scores, delivered_at


@pytest.mark.parametrize("every", [1, 3])
def test_sync_and_async_give_the_same_reward_to_the_same_step(server, every):
    episodes, steps = 2, 10
    server.reset(frame_answers(delay=0.01))
    expected = expected_by_hand(episodes, steps, every)

    sync = VLMRewardWrapper(FrameEnv(steps), make_judge(server), mode="sync", eval_frequency=every)
    s_returned, s_scores, s_at = run(sync, episodes, steps)
    assert set(s_scores) == set(expected)
    for key, score in s_scores.items():
        assert score.reward == pytest.approx(expected[key], abs=1e-12) and score.result.valid
        assert s_at[key] == key  # sync: delivered with its own step
        assert s_returned[key][0] == pytest.approx(score.env_reward + score.reward) == pytest.approx(score.total)
    for key, (reward, env_reward) in s_returned.items():
        if key not in expected:
            assert reward == env_reward

    # the first answers wait until two requests are in flight (a rendezvous, not a race of the
    # next step against a 10 ms answer): async mode must send the next frames while one is out
    server.reset(overlapping(server, 2, frame_answers(delay=0.0)))
    async_ = VLMRewardWrapper(FrameEnv(steps), make_judge(server), mode="async", eval_frequency=every)
    a_returned, a_scores, a_at = run(async_, episodes, steps)
    assert {k: s.reward for k, s in a_scores.items()} == {k: s.reward for k, s in s_scores.items()}
    assert {k: s.env_reward for k, s in a_scores.items()} == {k: s.env_reward for k, s in s_scores.items()}
    assert all(reward == env_reward for reward, env_reward in a_returned.values())  # nothing shifted in
    assert all(a_at[k] >= k for k in a_at)
    assert any(a_at[k] > k for k in a_at), "async mode delivered everything at its own step"
    assert server.max_in_flight >= 2  # frames were judged concurrently


def test_async_back_pressure_keeps_rewards(server):
    server.reset(frame_answers(delay=0.005))
    expected = expected_by_hand(1, 8, 1)
    wrapper = VLMRewardWrapper(FrameEnv(8), make_judge(server), mode="async", max_pending=1)
    pending = []
    wrapper.reset()
    scores = {}
    for t in range(8):
        info = wrapper.step("reach")[-1]
        pending.append(info["vlm_pending"])
        scores.update({(s.episode, s.step): s.reward for s in info["vlm_scores"]})
    scores.update({(s.episode, s.step): s.reward for s in wrapper.close()})
    assert max(pending) <= 1 and wrapper.env.closed
    assert scores == pytest.approx(expected)


def test_frame_before_the_step(server):
    wrapper = VLMRewardWrapper(FrameEnv(4), make_judge(server), frame="before")
    wrapper.reset()
    info = wrapper.step("reach")[-1]
    assert server.requests[0].image_url == encode_frame(FrameEnv.frame(0, 0)).url
    assert info["vlm_valid"] and set(info["vlm_parts"]) >= {"binary", "progress_term", "vlm_reward", "reward"}


def test_old_gym_api_int_actions_and_delegation(server):
    env = FrameEnv(4, old_api=True)
    env.action_space = "Discrete(4)"
    wrapper = VLMRewardWrapper(env, make_judge(server))
    wrapper.reset()
    out = wrapper.step(1)
    assert len(out) == 4 and out[-1]["action"] == 1
    assert server.requests[0].field("The robot selected") == "grasp"  # judge.primitives[1]
    assert out[1] == pytest.approx(0.01 + out[-1]["vlm_scores"][0].reward)
    assert wrapper.action_space == "Discrete(4)"


def test_configuration_errors(server):
    wrapper = VLMRewardWrapper(FrameEnv(4, render_none=True), make_judge(server))
    with pytest.raises(RuntimeError, match="call reset"):
        wrapper.step("reach")
    wrapper.reset()
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        wrapper.step("reach")
    wrapper = VLMRewardWrapper(FrameEnv(4), make_judge(server))
    wrapper.reset()
    with pytest.raises(TypeError, match="primitive_fn"):
        wrapper.step(np.zeros(3))
    with pytest.raises(ValueError, match="eval_frequency >= 1"):
        VLMRewardWrapper(FrameEnv(4), make_judge(server), eval_frequency=0)


def test_server_down_never_breaks_the_loop(server):
    judge = VLMJudge(JudgeClient(server.base_url, "m", max_retries=0, timeout_s=0.2))
    server.stop()  # connection refused from now on
    for mode in ("sync", "async"):
        wrapper = VLMRewardWrapper(FrameEnv(3), judge, mode=mode)
        wrapper.reset()
        out = [wrapper.step("reach") for _ in range(3)]
        scores = [s for o in out for s in o[-1]["vlm_scores"]] + wrapper.flush()
        assert [o[1] for o in out] == pytest.approx([0.01, 0.02, 0.03])  # env rewards, VLM part neutral
        assert len(scores) == 3 and all(not s.result.valid and s.reward == 0.0 for s in scores)
        assert all("connection error" in s.result.error for s in scores)
