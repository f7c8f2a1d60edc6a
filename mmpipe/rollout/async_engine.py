"""Async rollout engines: ``await engine.generate(rows, params)`` from many coroutines at once.

An agent loop runs many trajectories concurrently; each awaits its own ``generate`` call.
These adapters give the sync engines that interface
(`mmpipe.records.generation.AsyncRolloutEngine`)
and bound how many model calls run together:

    ThreadedEngine           any sync `RolloutEngine` run in worker threads (``max_concurrency``)
    AsyncTransformersEngine  `ThreadedEngine` over a `TransformersEngine` (one model call at a time)
    AsyncVLLMEngine          ``vllm.AsyncLLM`` (vLLM batches concurrent requests itself)

The HTTP engine for OpenAI-compatible servers is `mmpipe.rollout.openai_engine`.

    engine = AsyncTransformersEngine(model, processor)
    gens = await engine.generate(rows, SamplingParams(max_new_tokens=64))
    gens = run_sync(engine.generate(rows, params))       # from sync code

    # many single-row trajectories: merge the calls that wait for the model into batches
    engine = AsyncTransformersEngine(model, processor, max_batch_rows=32)

Cancellation: cancelling a caller never frees its concurrency slot before the model call it
started has really finished (a thread cannot be interrupted), so the bound holds even when
trajectories are cancelled; the cancelled caller's result is dropped. A call whose rows go out
as several requests (`AsyncVLLMEngine`, `mmpipe.rollout.openai_engine.OpenAIEngine`) that
fails on one of them cancels the others before it raises (`gather_or_cancel`): none keeps
generating, or holding a slot, for a caller that has already had its error.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.generation import Generation, SamplingParams

__all__ = ["ThreadedEngine", "AsyncTransformersEngine", "AsyncVLLMEngine", "ConcurrencyGate", "gather_or_cancel",
           "run_sync"]


class ConcurrencyGate:
    """At most ``limit`` calls inside at once; counts them (``in_flight``, ``max_in_flight``, ``calls``).

    ``await gate.run(fn, *args)`` runs ``fn(*args)`` in ``executor`` (a thread) and
    ``await gate.run_coro(coro_fn)`` awaits a coroutine; either way the slot is released only
    when the work itself has finished, even if the awaiting task was cancelled, and even if its
    event loop is gone by then (`run_sync` closes it when the call is interrupted): the thread
    gives the slot back itself.
    """

    def __init__(self, limit: int):
        if not isinstance(limit, int) or limit < 1:
            raise ArgumentError(f"max_concurrency must be an int >= 1, got {limit!r}")
        self.limit = limit
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop = None
        self._lock = threading.Lock()  # in_flight and the current semaphore: threads release too
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def acquire(self) -> None:
        """Wait for a free slot and hold it (`release` gives it back)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._sem is None or self._loop is not loop:
                # a Semaphore binds to the loop that waits on it: one per loop (run_sync makes new
                # loops); slots still held by threads an earlier loop started stay taken
                self._sem, self._loop = asyncio.Semaphore(max(0, self.limit - self.in_flight)), loop
            sem = self._sem
        await sem.acquire()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def release(self, _=None) -> None:
        """Give a slot back; from the loop's thread or from a worker thread."""
        with self._lock:
            self.in_flight -= 1
            sem, loop = self._sem, self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            sem.release()
            return
        try:
            loop.call_soon_threadsafe(sem.release)
        except RuntimeError:  # that loop is closed: the next loop's semaphore counts this slot free
            pass

    def start_held(self, executor, fn: Callable, *args) -> "asyncio.Future":
        """Run ``fn(*args)`` in ``executor`` under a slot already held; the slot is released
        when the thread finishes (await the returned future through `asyncio.shield`)."""
        self.calls += 1
        loop = asyncio.get_running_loop()
        try:
            work = executor.submit(fn, *args)
        except BaseException:
            self.release()
            raise
        # released by the thread itself: a callback on the loop never runs once the loop is closed
        work.add_done_callback(self.release)
        return asyncio.wrap_future(work, loop=loop)

    async def run(self, executor, fn: Callable, *args) -> Any:
        await self.acquire()
        # a cancelled caller leaves the thread (and so the slot) running until it ends
        return await asyncio.shield(self.start_held(executor, fn, *args))

    async def run_coro(self, coro_fn: Callable[[], Any]) -> Any:
        await self.acquire()
        self.calls += 1
        try:
            return await coro_fn()
        finally:
            self.release()


async def gather_or_cancel(*aws) -> list:
    """``asyncio.gather(*aws)``, except that when one fails the others are cancelled, and
    awaited, before its error is raised. Plain ``gather`` leaves them running: in a long-lived
    event loop (an agent loop, a trainer) the failed call's other requests kept generating on
    the server and holding their concurrency slots after the caller had its error."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def run_sync(awaitable, *, caller: str = "run_sync", fix: str = "`await` the engine's generate() instead"):
    """Run an engine coroutine from sync code. Inside a running event loop (Jupyter, an async
    trainer) the coroutine is closed and ``caller`` is an `ArgumentError` saying ``fix``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable)
    getattr(awaitable, "close", lambda: None)()
    raise ArgumentError(f"{caller} was called inside a running event loop: {fix}")


class _EngineThreads(ThreadPoolExecutor):
    """A `ThreadedEngine`'s threads: a call after ``close()`` is an `ArgumentError` saying so
    (``concurrent.futures`` raises a bare ``RuntimeError: cannot schedule new futures``)."""

    def submit(self, fn, /, *args, **kwargs):
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError:
            if not self._shutdown:  # interpreter shutdown: as it is
                raise
            raise ArgumentError("ThreadedEngine.generate after close(): the engine's threads are stopped "
                                "(calls still waiting when it was closed end here too); make a new engine, "
                                "and close() it once every rollout has finished") from None


class ThreadedEngine:
    """`AsyncRolloutEngine` over any sync `RolloutEngine`: each call runs in a worker thread.

    Args:
        engine: has ``generate(rows, params) -> list[Generation]``.
        max_concurrency: engine calls running at once (default 1: a CPU model gains nothing
            from two threads, and `TransformersEngine` seeds torch's global generator, so only
            one call at a time keeps seeded runs reproducible).
        max_batch_rows: 0 (default): every call is its own engine call, outputs exactly the
            sync engine's. N > 0: calls that wait for a slot with EQUAL params are merged
            into one engine call of up to N rows (at least one whole call) and the results
            split back, ``prompt_index`` renumbered per caller. Many single-row callers (agent
            trajectories) then cost a few batched calls; greedy ids are those of the merged
            batch (left padding may move logprobs by ~1e-6), seeded sampling depends on the
            merge, and a failing row fails every call merged with it.

    Calls beyond the bound wait their turn (FIFO). ``gate`` counts calls and overlap.
    """

    def __init__(self, engine, *, max_concurrency: int = 1, max_batch_rows: int = 0):
        if not callable(getattr(engine, "generate", None)):
            raise ArgumentError(f"engine must have generate(rows, params), got {type(engine).__name__}")
        if not isinstance(max_batch_rows, int) or max_batch_rows < 0:
            raise ArgumentError(f"max_batch_rows must be an int >= 0, got {max_batch_rows!r}")
        self.engine = engine
        self.gate = ConcurrencyGate(max_concurrency)
        self.max_batch_rows = max_batch_rows
        self._pool = _EngineThreads(max_workers=max_concurrency, thread_name_prefix="mmpipe-engine")
        self._pending: deque = deque()
        self._drainer: Optional[asyncio.Future] = None

    async def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """Same arguments and result as the wrapped engine's ``generate``."""
        rows = list(rows)
        if not self.max_batch_rows:
            return await self.gate.run(self._pool, self.engine.generate, rows, params)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((rows, params, fut))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await fut  # cancelling drops the call if it has not started (its rows still run otherwise)

    def _take_group(self) -> list:
        """The oldest waiting call plus every later one with equal params, within max_batch_rows."""
        group, keep, n = [], deque(), 0
        while self._pending:
            item = self._pending.popleft()
            if item[2].done():  # cancelled while waiting
                continue
            if group and (item[1] != group[0][1] or n + len(item[0]) > self.max_batch_rows):
                keep.append(item)
                continue
            group.append(item)
            n += len(item[0])
        self._pending = keep
        return group

    async def _drain(self) -> None:
        running = set()
        while self._pending:
            await self.gate.acquire()  # calls pile up in _pending while the model is busy
            group = self._take_group()
            if not group:
                self.gate.release()
                continue
            task = asyncio.ensure_future(self._run_group(group))
            running.add(task)
            task.add_done_callback(running.discard)

    async def _run_group(self, group: list) -> None:
        rows = [r for item in group for r in item[0]]
        try:
            gens = await self.gate.start_held(self._pool, self.engine.generate, rows, group[0][1])
            if len(gens) != len(rows):
                raise InputError(f"the engine returned {len(gens)} generations for {len(rows)} rows", where="",
                                 stage="rollout", expected=f"{len(rows)} generations", found=f"{len(gens)}",
                                 fix="the wrapped engine must return one Generation per row")
            parts = _split(group, gens)  # in the try: a failure here must reach the callers, not strand them
        except BaseException as e:  # noqa: BLE001  (handed to every caller of the group)
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, _, fut), part in zip(group, parts):
            if not fut.done():
                fut.set_result(part)

    def close(self) -> None:
        """Stop the worker threads (waits for a running call). Calls made afterwards, and calls
        still waiting for a slot, raise `ArgumentError` (the engine is closed)."""
        self._pool.shutdown(wait=True)


def _split(group: list, gens: list) -> list[list]:
    """A merged call's generations back to its callers, ``prompt_index`` renumbered per caller."""
    parts, start = [], 0
    for part_rows, _, _ in group:
        part = gens[start:start + len(part_rows)]
        start += len(part_rows)
        for i, g in enumerate(part):
            try:
                g.prompt_index = i
            except AttributeError as e:  # a dict, a frozen record: not a Generation
                raise InputError(f"the engine returned a {type(g).__name__} where a Generation belongs", where="",
                                 stage="rollout", expected="Generation records (prompt_index settable)",
                                 found=type(g).__name__, fix="the wrapped engine's generate must return one "
                                 "mmpipe.records.generation.Generation per row") from e
        parts.append(part)
    return parts


class AsyncTransformersEngine(ThreadedEngine):
    """`ThreadedEngine` over `mmpipe.rollout.transformers_engine.TransformersEngine`.

    Same outputs as the sync engine for the same rows and params (seeded sampling included:
    at ``max_concurrency=1`` and ``max_batch_rows=0`` each call seeds and samples alone).
    ``max_batch_rows`` > 0 merges waiting calls (see `ThreadedEngine`). Extra keyword arguments
    go to `TransformersEngine`.
    """

    def __init__(self, model, processor, *, max_concurrency: int = 1, max_batch_rows: int = 0, **engine_kwargs):
        from mmpipe.rollout.transformers_engine import TransformersEngine

        super().__init__(TransformersEngine(model, processor, **engine_kwargs), max_concurrency=max_concurrency,
                         max_batch_rows=max_batch_rows)


def final_only(sp: Any) -> Any:
    """vLLM params whose request yields one output holding all ``n`` completions: a copy with
    ``output_kind=FINAL_ONLY``. With vLLM's default (CUMULATIVE) an ``n > 1`` request streams
    each sample's output on its own and the last one carries only the sample that finished
    last, unless the consumer lagged and outputs were merged: rows came back with fewer
    completions than ``n`` depending on timing. Objects without ``output_kind`` pass as they are."""
    if getattr(sp, "output_kind", None) is None:
        return sp
    from vllm.sampling_params import RequestOutputKind

    if sp.output_kind == RequestOutputKind.FINAL_ONLY:
        return sp
    sp = sp.clone()
    sp.output_kind = RequestOutputKind.FINAL_ONLY
    return sp


class AsyncVLLMEngine:
    """`AsyncRolloutEngine` over ``vllm.AsyncLLM`` (vLLM imported lazily, only by the default factory).

    Each row becomes one vLLM request (the prompt of `mmpipe.rollout.inputs.to_vllm_prompts`,
    the sampling params of `VLLMEngine.sampling_params`); the rows of a call are submitted
    together and vLLM batches them with every other in-flight request. ``max_concurrency``
    bounds the requests this engine keeps in vLLM at once (None: unbounded). The final
    ``RequestOutput`` of each request goes through `generation_from_request_output`, prompt
    ids checked against the row's ``input_ids`` like the sync engine. A cancelled caller's
    requests are aborted by vLLM (``AsyncLLM.generate`` aborts on cancellation), and so are
    the other requests of a call when one of them fails (`gather_or_cancel`).

    Args:
        llm: ``vllm.AsyncLLM`` (or anything whose ``generate(prompt, sampling_params,
            request_id)`` is an async iterator of ``RequestOutput`` s).
        processor, sampling_params_factory, check_prompt_ids: as `VLLMEngine`.
    """

    _ids = itertools.count()

    def __init__(self, llm, *, processor, max_concurrency: Optional[int] = None,
                 sampling_params_factory: Optional[Callable[..., Any]] = None, check_prompt_ids: bool = True):
        from mmpipe.rollout.vllm_engine import VLLMEngine

        self.llm = llm
        self._sync = VLLMEngine(llm, processor=processor, sampling_params_factory=sampling_params_factory,
                                check_prompt_ids=check_prompt_ids)
        self.gate = ConcurrencyGate(max_concurrency) if max_concurrency is not None else None

    def requests(self, rows: Sequence, params: SamplingParams) -> list[tuple[dict, Any, str]]:
        """The vLLM requests for ``rows``: ``(prompt dict, vLLM SamplingParams, request_id)`` each."""
        from mmpipe.rollout.inputs import to_vllm_prompts

        prompts = to_vllm_prompts(rows, self._sync.processor, tokenizer=self._sync.processor)
        sp = final_only(self._sync.sampling_params(params))
        return [(p, sp, f"mmpipe-{next(self._ids)}") for p in prompts]

    async def _one(self, prompt: dict, sp: Any, request_id: str) -> Any:
        final = None
        async for out in self.llm.generate(prompt, sp, request_id):
            final = out
        if final is None:
            raise InputError(f"vLLM request {request_id} produced no output", where="", stage="rollout",
                             expected="at least one RequestOutput", found="none",
                             fix="check the AsyncLLM engine's logs")
        return final

    async def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt rows or a batch; one `Generation` per row, in order."""
        from mmpipe.rollout.inputs import prompt_rows
        from mmpipe.rollout.vllm_engine import generation_from_request_output

        recs = prompt_rows(rows)
        calls = [(lambda r=r: self._one(*r)) for r in self.requests(recs, params)]
        if self.gate is not None:
            outs = await gather_or_cancel(*(self.gate.run_coro(c) for c in calls))
        else:
            outs = await gather_or_cancel(*(c() for c in calls))
        check = self._sync.check_prompt_ids
        return [generation_from_request_output(o, i, expected_prompt_ids=recs[i].input_ids if check else None)
                for i, o in enumerate(outs)]
