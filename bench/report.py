"""Result lines and the printed table: each line names its baseline, shows medians with their
spread (min-max over the samples), the issue-18 target, met or not, and the floor that
stops a missed target."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from .timing import Timing, paired_ratios


@dataclass
class Result:
    """One line of the table."""

    case: str
    mmpipe: str  # the figure, formatted with its unit: "median [min-max] unit"
    baseline: str
    ratio: Optional[float]  # how the figures compare (ratio of medians), oriented as in `target`
    ratio_text: str
    target: str
    met: Optional[bool]  # None: no target
    identical: Optional[bool]  # outputs checked equal before timing; None: nothing to compare
    detail: dict = field(default_factory=dict)
    baseline_name: str = "-"  # what the baseline is (the peer's strongest path)
    floor: str = ""  # where a target is missed: what stops it
    load: Optional[float] = None  # median cores other processes kept busy during the samples

    def to_json(self) -> dict:
        return asdict(self)


def fmt_time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def fig(t: Timing, per: float = 0.0, unit: str = "") -> str:
    """``median [min-max]``: as time per call, or as ``per / time`` items per second."""
    if per:
        return f"{_num(per / t.median)} [{_num(per / t.worst)}-{_num(per / t.best)}] {unit}/s"
    if t.median < 1:
        return f"{t.median * 1e3:.2f} [{t.best * 1e3:.2f}-{t.worst * 1e3:.2f}] ms"
    return f"{t.median:.2f} [{t.best:.2f}-{t.worst:.2f}] s"


def speed(case: str, mm: Timing, base: Timing, baseline_name: str, *, target: Optional[float], identical,
          per: float = 0.0, unit: str = "rows", floor: str = "", detail: Optional[dict] = None) -> Result:
    """A speed line: ratio = baseline median time / mmpipe median time (paired spread in
    the text). ``target`` None: an info line."""
    ratio = base.median / mm.median
    pr = paired_ratios(base, mm)
    txt = f"{ratio:.2f}x [{min(pr):.2f}-{max(pr):.2f}]" if len(pr) > 1 else f"{ratio:.2f}x"
    d = dict(detail or {})
    d.setdefault("timing", {"mmpipe": mm.to_json(), "baseline": base.to_json()})
    met = None if target is None else ratio >= target
    load = statistics.median(mm.other_cores + base.other_cores) if mm.other_cores else None
    return Result(case, fig(mm, per, unit), fig(base, per, unit), ratio, txt,
                  "(info)" if target is None else f">= {target:g}x", met, identical, d, baseline_name,
                  floor if (met is False or target is None) else "", load)


def format_table(results: list) -> str:
    """The table; each missed target's floor (what stops it) is a numbered note under it."""
    head = ("case", "baseline", "mmpipe (median [min-max])", "baseline (median [min-max])", "ratio [spread]",
            "target", "met?", "identical?", "load", "floor")
    yn = {True: "yes", False: "NO", None: "-"}
    notes: list[str] = []
    lines = []
    for r in results:
        mark = ""
        if r.floor:
            if r.floor not in notes:
                notes.append(r.floor)
            mark = f"[{notes.index(r.floor) + 1}]"
        load = r.load if r.load is not None else r.detail.get("other_cores_busy_during")
        lines.append((r.case, r.baseline_name, r.mmpipe, r.baseline, r.ratio_text, r.target, yn[r.met],
                      yn[r.identical], "-" if load is None else f"{load:.1f}", mark))
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    fmt = " | ".join(f"{{:{'<' if i in (0, 1, 9) else '>'}{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    out += [fmt.format(*map(str, x)).rstrip() for x in lines]
    if notes:
        out += ["", "floors (what stops a missed target):"] + [f"[{i}] {t}" for i, t in enumerate(notes, 1)]
    return "\n".join(out)
