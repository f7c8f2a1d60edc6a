"""Side-by-side timing on a noisy shared machine.

Contenders are run interleaved (A, B, A, B, ...) so a burst of load from another process hits
both alike; each figure is the best (minimum) of its repeats, the usual estimate of the cost
on an unloaded machine, and the median is kept too (in the JSON).
"""

from __future__ import annotations

import gc
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
