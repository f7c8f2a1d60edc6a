"""Peak memory of encoding ONE big row (issue 15): a 10 MB text row and a 100 MP image.

Each figure is taken in its own fresh subprocess (``python -m bench.memory --child WHAT``):
it builds the processor, warms the code path on a tiny row, builds the input, resets the
process's peak RSS (Linux ``/proc/self/clear_refs``; VmHWM) and reads it after the one call.
The figure is the increase, also as a multiple of the input's size (the text's bytes; the image's decoded RGB bytes, width x height x 3).

Baselines (what the same work costs done the plain way):
- text: the tokenizer alone on the same rendered prompt (``processor.apply_chat_template``, with
  the generation prompt after a last user turn as mmpipe adds it, then
  ``tokenizer(text, add_special_tokens=False)``, with ``return_offsets_mapping=True`` when labels
  are computed, which is what locating the assistant tokens needs). A fast (Rust) tokenizer's
  Python output holds ~40 bytes per token id and ~130 per offset pair, and the offline
  tokenizer makes about 0.8 tokens per byte of these random words, so one call costs
  ~200-330x the text size. mmpipe tokenizes long texts in verified pieces
  (`mmpipe.encoding.tokenize`) and lands near the encoded record's own size (10 MB row with
  labels: +653 MiB, ~69x the text, vs +3,096 MiB for the one call).
- image: PIL decoding the file (``Image.open(p).load()``).

Run with the suite (``python -m bench --only memory``; not part of ``--quick`` runs unless named:
it takes a minute) or alone (``python -m bench.memory [--quick]``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys

TEXT_MB = {False: 10.0, True: 1.0}  # quick: 1 MB
IMAGE_SIDE = {False: 10000, True: 2000}  # quick: 4 MP


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> float:
    """Reset the peak RSS to the current RSS (Linux: ``clear_refs`` 5 resets VmHWM); the baseline
    to subtract. Without it (no /proc) the peak so far, ``ru_maxrss``."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_mib("VmHWM")
    except OSError:
        return _peak_mib()


def _peak_mib() -> float:
    try:
        return _status_mib("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _text(mb: float) -> str:
    """``mb`` MB of varied lowercase words (not one repeated character), seeded."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    return " ".join(rng.choices(words, k=int(mb * 1e6 / 6.5)))


def _image_file(workdir: str, side: int) -> str:
    """A side x side RGB PNG (gradients; small on disk, ``side**2 * 3`` bytes decoded)."""
    import numpy as np
    from PIL import Image

    path = os.path.join(workdir, f"mem_{side}.png")
    if not os.path.exists(path):
        y = np.linspace(0, 255, side, dtype=np.float32)
        a = np.empty((side, side, 3), np.uint8)
        a[..., 0], a[..., 1], a[..., 2] = y[:, None], y[None, :], (np.arange(side) % 251)[None, :]
        Image.fromarray(a).save(path, compress_level=1)
    return path


def child(what: str, quick: bool, workdir: str) -> dict:
    """One measurement in this (fresh) process: {"peak_mib", "input_bytes", "check"}."""
    import hashlib

    import mmpipe
    from mmpipe import testing
    from PIL import Image

    from . import data

    proc = data.processor(quick)
    Image.MAX_IMAGE_PIXELS = None  # the 100 MP file is a deliberate "bomb-sized" input
    tiny = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": "yo"}], "images": [testing.tiny_image(64, 64)]}
    mmpipe.encode_row(tiny, proc)  # warm: imports, caches, the image threads
    labels = what.endswith("_labels")
    if what.startswith("img"):
        path = _image_file(workdir, IMAGE_SIDE[quick])
        row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
               "images": [path]}
        nbytes = IMAGE_SIDE[quick] ** 2 * 3
    else:
        text = _text(TEXT_MB[quick])
        row = {"messages": [{"role": "user", "content": text}]}
        if labels:
            row["messages"].append({"role": "assistant", "content": "A long text."})
        nbytes = len(text.encode())
    before = _reset_peak()
    if what == "img_pil":
        with Image.open(path) as im:
            im.load()
            check = list(im.size)
    elif what.startswith("img"):
        check = mmpipe.encode_row(row, proc).image_grid_thw.tolist()
    elif what.startswith("tok"):
        agp = row["messages"][-1]["role"] != "assistant"  # what mmpipe renders by default
        rendered = proc.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=agp)
        ids = proc.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=labels)["input_ids"]
        check = hashlib.sha1(json.dumps(ids).encode()).hexdigest()
    else:
        out = mmpipe.encode_row(row, proc, labels=labels)
        check = hashlib.sha1(json.dumps(out.input_ids.tolist()).encode()).hexdigest()
    return {"peak_mib": _peak_mib() - before, "input_bytes": nbytes, "check": check}


def _run_child(what: str, ctx) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "bench.memory", "--child", what, "--workdir", ctx.workdir] + (
        ["--quick"] if ctx.quick else [])
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fig(r: dict, unit: str) -> str:
    return f"+{r['peak_mib']:,.0f} MiB ({r['peak_mib'] * 2**20 / r['input_bytes']:,.1f}x {unit})"


def case_memory(ctx) -> list:
    from .cases import Result

    mb, side = TEXT_MB[ctx.quick], IMAGE_SIDE[ctx.quick]
    out = []
    for labels in (False, True):
        suffix = "_labels" if labels else ""
        ours, base = _run_child("enc" + suffix, ctx), _run_child("tok" + suffix, ctx)
        ratio = ours["peak_mib"] / base["peak_mib"]
        per_byte = ours["peak_mib"] * 2**20 / ours["input_bytes"]
        name = f"peak RSS, one {mb:g} MB text row{', labels' if labels else ''} (vs tokenizer alone, one call)"
        out.append(Result(name, _fig(ours, "text"), _fig(base, "text"), ratio,
                          f"{ratio:.2f}x the tokenizer, {per_byte:.0f}x the text", "<= 120x the text", per_byte <= 120,
                          ours["check"] == base["check"], {"mmpipe": ours, "baseline": base}))
    ours, base = _run_child("img_enc", ctx), _run_child("img_pil", ctx)
    per_byte = ours["peak_mib"] * 2**20 / ours["input_bytes"]
    out.append(Result(f"peak RSS, one {side * side / 1e6:g} MP image (vs PIL decode)", _fig(ours, "RGB"),
                      _fig(base, "RGB"), per_byte, f"{per_byte:.2f}x RGB", "<= 2x its RGB bytes", per_byte <= 2.0,
                      None, {"mmpipe": ours, "baseline": base}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default="")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quick, args.workdir)))
        return
    import tempfile

    from .cases import Context

    with tempfile.TemporaryDirectory(prefix="mmpipe-mem-") as wd:
        for r in case_memory(Context(quick=args.quick, repeat=1, workdir=wd)):
            print(f"{r.case}: mmpipe {r.mmpipe} | baseline {r.baseline} | {r.ratio_text} (target {r.target})")


if __name__ == "__main__":
    main()
