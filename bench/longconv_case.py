"""Long conversations (info lines, nothing timed is asserted): how encode and the multi-turn
appends scale with the turns.

1. Generic path, rows with images (an image every 20 user turns), labels on vs off side by side
   (``mmpipe.encode_row``): MiniCPM-V 4.6 (``<image_id>0</image_id>`` in each image's tokens) and
   PaliGemma (``<bos>`` after the last image). Their replies were located with one processor call
   on a growing prefix per reply edge (MiniCPM-V: 362 calls, 2.9 s for 200 turns); now one call a
   row (`mmpipe.encoding.call_labels._aligned_labels`). Each line gives the medians, the ratio per
   doubling t(2n) / t(n) for labels on (linear 2.0, quadratic 4.0) and the processor calls.
2. Multi-turn appends (`mmpipe.rollout.multiturn`: a reply's ids, then a tool turn with an image)
   on Qwen2-VL and GLM-4.1V: the whole loop's time for 10, 50 and 200 rounds and the chat-template
   renders a round costs. The renders are linear in the conversation (the module re-renders it
   to check that the text so far is a prefix), so the loop is quadratic in its rounds: ~1 s for
   200 rounds here, small next to generating them.

Outputs are checked first: every reply labelled as its text and ``<|im_end|>``, nothing else; the
loop's row equals ``encode_row`` of the whole conversation. ``--quick``: 10, 20, 40 turns / rounds.
"""

from __future__ import annotations

import time

import numpy as np

from .report import Result, fig, fmt_time
from .timing import side_by_side

GENERIC = ("minicpmv4_6", "paligemma")
LOOPS = ("qwen2_vl", "glm4v")
SIZES, QUICK_SIZES = (50, 100, 200), (10, 20, 40)
ROUNDS, QUICK_ROUNDS = (10, 50, 200), (10, 20, 40)


def _image(i: int):
    from PIL import Image

    return Image.new("RGB", (32 + 8 * (i % 3), 32), (i % 255, 60, 90))


def _row(turns: int) -> tuple[dict, list]:
    msgs, images, replies = [], [], []
    for i in range(turns):
        parts = [{"type": "image"}] if i % 20 == 0 else []
        images += [_image(i)] if parts else []
        msgs.append({"role": "user", "content": parts + [{"type": "text", "text": f"question {i} " + "w" * (i % 3)}]})
        replies.append(f"ANS{i}" + " z" * (i % 3))
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": replies[-1]}]})
    return {"messages": msgs, "images": images}, replies


def _check_labels(row, tok, replies) -> None:
    on = np.r_[False, row.labels != -100, False].astype(np.int8)
    runs = [tok.decode(row.input_ids[a:b].tolist())
            for a, b in zip(np.flatnonzero(np.diff(on) == 1), np.flatnonzero(np.diff(on) == -1))]
    assert runs == [r + "<|im_end|>" for r in replies], "a reply is not labelled as its text and <|im_end|>"


def _processor_calls(enc, raw) -> int:
    import mmpipe.media.processor_encode as pe

    real, calls = pe.run_processor, []
    pe.run_processor = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        enc.encode_row(raw)
    finally:
        pe.run_processor = real
    return len(calls)


def _generic(ctx, sizes) -> list:
    import mmpipe
    from mmpipe import testing

    out = []
    for fam in GENERIC:
        proc = testing.build_processor(fam)
        on, off = mmpipe.Encoder(proc), mmpipe.Encoder(proc, labels=False)
        rows = {n: _row(n) for n in sizes}
        for n in sizes:
            row = on.encode_row(rows[n][0])
            _check_labels(row, proc.tokenizer, rows[n][1])
            assert np.array_equal(row.input_ids, off.encode_row(rows[n][0]).input_ids)
        calls = {n: _processor_calls(on, rows[n][0]) for n in sizes}
        contenders = {}
        for n in sizes:
            contenders[(n, True)] = lambda r=rows[n][0]: on.encode_row(r)
            contenders[(n, False)] = lambda r=rows[n][0]: off.encode_row(r)
        t = side_by_side(contenders, repeat=ctx.repeat, warmup=1)
        prev = None
        for n in sizes:
            a, b = t[(n, True)], t[(n, False)]
            per = None if prev is None else a.median / t[(prev, True)].median
            ctx.log(f"  longconv {fam} {n:>4} turns: labels on {fmt_time(a.median)}, off {fmt_time(b.median)}, "
                    f"{calls[n]} processor call(s)" + ("" if per is None else f"; per doubling {per:.2f}x"))
            out.append(Result(f"longconv {fam}: {n} turns, labels on", fig(a), fig(b), per,
                              "-" if per is None else f"{per:.2f}x / doubling", "(info)", None, True,
                              {"family": fam, "turns": n, "processor_calls": calls[n], "per_doubling": per,
                               "timing": {"mmpipe": a.to_json(), "baseline": b.to_json()}},
                              "labels=False (same row, same ids)"))
            prev = n
    return out


def _loop(fam: str, proc, rounds: int, counted: list) -> tuple:
    from mmpipe.rollout import multiturn as mt

    tok, stop = proc.tokenizer, "<|user|>" if fam == "glm4v" else "<|im_end|>"
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the page."}]}]
    images = [_image(0)]
    conv = mt.start({"messages": msgs, "images": images}, proc)
    t0, n0 = time.perf_counter(), len(counted)
    for i in range(rounds):
        reply = f"Searching {i}: " + "more " * (i % 7)
        conv = mt.append_response(conv, tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(stop)])
        obs = [{"type": "image"}, {"type": "text", "text": f"result {i} " * (1 + i % 4)}]
        conv = mt.append_observation(conv, obs, images=[_image(i + 1)])
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
        images.append(_image(i + 1))
    return conv, msgs, images, time.perf_counter() - t0, (len(counted) - n0) / rounds


def _loops(ctx, rounds) -> list:
    import mmpipe
    from mmpipe import testing

    out, counted = [], []
    real = mmpipe.Encoder.render_many

    def counting(self, conversations, *a, **k):
        counted.extend([1] * len(conversations))
        return real(self, conversations, *a, **k)

    for fam in LOOPS:
        proc = testing.build_processor(fam)
        mmpipe.Encoder.render_many = counting
        try:
            runs = {n: _loop(fam, proc, n, counted) for n in rounds}
        finally:
            mmpipe.Encoder.render_many = real
        conv, msgs, images, _, _ = runs[rounds[-1]]
        whole = mmpipe.encode_row({"messages": msgs, "images": images}, proc, add_generation_prompt=True)
        assert np.array_equal(conv.row.input_ids, whole.input_ids)
        assert np.array_equal(conv.row.position_ids, whole.position_ids)
        prev = None
        for n in rounds:
            took, renders = runs[n][3], runs[n][4]
            per = None if prev is None else (took / runs[prev][3]) / (n / prev)  # 1.0: linear in the rounds
            ctx.log(f"  longconv {fam} loop {n:>4} rounds: {fmt_time(took)} ({runs[n][0].num_tokens} tokens), "
                    f"{renders:.0f} renders a round" + ("" if per is None else f"; time / rounds grew {per:.2f}x"))
            out.append(Result(f"longconv {fam}: {n}-round multi-turn loop", fmt_time(took), "-", per,
                              "-" if per is None else f"{per:.2f}x per-round cost vs {prev} rounds", "(info)", None,
                              True, {"family": fam, "rounds": n, "seconds": took, "tokens": int(runs[n][0].num_tokens),
                                     "renders_per_round": renders}, "- (one run)"))
            prev = n
    return out


def case_longconv(ctx) -> list:
    return _generic(ctx, QUICK_SIZES if ctx.quick else SIZES) + _loops(ctx, QUICK_ROUNDS if ctx.quick else ROUNDS)
