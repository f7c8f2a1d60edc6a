"""`ThreadedEngine.close()`: calls made afterwards, and calls still waiting for a slot when it
was closed, raise a typed `ArgumentError` that says the engine is closed and what to do.
Before, they got ``concurrent.futures``' bare ``RuntimeError: cannot schedule new futures
after shutdown``. Nothing is timed: the running call holds on an event until ``close()`` has
begun (bounded waits: hang guards)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from mmpipe.errors import ArgumentError
from mmpipe.rollout.async_engine import ThreadedEngine, run_sync

GUARD = 60


class Held:
    """A sync engine whose first call holds until ``release`` is set."""

    def __init__(self):
        self.calls, self.started, self.release = 0, threading.Event(), threading.Event()

    def generate(self, rows, params):
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            self.release.wait(GUARD)
        return [SimpleNamespace(prompt_index=i, out=f"g{r}") for i, r in enumerate(rows)]


def _shutting_down(engine) -> bool:
    with engine._pool._shutdown_lock:
        return engine._pool._shutdown


@pytest.mark.parametrize("max_batch_rows", [0, 4])
def test_a_call_waiting_when_the_engine_is_closed_gets_a_typed_error(max_batch_rows):
    held = Held()
    engine = ThreadedEngine(held, max_batch_rows=max_batch_rows)

    async def main():
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate([1], None))
        assert await loop.run_in_executor(None, held.started.wait, GUARD)
        second = asyncio.ensure_future(engine.generate([2], None))  # waits for the one slot
        closing = loop.run_in_executor(None, engine.close)  # waits for the running call
        for _ in range(GUARD * 100):
            if _shutting_down(engine):
                break
            await asyncio.sleep(0.01)
        held.release.set()
        await closing
        with pytest.raises(ArgumentError, match="after close"):  # before: RuntimeError: cannot schedule
            await asyncio.wait_for(second, GUARD)
        return [g.out for g in await asyncio.wait_for(first, GUARD)]

    assert run_sync(main()) == ["g1"]  # the call running at close() finished with its result
    assert held.calls == 1  # the waiting call never reached the model


@pytest.mark.parametrize("max_batch_rows", [0, 4])
def test_a_call_after_close_gets_a_typed_error(max_batch_rows):
    engine = ThreadedEngine(Held(), max_batch_rows=max_batch_rows)
    engine.close()
    with pytest.raises(ArgumentError, match="make a new engine"):
        run_sync(engine.generate([1], None))


def test_merged_callers_get_an_error_when_the_engine_returns_no_generations():
    """``max_batch_rows`` > 0 splits a merged call's generations back; a wrapped engine returning
    dicts made that split raise after the error handling, so every caller of the group waited
    forever (``wait_for``: the hang guard). Now each caller gets a typed `InputError`."""
    from mmpipe.errors import InputError

    class Dicts:
        def generate(self, rows, params):
            return [{"text": f"g{r}"} for r in rows]

    engine = ThreadedEngine(Dicts(), max_batch_rows=4)

    async def main():
        calls = [asyncio.ensure_future(engine.generate([k], None)) for k in range(3)]
        done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), GUARD)
        return done

    try:
        outs = run_sync(main())  # before: asyncio.TimeoutError after GUARD seconds (callers stranded)
    finally:
        engine.close()
    assert all(isinstance(o, InputError) and "returned a dict where a Generation belongs" in str(o) for o in outs), outs
