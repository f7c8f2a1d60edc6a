"""Chat-completions transport to an OpenAI-compatible server (``vllm serve``, SGLang, ...).

Uses the official ``openai`` package (imported on first request; ``pip install
"mmpipe[judge]"``) with its own retries switched off: this client retries only transport
errors (connection refused/dropped, timeouts), HTTP 429 and HTTP 5xx, with exponential
backoff (honouring ``Retry-After`` on 429), and never 4xx such as 400 (the same request
would fail again). Failures come back as a `Reply` with ``error`` set, never raised.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import threading
import time
from typing import Any, Callable, Optional

from mmpipe.errors import ArgumentError, is_finite_number, is_integer
from mmpipe.reward.deadline import RequestDeadline
from mmpipe.reward.parsing import verdict_probability
from mmpipe.records.reward import Reply
from mmpipe.reward.stats import JudgeStats

logger = logging.getLogger(__name__)
PIP_HINT = 'pip install "mmpipe[judge]"  (or: pip install openai)'


class _DeadlinePassed(Exception):
    """The request's socket was shut down at its deadline (reported as a timeout)."""


class _Aborted(Exception):
    """`JudgeClient.close` shut the request's socket down while it was in flight."""


def require_openai() -> None:
    """Raise ImportError naming the pip command when the ``openai`` package is missing."""
    if importlib.util.find_spec("openai") is None:
        raise ImportError(f"the VLM judge needs the 'openai' package, which is not installed; {PIP_HINT}")


class JudgeClient:
    """One OpenAI-compatible endpoint and model, with bounded concurrency and retries.

    Args:
        base_url: ``str`` e.g. ``"http://localhost:8000/v1"`` (the ``/v1`` root).
        model: ``str`` the served model name (``vllm serve`` prints it; ``GET /v1/models``).
        api_key: ``str | None``; None uses ``$OPENAI_API_KEY`` if set, else a placeholder
            (servers started without ``--api-key`` accept any value).
        timeout_s: ``float`` deadline of each HTTP request, in seconds: from sending to the
            last byte of the answer (a server that drips bytes is cut off), and the limit of
            each connect/read/write. Each retry gets its own ``timeout_s``.
        max_retries: ``int`` extra attempts after a transport error, 429 or 5xx.
        backoff_s: ``float`` first backoff; attempt k waits ``backoff_s * 2**k``, jittered
            to 50-100%, at most ``max_backoff_s`` (a 429's ``Retry-After``, capped, wins).
        max_concurrency: ``int`` most requests in flight at once from this client (all
            threads together).
        temperature, max_tokens: sampling settings sent with every question.
        logprobs: ``bool`` ask for token log-probabilities (``top_logprobs`` alternatives) to
            compute `Reply.p_true`.
        use_response_format: ``bool`` send ``response_format`` json_schema (switch off only
            for a server that rejects it with a 400).
        extra_body: ``dict | None`` extra JSON fields, e.g.
            ``{"chat_template_kwargs": {"enable_thinking": False}}`` for Qwen3 thinking models.
        stats: `JudgeStats` to count into (a fresh one by default).

    Raises:
        ImportError: ``openai`` is not installed (names the pip command).
        ValueError: a setting is out of range.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: Optional[str] = None,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 8,
        temperature: float = 0.0,
        max_tokens: int = 256,
        logprobs: bool = False,
        top_logprobs: int = 5,
        use_response_format: bool = True,
        extra_body: Optional[dict] = None,
        stats: Optional[JudgeStats] = None,
    ):
        require_openai()
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ArgumentError(
                f"JudgeClient: expected max_concurrency >= 1, max_retries >= 0, timeout_s > 0; found "
                f"{max_concurrency}, {max_retries}, {timeout_s}"
            )
        check_sampling(temperature=temperature, max_tokens=max_tokens, top_logprobs=top_logprobs)
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.logprobs, self.top_logprobs = bool(logprobs), int(top_logprobs)
        self.use_response_format = use_response_format
        self.extra_body = dict(extra_body or {})
        self.stats = stats or JudgeStats()
        self._init_runtime()

    # -- pickling: settings travel, connections/locks/counters are rebuilt --------------------
    def _init_runtime(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._client_lock = threading.Lock()
        self._client = None
        self._deadline = RequestDeadline()

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_slots", "_client_lock", "_client", "stats", "_deadline")}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.stats = JudgeStats()
        self._init_runtime()

    def __repr__(self) -> str:
        return f"JudgeClient(base_url={self.base_url!r}, model={self.model!r}, max_concurrency={self.max_concurrency})"

    def settings(self) -> dict:
        """What changes an answer (part of every cache key)."""
        return {"base_url": self.base_url, "model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "extra_body": self.extra_body,
                "response_format": self.use_response_format}

    def connect(self) -> None:
        """Import ``openai`` and build its client now (otherwise done by the first request),
        so that the first answer's latency does not include them (~0.5 s)."""
        self._openai()

    def _openai(self):
        with self._client_lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as e:  # pragma: no cover - checked in __init__
                    raise ImportError(f"the VLM judge needs the 'openai' package; {PIP_HINT}") from e
                # Servers started without --api-key accept any key, but the client needs one.
                key = self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
                http = openai.DefaultHttpxClient(event_hooks=self._deadline.event_hooks())
                self._client = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=self.timeout_s,
                                             max_retries=0, http_client=http)
            return self._client

    def close(self) -> None:
        """Close the HTTP connections, ending the requests in flight at once (answered
        ``"cancelled: ..."``, not retried); a later request reopens them."""
        self._deadline.abort()  # a closed socket does not wake its blocked reader; a shut down one does
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- one question -----------------------------------------------------------------------
    def complete(self, messages: list[dict], response_format: Optional[dict] = None, *,
                 cancelled: Optional[Callable[[], bool]] = None) -> Reply:
        """Send one chat completion; retry transport errors, 429 and 5xx; never raise.

        Args:
            messages: OpenAI chat messages (see `mmpipe.reward.prompts.build_messages`).
            response_format: ``{"type": "json_schema", ...}`` or None.
            cancelled: ``() -> bool``; once true, no retry is sent (nor a backoff slept out)
                and a failed attempt is reported as ``"cancelled: ..."``.

        Returns:
            `Reply`: ``text`` on success, else ``error`` (with the attempts made).
        """
        import openai

        kwargs = self._request(messages, response_format)
        t0 = time.monotonic()
        error, status, delay = None, None, 0.0
        cancelled = cancelled or (lambda: False)
        for attempt in range(self.max_retries + 1):
            if attempt:
                if _sleep(delay, cancelled):
                    return self._failed(f"cancelled: not retried ({error})", status, attempt, t0)
                self.stats.add(retries=1)
            self.stats.add(requests=1)
            retry_after = None
            try:
                resp = self._send(kwargs, cancelled)
            except _Aborted:
                self.stats.add(cancelled=1)
                return self._failed("cancelled: the client was closed while the request was in flight; not scored",
                                    None, attempt + 1, t0)
            except (openai.APITimeoutError, _DeadlinePassed):
                self.stats.add(timeouts=1)
                error, status = f"timeout: no answer within timeout_s={self.timeout_s}", None
            except openai.APIConnectionError as e:
                self.stats.add(connection_errors=1)
                cause = e.__cause__ or e
                error, status = f"connection error ({type(cause).__name__}: {cause})", None
            except openai.APIStatusError as e:
                status = e.status_code
                self.stats.http_error(status)
                error = f"HTTP {status}: {_body(e)}"
                if status != 429 and status < 500:
                    return self._failed(error, status, attempt + 1, t0)
                retry_after = _retry_after(e)
            except Exception as e:  # a malformed response body etc.: retrying will not help
                body = getattr(e, "doc", None)  # json.JSONDecodeError keeps the text it failed on
                return self._failed(f"unreadable response ({type(e).__name__}: {e})", status, attempt + 1, t0,
                                    text=body if isinstance(body, str) else "")
            else:
                return self._reply(resp, attempt + 1, t0)
            if cancelled():  # e.g. the judge closed the connections under this request
                return self._failed(f"cancelled: {error}", status, attempt + 1, t0)
            delay = self._backoff(attempt, retry_after)
            if attempt < self.max_retries:
                logger.debug("judge request failed (%s); retry %d/%d in %.2f s", error, attempt + 1,
                             self.max_retries, delay)
        return self._failed(error, status, self.max_retries + 1, t0)

    def _request(self, messages: list[dict], response_format: Optional[dict]) -> dict[str, Any]:
        """The keyword arguments of one ``chat.completions.create`` call: model, messages,
        temperature, max_tokens, plus ``response_format`` (when the client uses it),
        ``logprobs`` / ``top_logprobs`` and ``extra_body`` as configured."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature,
                                  "max_tokens": self.max_tokens}
        if response_format is not None and self.use_response_format:
            kwargs["response_format"] = response_format
        if self.logprobs:
            kwargs.update(logprobs=True, top_logprobs=self.top_logprobs)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def _send(self, kwargs: dict, cancelled: Callable[[], bool] = lambda: False) -> Any:
        """One HTTP request in a concurrency slot, cut off at its deadline (`_DeadlinePassed`)
        or by `close` (`_Aborted`)."""
        with self._slots, self._deadline.guard(self.timeout_s) as guard:
            # A close() between the caller's stop check and this guard's registration is not in
            # what `RequestDeadline.abort` cut: the caller's stop is set before it, so look again
            # (a close() after the registration marks the guard, whose later sockets are cut).
            if guard.aborted or cancelled():
                raise _Aborted()
            try:
                return self._openai().chat.completions.create(**kwargs)
            except Exception:
                if guard.aborted:  # close() shut the socket down
                    raise _Aborted() from None
                if guard.fired:  # the socket was shut down at the deadline
                    raise _DeadlinePassed() from None
                raise

    def _backoff(self, attempt: int, retry_after: Optional[float]) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s) * random.uniform(0.5, 1.0)

    def _reply(self, resp: Any, attempts: int, t0: float) -> Reply:
        latency = time.monotonic() - t0
        choices = getattr(resp, "choices", None) or []
        if not choices:
            return Reply(error="the server returned no choices", status=200, attempts=attempts, latency_s=latency)
        choice = choices[0]
        text = getattr(choice.message, "content", None) or ""
        try:
            p_true = verdict_probability(getattr(getattr(choice, "logprobs", None), "content", None))
        except (TypeError, ValueError, OverflowError):  # odd logprobs: keep the answer, drop p_true
            p_true = None
        return Reply(text=text, status=200, attempts=attempts, latency_s=latency, p_true=p_true,
                     finish_reason=getattr(choice, "finish_reason", None))

    def _failed(self, error: str, status: Optional[int], attempts: int, t0: float, text: str = "") -> Reply:
        if attempts > 1:
            error = f"{error} (after {attempts} attempts)"
        return Reply(text=text, error=error, status=status, attempts=attempts, latency_s=time.monotonic() - t0)


def _sleep(seconds: float, cancelled: Callable[[], bool]) -> bool:
    """Sleep ``seconds`` unless ``cancelled()`` turns true first (checked every 50 ms); True if cancelled."""
    end = time.monotonic() + seconds
    while not cancelled():
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.05))
    return True


def _body(e: Any, limit: int = 300) -> str:
    resp = getattr(e, "response", None)
    try:
        text = resp.text if resp is not None else str(e)
    except Exception:  # a streamed or closed body
        text = str(e)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _retry_after(e: Any) -> Optional[float]:
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    for name, unit in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            value = headers.get(name)
            if value is not None and float(value) == float(value):  # "nan" parses but cannot be slept
                return float(value) * unit
        except (TypeError, ValueError):
            continue
    return None


def check_sampling(*, temperature, max_tokens, top_logprobs) -> None:
    """`ArgumentError` for judge sampling settings a server would refuse on every question (or,
    for ``max_tokens=0``, answer with nothing): ``temperature`` a finite number >= 0,
    ``max_tokens`` an int >= 1, ``top_logprobs`` an int in 0..20 (the OpenAI limit)."""
    bad = []
    if not is_finite_number(temperature) or temperature < 0:
        bad.append(f"temperature={temperature!r} (a finite number >= 0)")
    if not is_integer(max_tokens) or max_tokens < 1:
        bad.append(f"max_tokens={max_tokens!r} (an int >= 1: the judge's answer must fit)")
    if not is_integer(top_logprobs) or not 0 <= top_logprobs <= 20:
        bad.append(f"top_logprobs={top_logprobs!r} (an int in 0..20)")
    if bad:
        raise ArgumentError(f"JudgeClient: {', '.join(bad)}; e.g. JudgeClient(..., temperature=0.0, max_tokens=256)")
