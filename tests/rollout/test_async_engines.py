"""Async engines: the thread-offloaded transformers engine gives the sync engine's outputs,
bounds concurrency (also under cancellation); the AsyncLLM adapter's request translation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from mmpipe.errors import ArgumentError
from mmpipe.records.generation import AsyncRolloutEngine, SamplingParams
from mmpipe.rollout.async_engine import AsyncTransformersEngine, AsyncVLLMEngine, ThreadedEngine, run_sync
from mmpipe.rollout.inputs import to_vllm_prompts
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from helpers import GREEDY_AND_SAMPLED, prompt_rows

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


def _flat(gens):
    return [(g.prompt_index, c.token_ids, c.logprobs, c.finish_reason) for g in gens for c in g.completions]


HANG_S = 60  # a wait still blocked after this long is a hang (bounds only; nothing is timed)


class CountingEngine(TransformersEngine):
    """The real engine, counting how many of its calls overlap (and slowed so they would).

    ``overlap``: a call is held until that many calls have been in flight at once (a
    rendezvous: they do overlap, on a loaded machine too); ``hold``: calls are held until
    ``released`` is set (the test decides when they end). Both waits are bounded (HANG_S)."""

    def __init__(self, *a, delay: float = 0.05, overlap: int = 1, hold: bool = False, **kw):
        super().__init__(*a, **kw)
        self.lock, self.in_flight, self.max_in_flight, self.delay = threading.Lock(), 0, 0, delay
        self.sizes: list = []  # rows per call
        self.overlap, self.overlapped, self.released = overlap, threading.Event(), threading.Event()
        if not hold:
            self.released.set()

    def generate(self, rows, params=SamplingParams()):
        with self.lock:
            self.sizes.append(len(rows))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.max_in_flight >= self.overlap:
                self.overlapped.set()
        try:
            assert self.overlapped.wait(HANG_S), f"{self.overlap} calls never overlapped"
            assert self.released.wait(HANG_S), "the test never released the held call"
            time.sleep(self.delay)
            return super().generate(rows, params)
        finally:
            with self.lock:
                self.in_flight -= 1


async def _until(cond) -> None:
    """Yield to the loop until ``cond()``; a hang guard (HANG_S), not a timing check."""
    deadline = time.monotonic() + HANG_S
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"hang: still waiting after {HANG_S} s")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("family", FAMILIES)
@GREEDY_AND_SAMPLED
def test_async_transformers_engine_equals_sync(family, params):
    proc, model = processor_for(family), model_for(family)
    rows = prompt_rows(proc)
    want = TransformersEngine(model, proc).generate(rows, params)
    engine = AsyncTransformersEngine(model, proc)
    assert isinstance(engine, AsyncRolloutEngine)
    got = run_sync(engine.generate(rows, params))
    assert _flat(got) == _flat(want)  # ids and logprobs bit for bit (same seed, one call at a time)
    # and from several concurrent callers, one row each: every row gets its own result
    async def each():
        return await asyncio.gather(*(engine.generate([r], SamplingParams(max_new_tokens=6)) for r in rows))
    alone = run_sync(each())
    greedy = TransformersEngine(model, proc).generate(rows, SamplingParams(max_new_tokens=6))
    for i, g in enumerate(alone):
        assert g[0].completions[0].token_ids == greedy[i].completions[0].token_ids
        np.testing.assert_allclose(g[0].completions[0].logprobs, greedy[i].completions[0].logprobs, atol=1e-5)
    engine.close()


@pytest.mark.parametrize("limit", [1, 2])
def test_concurrency_is_bounded(limit):
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    rows = prompt_rows(proc, counts=(1,))
    inner = CountingEngine(model, proc, delay=0, overlap=limit)  # the first `limit` calls meet
    engine = ThreadedEngine(inner, max_concurrency=limit)

    async def many():
        return await asyncio.gather(*(engine.generate(rows, SamplingParams(max_new_tokens=3)) for _ in range(6)))

    outs = run_sync(many())
    assert len(outs) == 6 and all(o[0].completions[0].token_ids == outs[0][0].completions[0].token_ids for o in outs)
    assert inner.max_in_flight == limit  # reached, never exceeded
    assert engine.gate.max_in_flight == limit and engine.gate.calls == 6 and engine.gate.in_flight == 0
    engine.close()


def test_cancelled_callers_keep_the_bound():
    """A cancelled caller's thread keeps running; its slot is freed only when it ends, so a
    waiting call never overlaps it."""
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    rows = prompt_rows(proc, counts=(0,))
    inner = CountingEngine(model, proc, delay=0, hold=True)  # the first call runs until released
    engine = ThreadedEngine(inner, max_concurrency=1)

    async def scenario():
        first = asyncio.create_task(engine.generate(rows, SamplingParams(max_new_tokens=2)))
        await _until(lambda: inner.in_flight == 1)  # the first call is in its thread (held)
        second = asyncio.create_task(engine.generate(rows, SamplingParams(max_new_tokens=2)))
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert engine.gate.in_flight == 1  # the cancelled call is still running in its thread
        inner.released.set()
        return await second

    out = run_sync(scenario())
    assert out[0].completions[0].token_ids
    assert inner.max_in_flight == 1 and engine.gate.in_flight == 0 and engine.gate.calls == 2
    engine.close()


def test_batching_merges_waiting_callers():
    """max_batch_rows: concurrent single-row callers become few engine calls; each caller gets
    its own rows' results (ids equal to per-row greedy, logprobs within 1e-5), bound kept."""
    proc, model = processor_for("qwen2_5_vl"), model_for("qwen2_5_vl")
    rows = prompt_rows(proc, counts=(0, 1, 2, 1, 0, 2, 1))
    params = SamplingParams(max_new_tokens=5)
    alone = [TransformersEngine(model, proc).generate([r], params)[0] for r in rows]
    inner = CountingEngine(model, proc)
    engine = ThreadedEngine(inner, max_concurrency=1, max_batch_rows=4)

    async def callers():
        other = engine.generate(rows[:1], SamplingParams(max_new_tokens=2))  # other params: never merged
        return await asyncio.gather(other, *(engine.generate([r], params) for r in rows))

    other, *outs = run_sync(callers())
    assert engine.gate.calls == 3 and inner.max_in_flight == 1  # [other], 4 rows, 3 rows
    assert len(other[0].completions[0].token_ids) <= 2
    for got, want in zip(outs, alone):
        assert len(got) == 1 and got[0].prompt_index == 0
        assert got[0].completions[0].token_ids == want.completions[0].token_ids
        np.testing.assert_allclose(got[0].completions[0].logprobs, want.completions[0].logprobs, atol=1e-5, rtol=0)
    engine.close()


def test_batching_drops_callers_cancelled_while_waiting():
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    rows = prompt_rows(proc, counts=(0, 1, 2))
    inner = CountingEngine(model, proc, delay=0, hold=True)  # the first call runs until released
    engine = ThreadedEngine(inner, max_batch_rows=8)
    params = SamplingParams(max_new_tokens=2)

    async def scenario():
        busy = asyncio.create_task(engine.generate(rows[:1], params))
        await _until(lambda: inner.in_flight == 1)  # the first call is running (held); the next two wait
        gone = asyncio.create_task(engine.generate(rows[1:2], params))
        kept = asyncio.create_task(engine.generate(rows[2:], params))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        inner.released.set()
        return await busy, await kept, gone.cancelled()

    busy, kept, cancelled = run_sync(scenario())
    assert cancelled and inner.sizes == [1, 1]  # the cancelled caller's row never ran
    assert kept[0].completions[0].token_ids == TransformersEngine(model, proc).generate(rows[2:], params)[0].completions[0].token_ids
    engine.close()


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="max_concurrency"):
        ThreadedEngine(TransformersEngine(model_for("qwen2_vl"), processor_for("qwen2_vl")), max_concurrency=0)
    with pytest.raises(ArgumentError, match="generate"):
        ThreadedEngine(object())
    with pytest.raises(ArgumentError, match="max_batch_rows"):
        ThreadedEngine(TransformersEngine(model_for("qwen2_vl"), processor_for("qwen2_vl")), max_batch_rows=-1)

    async def inside():
        coro = asyncio.sleep(0)
        with pytest.raises(ArgumentError, match="await"):
            run_sync(coro)
    asyncio.run(inside())


def test_async_vllm_requests_translate_rows_and_params():
    """The AsyncLLM adapter's pure half (vLLM is not installed here): one request per row, the
    sync engine's prompts and sampling params, distinct request ids."""
    proc = processor_for("qwen2_5_vl")
    rows = prompt_rows(proc)
    class NotCalled:  # requests() never reaches the engine
        async def generate(self, prompt, sampling_params, request_id):
            raise AssertionError("not called")
            yield

    engine = AsyncVLLMEngine(NotCalled(), processor=proc, sampling_params_factory=dict, max_concurrency=2)
    params = SamplingParams(max_new_tokens=7, n=4, temperature=1.0, top_k=5, seed=1)
    reqs = engine.requests(rows, params)
    want = to_vllm_prompts(rows, proc)
    assert [r[0]["prompt_token_ids"] for r in reqs] == [p["prompt_token_ids"] for p in want]
    assert [len(r[0].get("multi_modal_data", {}).get("image", [])) for r in reqs] == [0, 1, 2]
    assert reqs[0][1]["n"] == 4 and reqs[0][1]["max_tokens"] == 7 and reqs[0][1]["top_k"] == 5
    assert reqs[0][1]["logprobs"] == 0
    assert len({r[2] for r in reqs}) == 3
