"""`VLMRewardWrapper.close` closes the env even when the wait for the pending scores is
interrupted (Ctrl-C). Before, the interrupt skipped ``env.close()``: the simulator / renderer
stayed open. The interrupt is the one ``Future.result()`` raises in the waiting thread; the
judge's ``submit`` is replaced by pending futures the test fails (no server, nothing timed)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from mmpipe.reward import JudgeClient, VLMJudge, VLMRewardWrapper

PRIMITIVES = ["reach", "grasp", "lift"]


class FrameEnv:
    """A gymnasium-style env with a fixed frame that records ``close``."""

    closed = False

    def reset(self, seed=None, options=None):
        return {}, {}

    def step(self, action):
        return {}, 0.0, False, False, {}

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("wait", [True, False])
def test_close_interrupted_while_waiting_still_closes_the_env(wait):
    judge = VLMJudge(JudgeClient("http://127.0.0.1:9/v1", "judge-model"), primitives=PRIMITIVES, cache_size=0)
    futures: list[Future] = []
    cancels = []

    def submit(image, primitive, *, task=None, cancel=None):
        futures.append(Future())
        cancels.append(cancel)
        return futures[-1]

    judge.submit = submit
    env = FrameEnv()
    wrapper = VLMRewardWrapper(env, judge, mode="async")
    wrapper.reset()
    for t in range(3):
        wrapper.step(PRIMITIVES[t])
    assert len(futures) == 3 and not any(f.done() for f in futures)
    futures[0].set_exception(KeyboardInterrupt())  # Ctrl-C while close() waits for the first score
    with pytest.raises(KeyboardInterrupt):
        wrapper.close(wait=wait)
    assert env.closed  # before: False
    assert cancels[0].is_set()  # the frames not yet sent are cancelled
