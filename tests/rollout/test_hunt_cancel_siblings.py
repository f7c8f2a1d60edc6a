"""A call whose rows go out as several requests and fails on one of them cancels the others
before it raises: none keeps generating (or holding a concurrency slot) for a caller that
already has its error. Plain ``asyncio.gather`` left them running in the caller's event loop
(an agent loop or trainer keeps that loop alive, so they ran to the end on the server).

Nothing here is timed: the stuck requests wait on an event, bounded by HANG_S (a hang guard);
the test looks at what each request saw when the call raised.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.async_engine import AsyncVLLMEngine, gather_or_cancel
from mmpipe.rollout.openai_engine import OpenAIEngine

from conftest import processor_for
from helpers import prompt_rows

HANG_S = 120  # a stuck request ends by itself after this long (a guard; nothing is timed)


class FirstFails:
    """Request 1 fails once all ``n`` are in flight; the others wait until cancelled
    (``ended`` records ``"cancelled"``) or until HANG_S (``"ran on"``)."""

    def __init__(self, n: int):
        self.n, self.started, self.ended = n, 0, []
        self.all_in = asyncio.Event()

    async def request(self):
        self.started += 1
        if self.started == self.n:
            self.all_in.set()
        if self.started == 1:
            await asyncio.wait_for(self.all_in.wait(), HANG_S)
            raise RuntimeError("request 1 failed on the server")
        try:
            await asyncio.sleep(HANG_S)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        self.ended.append("ran on")


class StuckAsyncLLM:
    """``vllm.AsyncLLM.generate`` stand-in over `FirstFails`."""

    def __init__(self, n: int):
        self.fails = FirstFails(n)

    async def generate(self, prompt, sampling_params, request_id):
        await self.fails.request()
        yield None  # pragma: no cover - never reached: every request fails or is cancelled


@pytest.mark.parametrize("max_concurrency", [None, 8])
def test_async_vllm_failed_request_cancels_the_others(max_concurrency):
    proc = processor_for("qwen2_vl")
    rows = prompt_rows(proc)  # three rows: three requests
    llm = StuckAsyncLLM(len(rows))
    engine = AsyncVLLMEngine(llm, processor=proc, sampling_params_factory=dict, max_concurrency=max_concurrency)

    async def main():
        with pytest.raises(RuntimeError, match="request 1 failed"):
            await engine.generate(rows, SamplingParams(max_new_tokens=4))
        return list(llm.fails.ended), (engine.gate.in_flight if engine.gate else 0)

    ended, in_flight = asyncio.run(main())
    # before: [] and 2 slots held - the other two requests still generating in the caller's loop
    assert ended == ["cancelled", "cancelled"]
    assert in_flight == 0


def _openai_client(fails: FirstFails):
    async def create(**kw):
        await fails.request()
    return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))


@pytest.mark.parametrize("server, n", [("vllm", 1), ("transformers", 3)])
def test_openai_engine_failed_request_cancels_the_others(server, n):
    """Rows (vllm server) and, on a server without ``n``, one request per completion."""
    proc = processor_for("qwen2_vl")
    rows = prompt_rows(proc)[:1] if n > 1 else prompt_rows(proc)
    fails = FirstFails(3)
    engine = OpenAIEngine("http://127.0.0.1:9/v1", "tiny", processor=proc, server=server, client=_openai_client(fails))

    async def main():
        with pytest.raises(RuntimeError, match="request 1 failed"):
            await engine.generate(rows, SamplingParams(max_new_tokens=4, n=n, temperature=1.0 if n > 1 else 0.0,
                                                       allow_vision_tokens=True))
        return list(fails.ended), engine.gate.in_flight

    ended, in_flight = asyncio.run(main())
    assert ended == ["cancelled", "cancelled"]  # before: []
    assert in_flight == 0  # before: 2


def test_gather_or_cancel_returns_every_result_in_order():
    async def value(k):
        await asyncio.sleep(0)
        return k

    assert asyncio.run(gather_or_cancel(*(value(k) for k in range(5)))) == [0, 1, 2, 3, 4]
