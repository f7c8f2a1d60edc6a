"""`VLMJudge`: ask both questions about a frame, cache, parse, and score.

One frame = two questions, sent one after the other on one worker thread (the second
then finds the image in the server's prefix cache); frames run concurrently on a pool of
``client.max_concurrency`` threads, so at most that many requests are in flight.

Cancellation: `close()`, a ``KeyboardInterrupt`` (or any exception) in `ask_many` /
`judge_many`, or a ``cancel`` event given to `submit` stop the sending: a frame not yet
started, a question not yet sent or a retry is not sent, and its `Answer` says
``"cancelled: ..."`` (invalid: not scored). Requests already in flight end by themselves
(within ``timeout_s``), except under `close()`, which closes their connections.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Optional, Sequence

from mmpipe.errors import ArgumentError, InputError
from mmpipe.reward.arithmetic import RewardConfig, combine
from mmpipe.reward.client import JudgeClient
from mmpipe.reward.dataset import score_batch
from mmpipe.reward.frames import EncodedFrame, encode_frame
from mmpipe.reward.parsing import clip_raw, parse_action, parse_progress
from mmpipe.reward.prompts import (
    ACTION_SCHEMA,
    ACTION_SCHEMA_NAME,
    PROGRESS_SCHEMA,
    PROGRESS_SCHEMA_NAME,
    JudgePrompts,
    Primitives,
    build_messages,
    response_format,
)
from mmpipe.records.reward import Answer, FrameAnswers, JudgeResult
from mmpipe.reward.stats import AnswerCache, JudgeStats

logger = logging.getLogger(__name__)


class VLMJudge:
    """Scores frames with a VLM: ``judge(frame, primitive) -> JudgeResult``; never raises
    for a server or answer problem (the result is then invalid, with a neutral reward).

    Args:
        client: `JudgeClient` (endpoint, model, timeouts, retries, concurrency).
        task: ``str`` default task description (a row or call may give its own).
        primitives: ``list[str]`` or ``{name: description}``: the available primitives.
        prompts: `JudgePrompts` (the design's questions by default).
        reward: `RewardConfig` (mode, weights, scale, progress term).
        cache_size: ``int`` answers kept (keyed by image bytes + prompt + model settings);
            0 disables the cache.
        image_column, task_column, primitive_column, prev_progress_column: ``str`` the
            columns `score` reads (task/primitive/prev_progress may be absent).
        output_prefix: ``str`` prefix of the columns `score` writes.

    Example::

        # a sketch: a judge server at that URL, frame_uint8_hwc a frame, ds a dataset of frames
        # (docs/how-to/agent-loops.md runs the judge against a local stand-in server)
        judge = VLMJudge(JudgeClient("http://localhost:8000/v1", "Qwen/Qwen3-VL-8B-Instruct"),
                         task="stack the red cube on the green cube",
                         primitives=["reach", "grasp", "lift", "place", "release"])
        r = judge.judge(frame_uint8_hwc, "grasp", prev_progress=0.3)
        r.reward, r.valid, r.action.value, r.progress.value
        scored = ds.map(judge.score, batched=True, batch_size=64)   # num_proc: see `score`
    """

    def __init__(
        self,
        client: JudgeClient,
        *,
        task: str = "",
        primitives: Primitives = (),
        prompts: Optional[JudgePrompts] = None,
        reward: Optional[RewardConfig] = None,
        cache_size: int = 4096,
        image_column: str = "image",
        task_column: str = "task",
        primitive_column: str = "primitive",
        prev_progress_column: str = "prev_progress",
        output_prefix: str = "vlm_",
    ):
        if not isinstance(client, JudgeClient):
            raise TypeError(f"VLMJudge: expected a JudgeClient, found {type(client).__name__}; "
                            "build one with JudgeClient(base_url, model)")
        self.client = client
        self.task = task
        self.primitives = dict(primitives) if hasattr(primitives, "items") else list(primitives)
        self.prompts = prompts or JudgePrompts()
        self.reward = reward or RewardConfig()
        self.cache_size = cache_size
        self.columns = {"image": image_column, "task": task_column, "primitive": primitive_column,
                        "prev_progress": prev_progress_column}
        self.output_prefix = output_prefix
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.cache = AnswerCache(self.cache_size)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        self._closing = threading.Event()  # set by close(); replaced by a fresh one for later use

    def __getstate__(self) -> dict:
        # Settings only: the pool, the cache and the counters stay in their process (this also
        # keeps datasets' fingerprint of `judge.score` a function of the settings).
        return {k: v for k, v in self.__dict__.items() if k not in ("cache", "_pool", "_pool_lock", "_closing")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    @property
    def stats(self) -> JudgeStats:
        """The client's counters (`JudgeStats`); ``judge.stats.snapshot()`` for a dict."""
        return self.client.stats

    def close(self) -> None:
        """Stop sending and return at once: queued frames, unsent questions and retries are
        cancelled, the connections are closed (aborting the requests in flight), and all of
        them are answered ``"cancelled: ..."`` (not scored); the worker threads exit. The
        judge can be used again afterwards."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
            closing, self._closing = self._closing, threading.Event()
        closing.set()
        if pool is not None:
            pool.shutdown(wait=False)  # queued frames see `closing` and return without a request
        self.client.close()

    def pool(self) -> ThreadPoolExecutor:
        """The worker threads (``client.max_concurrency`` of them), started on first use."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.client.max_concurrency, thread_name_prefix="mmpipe-judge")
            return self._pool

    # -- asking ------------------------------------------------------------------------------
    def ask(self, image: Any, primitive: Optional[str], *, task: Optional[str] = None) -> FrameAnswers:
        """Both questions about one frame (blocking); invalid answers instead of exceptions.

        Args:
            image: any image value (see `mmpipe.reward.frames.encode_frame`) or an
                `EncodedFrame`.
            primitive: ``str | None`` the chosen primitive; None makes the action answer
                invalid (only progress is asked).
            task: ``str | None`` task description; None uses ``self.task``.
        """
        return self._ask(image, primitive, task, (self._closing,))

    def _ask(self, image: Any, primitive: Optional[str], task: Optional[str], stops: tuple) -> FrameAnswers:
        """`ask`, sending no question once one of the ``stops`` events is set."""
        t0 = time.monotonic()
        if _stopped(stops):
            return self._cancelled(2, t0)
        try:
            frame = image if isinstance(image, EncodedFrame) else encode_frame(image)
        except Exception as e:  # not an image (ValueError/TypeError), unreadable file, too large, ...
            self.stats.add(queries=2, invalid=2)
            # what is wrong with it, without the encode-stage fix and tags (stored with the answers)
            bad = Answer(error=f"bad frame: {e.message_body() if isinstance(e, InputError) else e}")
            return FrameAnswers(bad, bad, time.monotonic() - t0)
        action = progress = None
        try:
            self.client.connect()  # the one-time openai import is not part of an answer's latency
            t0 = time.monotonic()
            task = self.task if task is None else task
            if primitive is None:
                self.stats.add(queries=1, invalid=1)
                action = Answer(error=f"no primitive for this frame (column {self.columns['primitive']!r} "
                                      "missing or None); pass the chosen primitive's name")
            else:
                action = self._question(frame, self.prompts.render_action(task, self.primitives, str(primitive)),
                                        ACTION_SCHEMA_NAME, ACTION_SCHEMA, stops)
            if _stopped(stops):
                return FrameAnswers(action, self._cancelled(1, t0).progress, time.monotonic() - t0)
            progress = self._question(frame, self.prompts.render_progress(task, self.primitives),
                                      PROGRESS_SCHEMA_NAME, PROGRESS_SCHEMA, stops)
        except Exception as e:  # a bug must not stop a training loop: log it, return invalid (and count it)
            logger.exception("mmpipe VLM judge: unexpected error while asking")
            bad = Answer(error=f"unexpected {type(e).__name__}: {e}")
            self.stats.add(invalid=(action is None) + (progress is None))  # an answer already given stays
            return FrameAnswers(bad if action is None else action, bad if progress is None else progress,
                                time.monotonic() - t0)
        return FrameAnswers(action, progress, time.monotonic() - t0)

    def _cancelled(self, questions: int, t0: float) -> FrameAnswers:
        self.stats.add(cancelled=questions)
        bad = Answer(error="cancelled: not sent (the judge was closed or the call interrupted); not scored")
        return FrameAnswers(bad, bad, time.monotonic() - t0)

    def _question(self, frame: EncodedFrame, prompt: str, name: str, schema: dict, stops: tuple = ()) -> Answer:
        key = AnswerCache.key(self.client.settings(), self.client.logprobs, self.prompts.system, frame.sha256,
                              prompt, name, schema)
        self.stats.add(queries=1)
        hit = self.cache.get(key)
        if hit is not None:
            self.stats.add(cache_hits=1)
            return replace(hit, cached=True, latency_s=0.0, attempts=0)
        reply = self.client.complete(build_messages(frame.url, prompt, self.prompts.system),
                                     response_format(name, schema), cancelled=lambda: _stopped(stops))
        self.stats.latency(reply.latency_s)
        raw, dropped = clip_raw(reply.text)  # parsed whole, stored capped (RAW_TEXT_LIMIT)
        self.stats.add(raw_truncated_chars=dropped)
        if reply.error is not None:
            self.stats.add(invalid=1)
            return Answer(raw=raw, error=reply.error, latency_s=reply.latency_s, attempts=reply.attempts)
        value, error = (parse_action(reply.text, reply.p_true) if name == ACTION_SCHEMA_NAME
                        else parse_progress(reply.text))
        if value is None:
            self.stats.add(invalid=1, unparsable=1)
            if reply.finish_reason == "length":
                error += (f"; the answer was cut at max_tokens={self.client.max_tokens} "
                          "(finish_reason 'length'): raise it")
            return Answer(raw=raw, error=error, latency_s=reply.latency_s, attempts=reply.attempts)
        answer = Answer(value=value, raw=raw, latency_s=reply.latency_s, attempts=reply.attempts)
        self.cache.put(key, answer)
        return answer

    def submit(self, image: Any, primitive: Optional[str], *, task: Optional[str] = None,
               cancel: Optional[threading.Event] = None) -> "Future[FrameAnswers]":
        """`ask` on the judge's thread pool; the future never raises. When ``cancel`` is set
        (or the judge is closed) before the frame's questions are sent, they are not sent
        (answers ``"cancelled: ..."``, not scored)."""
        stops = (self._closing,) if cancel is None else (self._closing, cancel)
        return self.pool().submit(self._ask, image, primitive, task, stops)  # never raises: `_ask` catches

    def ask_many(self, images: Sequence[Any], primitives: Sequence[Optional[str]],
                 tasks: Optional[Sequence[Optional[str]]] = None) -> list[FrameAnswers]:
        """`ask` for many frames concurrently, in order. At most ``client.max_concurrency``
        frames are handed to the threads at a time; on an exception here (``KeyboardInterrupt``)
        the frames not yet sent are cancelled before it propagates."""
        n = len(images)
        tasks = list(tasks) if tasks is not None else [None] * n
        if not len(primitives) == len(tasks) == n:
            raise ArgumentError(f"ask_many: expected equal lengths, found {n} images, {len(primitives)} primitives, "
                                f"{len(tasks)} tasks")
        cancel, slots = threading.Event(), threading.BoundedSemaphore(self.client.max_concurrency)
        stops = (self._closing, cancel)  # a close() during the call cancels the rest of it
        futures = []
        try:
            for img, prim, task in zip(images, primitives, tasks):
                slots.acquire()
                futures.append(self.pool().submit(self._ask, img, prim, task, stops))
                futures[-1].add_done_callback(lambda f: slots.release())
            return [f.result() for f in futures]
        except BaseException:
            cancel.set()
            raise

    # -- scoring -----------------------------------------------------------------------------
    def result(self, answers: FrameAnswers, prev_progress: Optional[float] = None) -> JudgeResult:
        """Reward arithmetic (`RewardConfig`) on asked answers -> `JudgeResult`."""
        parts = combine(answers.action.value, answers.progress.value, prev_progress, self.reward)
        return JudgeResult(
            reward=parts.reward, parts=parts, action=answers.action, progress=answers.progress,
            valid=answers.valid, latency_s=answers.latency_s,
            cache_hit=answers.action.cached and answers.progress.cached,
        )

    def judge(self, image: Any, primitive: Optional[str], *, task: Optional[str] = None,
              prev_progress: Optional[float] = None) -> JudgeResult:
        """Score one frame (blocking). ``prev_progress``: the episode's previous progress."""
        return self.result(self.ask(image, primitive, task=task), prev_progress)

    def judge_many(self, images: Sequence[Any], primitives: Sequence[Optional[str]],
                   tasks: Optional[Sequence[Optional[str]]] = None,
                   prev_progress: Optional[Sequence[Optional[float]]] = None) -> list[JudgeResult]:
        """Score many frames concurrently; results in input order."""
        prev = list(prev_progress) if prev_progress is not None else [None] * len(images)
        if len(prev) != len(images):  # zip would drop the frames past the shorter list
            raise ArgumentError(f"judge_many: expected one prev_progress per image, found {len(images)} images and "
                                f"{len(prev)} prev_progress values; pass None for frames without a previous progress")
        answers = self.ask_many(images, primitives, tasks)
        return [self.result(a, p) for a, p in zip(answers, prev)]

    def score(self, batch: dict[str, list]) -> dict[str, list]:
        """The dataset stage, ``ds.map(judge.score, batched=True, batch_size=...)``: see
        `mmpipe.reward.dataset.score_batch` (columns read and written, ``num_proc``)."""
        return score_batch(self, batch)


def _stopped(stops: tuple) -> bool:
    return any(e.is_set() for e in stops)
