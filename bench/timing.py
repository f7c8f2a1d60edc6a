"""Side-by-side timing on a noisy shared machine.

Contenders run in rotated order (A B C, B C A, C A B, ...) so neither always goes first (warm
caches, a burst of load from another process hit all alike). Every sample records the load:
how many cores other processes kept busy while it ran (from /proc/stat, less this process's
own and its waited-for children's CPU time) and the 1-minute load average. A figure is the
median of the samples, shown with its spread (min / median / max; the quartiles are in the
JSON); the ratio of two contenders is the ratio of their medians, and the spread of the
paired ratios (sample k of A over sample k of B) is kept too.
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
    times: list[float]  # seconds per call, one per sample, in sample order
    other_cores: list[float] = field(default_factory=list)  # other processes' busy cores per sample
    loadavg: list[float] = field(default_factory=list)  # 1-minute load average after each sample

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def worst(self) -> float:
        return max(self.times)

    def quartiles(self) -> tuple[float, float]:
        if len(self.times) < 2:
            return self.times[0], self.times[0]
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return q[0], q[2]

    def to_json(self) -> dict:
        q1, q3 = self.quartiles()
        return {"median_s": self.median, "min_s": self.best, "max_s": self.worst, "q1_s": q1, "q3_s": q3,
                "times_s": self.times, "other_cores_busy": [round(x, 2) for x in self.other_cores],
                "loadavg_1min": [round(x, 2) for x in self.loadavg]}


def paired_ratios(num: Timing, den: Timing) -> list[float]:
    """Sample-by-sample ``num / den`` (the samples of one rotation were taken back to back)."""
    return [a / b for a, b in zip(num.times, den.times)]


def side_by_side(contenders: dict[str, Callable[[], object]], *, repeat: int = 5, warmup: int = 1,
                 min_time: float = 0.0) -> dict[str, Timing]:
    """Time each callable ``repeat`` times in rotated order; returns name -> `Timing`.

    A sample runs the callable ``k`` times where ``k`` is picked after the warm-up so that one
    sample takes at least ``min_time`` seconds (small functions, timeit style); times are per call.
    """
    loops = {}
    for name, fn in contenders.items():
        t = 0.0
        for _ in range(warmup):
            s = time.perf_counter()
            fn()
            t = time.perf_counter() - s
        loops[name] = max(1, int(min_time / t) + 1) if (min_time and 0 < t < min_time) else 1
    out = {name: Timing([]) for name in contenders}
    names = list(contenders)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, k = contenders[name], loops[name]
            gc.collect()
            gc.disable()
            try:
                with OtherLoad() as other:
                    s = time.perf_counter()
                    for _ in range(k):
                        fn()
                    el = time.perf_counter() - s
            finally:
                gc.enable()
            out[name].times.append(el / k)
            out[name].other_cores.append(other.cores)
            out[name].loadavg.append(os.getloadavg()[0])
    return out


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
    time on the machine (/proc/stat) less this process's own and its children's. Coarse
    (10 ms jiffies): read it over blocks of 0.1 s and more."""

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
