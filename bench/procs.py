"""Run a command in a fresh process and measure the whole process tree: wall time and the peak
of the summed RSS of the process and all its descendants (``datasets`` map workers,
DataLoader workers), polled from /proc every ``interval`` seconds. A tree that grows past
``cap_mib`` is killed (the machine is shared): the result then says so."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass
class TreeRun:
    wall_s: float
    peak_mib: float
    returncode: int
    stdout: str
    stderr: str
    capped: bool


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_rss_mib(pid: int) -> float:
    """Summed VmRSS of ``pid`` and its descendants (MiB)."""
    kids, todo, total = _children(), [pid], 0.0
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0) / 1024
        except OSError:
            pass
    return total


def run_tree(cmd: list[str], *, cwd: str, cap_mib: float = 6144, timeout: float = 600, interval: float = 0.1,
             env=None) -> TreeRun:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    peak, capped = 0.0, False
    import threading

    out: dict[str, str] = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate())))
    reader.start()
    while proc.poll() is None:
        peak = max(peak, tree_rss_mib(proc.pid))
        if peak > cap_mib or time.perf_counter() - t0 > timeout:
            capped = peak > cap_mib
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its workers only
            break
        time.sleep(interval)
    reader.join()
    return TreeRun(time.perf_counter() - t0, peak, proc.returncode, out.get("stdout", ""), out.get("stderr", ""),
                   capped)
