"""The judge's answer parser against the reply's length (issue 15's brace-heavy replies; issue 29.3
moved the wall-clock part here from tests/reward/test_judge_faults.py). Info lines, nothing timed
is asserted.

Each brace-heavy shape (every '{' a possible JSON start; a `JSONDecodeError` counted lines up to
its position, so the old search was quadratic) is parsed at 0.5, 1 and 2 MB (``--quick``: 50, 100
and 200 kB) with `mmpipe.reward.parse_action`, a valid answer at the end. Each line gives the
median at that size and the ratio per doubling, t(2n) / t(n): linear is 2.0, quadratic 4.0. The
unit test checks the same property with a count (characters handed to the JSON decoder), which
does not change with the machine's load; these lines give the seconds.
"""

from __future__ import annotations

from mmpipe.testing.judge_replies import BRACE_HEAVY

from .report import Result, fig, fmt_time
from .timing import side_by_side

GOOD = ' {"reasonable": true, "confidence": 0.5}'
MB = 1_000_000
SHAPES = BRACE_HEAVY  # the replies tests/reward/test_judge_faults.py counts work on
SIZES = (MB // 2, MB, 2 * MB)
QUICK_SIZES = (50_000, 100_000, 200_000)


def case_judge_parse(ctx) -> list:
    from mmpipe.reward import parse_action

    sizes = QUICK_SIZES if ctx.quick else SIZES
    out: list[Result] = []
    for shape, make in SHAPES.items():
        texts = {n: make(n) + GOOD for n in sizes}
        outcome = {}
        for n, text in texts.items():  # a result, never an exception: valid or invalid with a reason
            value, error = parse_action(text)
            assert (value is None) != (error is None), (shape, n)
            outcome[n] = "valid" if value is not None else "invalid"
        timings = side_by_side({n: (lambda t=texts[n]: parse_action(t)) for n in sizes}, repeat=ctx.repeat,
                               warmup=1, min_time=0.05)  # a sample: at least 50 ms of back-to-back calls
        prev = None
        for n in sizes:
            t = timings[n]
            per = None if prev is None else t.median / timings[prev].median
            ctx.log(f"  judge_parse {shape!r} {n / MB:.2f} MB: {fmt_time(t.median)} ({outcome[n]})"
                    + ("" if per is None else f"; {per:.2f}x per doubling"))
            out.append(Result(
                f"judge parse {shape}: {n / MB:.2f} MB", fig(t), "-", per,
                "-" if per is None else f"{per:.2f}x / doubling", "(info)", None, None,
                {"shape": shape, "chars": len(texts[n]), "outcome": outcome[n], "per_doubling": per,
                 "timing": {"mmpipe": t.to_json()}},
                "- (t(2n)/t(n): linear 2.0, quadratic 4.0)",
                load=(sorted(t.other_cores)[len(t.other_cores) // 2] if t.other_cores else None)))
            prev = n
    return out
