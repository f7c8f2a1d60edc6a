"""Encode time against conversation length, labels on (issue 29.2): a label locator that
re-rendered every prefix was quadratic in turns (1,000 -> 2,000 turns took ~3.5x; a 10,000-turn
row ran past 180 s); the rebuilt one (`mmpipe.encoding.spans`: two renders per row) should be
linear. Info lines, nothing timed is asserted.

Per family (a Qwen family, GLM-4.1V and a tiled family, Gemma 3), text rows of 1k, 2k, 4k and 8k
turns (a turn = one message; user and assistant alternate, so half the turns are labelled) are
encoded with ``mmpipe.encode_row(row, processor, labels=True)`` and, beside it in the same
rotation, with ``labels=False`` (the same ids, no label locator). Each line gives both medians and
the ratio per doubling, t(2n) / t(n), for labels on (the line's ratio) and off (in the text):
linear is 2.0, quadratic 4.0. One more line per family encodes the bad-input corpus's
10,000-turn row once with labels on.

Outputs are checked before timing: with labels on and off the ids are equal, every assistant
turn's tokens are labelled (the labelled count grows with the turns) and nothing else is.
``--quick``: 50, 100, 200 and 400 turns and a 500-turn row (the code path, no meaningful ratios).
"""

from __future__ import annotations

import time

import numpy as np

from .report import Result, fig, fmt_time
from .timing import side_by_side

FAMILIES = ("qwen2_vl", "glm4v", "gemma3")
SIZES = (1000, 2000, 4000, 8000)
QUICK_SIZES = (50, 100, 200, 400)
LONG_ROW, QUICK_LONG_ROW = 10_000, 500


def conversation(turns: int) -> dict:
    """A text row of ``turns`` messages, user and assistant alternating (the last one a user's
    when ``turns`` is odd)."""
    msgs = []
    for i in range(turns):
        k = i // 2
        msgs.append({"role": "user", "content": f"Question {k}: what is {k} plus {k % 7}?"} if i % 2 == 0 else
                    {"role": "assistant", "content": f"{k} plus {k % 7} is {k + k % 7}."})
    return {"messages": msgs}


def _check(row, proc, turns: int) -> int:
    """labels on == labels off in ids; the labelled tokens are the assistant turns' text (each
    answer's digits appear in the labelled text); returns the labelled count."""
    import mmpipe

    on = mmpipe.encode_row(row, proc, labels=True)
    off = mmpipe.encode_row(row, proc, labels=False)
    assert np.array_equal(on.input_ids, off.input_ids), "labels=True changed the ids"
    labelled = on.labels != mmpipe.IGNORE_INDEX
    assert labelled.any() and not labelled.all()
    tok = getattr(proc, "tokenizer", proc)
    text = tok.decode(on.input_ids[labelled].tolist())
    last = (turns // 2) - 1  # the last assistant turn's index
    if last >= 0:
        assert f"{last} plus {last % 7} is {last + last % 7}." in text, "the last answer is not labelled"
    assert "Question" not in text, "a user turn is labelled"
    return int(labelled.sum())


def case_turns(ctx) -> list:
    from mmpipe import testing

    sizes = QUICK_SIZES if ctx.quick else SIZES
    long_row = QUICK_LONG_ROW if ctx.quick else LONG_ROW
    repeat = ctx.repeat
    out: list[Result] = []
    import mmpipe

    for fam in FAMILIES:
        proc = testing.build_processor(fam)
        rows = {n: conversation(n) for n in sizes}
        labelled = {n: _check(rows[n], proc, n) for n in sizes}
        contenders = {}
        for n in sizes:
            contenders[(n, True)] = (lambda r=rows[n]: mmpipe.encode_row(r, proc, labels=True))
            contenders[(n, False)] = (lambda r=rows[n]: mmpipe.encode_row(r, proc, labels=False))
        timings = side_by_side(contenders, repeat=repeat, warmup=0)
        prev = None
        for n in sizes:
            on, off = timings[(n, True)], timings[(n, False)]
            per_on = None if prev is None else on.median / timings[(prev, True)].median
            per_off = None if prev is None else off.median / timings[(prev, False)].median
            txt = "-" if per_on is None else f"{per_on:.2f}x / doubling (labels off {per_off:.2f}x)"
            ctx.log(f"  turns {fam} {n:>6}: labels on {fmt_time(on.median)}, off {fmt_time(off.median)}"
                    + ("" if per_on is None else f"; per doubling on {per_on:.2f}x, off {per_off:.2f}x"))
            out.append(Result(
                f"turns {fam}: {n} turns, labels on", fig(on), fig(off), per_on, txt, "(info)", None, True,
                {"family": fam, "turns": n, "labelled_tokens": labelled[n], "per_doubling_labels_on": per_on,
                 "per_doubling_labels_off": per_off, "timing": {"mmpipe": on.to_json(), "baseline": off.to_json()}},
                "labels=False (same row, same ids)",
                load=float(np.median(on.other_cores + off.other_cores)) if on.other_cores else None))
            prev = n
        row = conversation(long_row)
        t0 = time.perf_counter()
        enc = mmpipe.encode_row(row, proc, labels=True)
        took = time.perf_counter() - t0
        ctx.log(f"  turns {fam} {long_row}-turn row, labels on: {fmt_time(took)} ({enc.num_tokens} tokens)")
        out.append(Result(f"turns {fam}: the {long_row}-turn row, labels on", fmt_time(took), "-", None, "(one run)",
                          "(info)", None, None, {"family": fam, "turns": long_row, "tokens": int(enc.num_tokens),
                                                 "seconds": took}, "- (one encode)"))
    return out
