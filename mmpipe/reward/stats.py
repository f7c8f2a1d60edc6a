"""Thread-safe counters and the answer cache of a judge."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict, deque
from typing import Any, Optional

import numpy as np


class JudgeStats:
    """Counters of one judge (shared by all its threads).

    Counted per question (two per frame): ``queries`` (asked, cached ones included),
    ``cache_hits``, ``invalid`` (answers that ended invalid: transport failure or
    unparsable), ``unparsable``. Per HTTP request: ``requests``, ``retries``, ``timeouts``,
    ``connection_errors``, ``http_errors`` (by status). ``raw_truncated_chars``: characters of
    answers not kept in `Answer.raw` (`mmpipe.reward.parsing.RAW_TEXT_LIMIT`); ``cancelled``:
    questions not sent because the judge was closed or the call interrupted, and requests
    cut in flight by ``close()``. ``latency`` percentiles are over
    uncached questions (wall time including retries), from the last ``window`` of them.
    """

    def __init__(self, window: int = 100_000):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._http: Counter = Counter()
        self._latency: deque = deque(maxlen=window)

    def add(self, **counts: int) -> None:
        with self._lock:
            self._counts.update({k: v for k, v in counts.items() if v})

    def http_error(self, status: int) -> None:
        with self._lock:
            self._http[int(status)] += 1

    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latency.append(float(seconds))

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, Any]:
        """``{"queries", "requests", "cache_hits", "invalid", "unparsable", "timeouts",
        "retries", "connection_errors", "raw_truncated_chars", "cancelled", "http_errors": {status: n}, "latency_s": {"p50",
        "p90", "p99", "max", "n"}}`` (latency values None before the first answer)."""
        with self._lock:
            counts = dict(self._counts)
            http = dict(self._http)
            lat = np.asarray(self._latency, dtype=np.float64)
        out = {k: counts.get(k, 0) for k in
               ("queries", "requests", "cache_hits", "invalid", "unparsable", "timeouts", "retries",
                "connection_errors", "raw_truncated_chars", "cancelled")}
        out["http_errors"] = http
        pct = np.percentile(lat, [50, 90, 99]).tolist() if lat.size else [None] * 3
        out["latency_s"] = {"p50": pct[0], "p90": pct[1], "p99": pct[2],
                            "max": float(lat.max()) if lat.size else None, "n": int(lat.size)}
        return out

    def scalars(self, prefix: str = "judge/") -> dict[str, float]:
        """The snapshot as flat ``{tag: number}`` for scalar loggers: every counter,
        ``http_errors/<status>``, ``latency_s/p50`` ... (latency left out before the first
        answer), plus ``invalid_rate`` (invalid / queries) and ``cache_hit_rate``."""
        snap = self.snapshot()
        out = {prefix + k: float(v) for k, v in snap.items() if isinstance(v, (int, float))}
        out.update({f"{prefix}http_errors/{status}": float(n) for status, n in snap["http_errors"].items()})
        out.update({f"{prefix}latency_s/{k}": float(v) for k, v in snap["latency_s"].items() if v is not None})
        q = snap["queries"]
        out[prefix + "invalid_rate"] = snap["invalid"] / q if q else 0.0
        out[prefix + "cache_hit_rate"] = snap["cache_hits"] / q if q else 0.0
        return out

    def log_to(self, writer: Any, step: int, prefix: str = "judge/") -> dict[str, float]:
        """Write `scalars` at ``step`` through ``writer.add_scalar(tag, value, step)``: a
        ``torch.utils.tensorboard.SummaryWriter`` (see `tensorboard_writer`; the ``tensorboard``
        extra), a tensorboardX writer, or any object with that method (for wandb:
        ``wandb.log(stats.scalars(), step=step)``). Returns what was written."""
        values = self.scalars(prefix)
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)
        return values

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._http.clear()
            self._latency.clear()


class AnswerCache:
    """LRU map from a question's key to its parsed answer; ``maxsize=0`` disables it.

    Only valid answers are stored: a failure is retried the next time it is asked.
    """

    def __init__(self, maxsize: int = 4096):
        self.maxsize = int(maxsize)
        self._lock = threading.Lock()
        self._data: OrderedDict = OrderedDict()

    @staticmethod
    def key(*parts: Any) -> str:
        """sha256 over the JSON of ``parts`` (model, image digest, prompt, schema, sampling)."""
        blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> Optional[Any]:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: str, value: Any) -> None:
        if self.maxsize <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def tensorboard_writer(logdir: str):
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``logdir`` (needs the ``tensorboard``
    package: ``pip install mmpipe[tensorboard]``); use with `JudgeStats.log_to`."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(f"logging judge statistics to TensorBoard needs the tensorboard package ({e}); "
                          "pip install 'mmpipe[tensorboard]' (or pip install tensorboard)") from None
    return SummaryWriter(log_dir=str(logdir))
