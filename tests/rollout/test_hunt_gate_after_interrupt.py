"""An engine call interrupted inside `run_sync` (Ctrl-C in a script or notebook, a cancelled
`AgentLoop.run` turn) must not take the engine's concurrency slot with it.

`ThreadedEngine` keeps a cancelled caller's slot until its model call has really finished
(module doc of `mmpipe.rollout.async_engine`). That release was a callback on the caller's
event loop; `run_sync` closes that loop when the call is interrupted, the thread finishes
later, the callback could not run, and the slot stayed taken for good: the next call on a new
loop waited forever. The child below cancels a held call, lets its thread finish, then calls
again. Nothing is timed: events, bounded by GUARD (a hang guard); the child runs in a session
of its own and is killed if it hangs.
"""

from __future__ import annotations

from helpers import run_child_group

SCRIPT = r"""
import asyncio, threading
from mmpipe.rollout.async_engine import ThreadedEngine, run_sync

GUARD = 60
started, release = threading.Event(), threading.Event()

class Held:
    calls = 0
    def generate(self, rows, params):
        self.calls += 1
        if self.calls == 1:  # the first call holds until the test lets it end
            started.set()
            release.wait(GUARD)
        return [f"g{r}" for r in rows]

engine = ThreadedEngine(Held(), max_concurrency=MAX)

async def interrupted():
    task = asyncio.ensure_future(engine.generate([1], None))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, GUARD)
    task.cancel()  # what Ctrl-C in run_sync does to the running call
    try:
        await task
    except asyncio.CancelledError:
        pass

run_sync(interrupted())       # its event loop is closed now; the model call still runs
release.set()
for _ in range(MAX):          # every engine thread has run past the held call (and its callbacks)
    engine._pool.submit(lambda: None).result(GUARD)
try:
    out = run_sync(asyncio.wait_for(engine.generate([2], None), GUARD))
    print("second call", out, engine.gate.in_flight)
except Exception as e:
    print("second call failed", type(e).__name__, engine.gate.in_flight)
engine.close()
"""


def _run(max_concurrency: int) -> str:
    return run_child_group(SCRIPT.replace("MAX", str(max_concurrency)), 240, "the engine hung after an interrupted call")


def test_a_call_after_an_interrupted_one_gets_the_slot_back():
    out = _run(1)
    assert out.split() == ["second", "call", "['g2']", "0"], out  # before: "second call failed TimeoutError 1"


def test_the_bound_is_whole_again_after_an_interrupted_call():
    out = _run(2)
    assert out.split() == ["second", "call", "['g2']", "0"], out  # before: in_flight stayed 1 after the call
