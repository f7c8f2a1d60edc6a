"""Side-by-side timing on a noisy shared machine.

Contenders are run interleaved (A, B, A, B, ...) so a burst of load from another process hits
both alike; each figure is the best (minimum) of its repeats, the usual estimate of the cost
on an unloaded machine, and the median is kept too (in the JSON).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Timing:
    best: float  # seconds
    median: float
    times: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"best_s": self.best, "median_s": self.median, "times_s": self.times}


def side_by_side(contenders: dict[str, Callable[[], object]], *, repeat: int = 5, warmup: int = 1,
                 min_time: float = 0.0) -> dict[str, Timing]:
    """Time each callable ``repeat`` times, interleaved; returns name -> `Timing`.

    A repeat runs the callable ``k`` times where ``k`` is picked after the warm-up so that one
    repeat takes at least ``min_time`` seconds (small functions); times are per call.
    """
    loops = {}
    for name, fn in contenders.items():
        t = 0.0
        for _ in range(max(warmup, 1)):
            s = time.perf_counter()
            fn()
            t = time.perf_counter() - s
        loops[name] = max(1, int(min_time / t) + 1) if (min_time and t < min_time) else 1
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            k = loops[name]
            gc.collect()
            gc.disable()
            try:
                s = time.perf_counter()
                for _ in range(k):
                    fn()
                times[name].append((time.perf_counter() - s) / k)
            finally:
                gc.enable()
    return {name: Timing(min(ts), statistics.median(ts), ts) for name, ts in times.items()}


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]), idle


def others_busy(seconds: float = 0.5) -> float:
    """CPU cores kept busy by other processes while this one sleeps for ``seconds``
    (from /proc/stat); 0.0 where /proc/stat is missing."""
    try:
        t0, i0 = _cpu_jiffies()
        time.sleep(seconds)
        t1, i1 = _cpu_jiffies()
    except OSError:
        return 0.0
    n = os.cpu_count() or 1
    total = (t1 - t0) / n  # jiffies per core in the interval
    return max(0.0, ((t1 - t0) - (i1 - i0)) / total) if total else 0.0


def wait_for_quiet(max_wait: float, threshold: float = 0.3, log=None) -> tuple[float, float]:
    """Wait (at most ``max_wait`` s) until other processes use < ``threshold`` cores.
    Returns (seconds waited, the last load seen in cores)."""
    start = time.time()
    busy = others_busy()
    while busy >= threshold and time.time() - start < max_wait:
        if log:
            log(f"[bench] other processes use {busy:.1f} cores; waiting for a quieter moment")
        time.sleep(2.0)
        busy = others_busy()
    return time.time() - start, busy


class OtherLoad:
    """Average number of cores other processes kept busy while a block ran: all busy CPU
    time on the machine (/proc/stat) less this process's own and its children's."""

    def __enter__(self) -> "OtherLoad":
        self.cores = 0.0
        try:
            self._j0 = _cpu_jiffies()
        except OSError:
            self._j0 = None
        self._t0, self._w0 = os.times(), time.time()
        return self

    def __exit__(self, *exc) -> None:
        if self._j0 is None:
            return
        (t0, i0), (t1, i1) = self._j0, _cpu_jiffies()
        busy = ((t1 - t0) - (i1 - i0)) / os.sysconf("SC_CLK_TCK")
        a, b = self._t0, os.times()
        ours = sum(b[k] - a[k] for k in range(4))  # user, system, children's user, system
        wall = time.time() - self._w0
        self.cores = max(0.0, (busy - ours) / wall) if wall > 0 else 0.0
