"""The whole pipeline on a small chat dataset with images, offline, in well under a minute.

::

    python -m mmpipe.cli.demo                        # tiny offline Qwen2-VL, 12 rows
    python -m mmpipe.cli.demo --family qwen3_vl --rows 20 --out /tmp/enc
    python -m mmpipe.cli.demo --model /models/Qwen2-VL-2B-Instruct     # a real local model

Steps:

1. raw rows: a ``datasets.Dataset`` with a ``messages`` column (chat content lists with
   ``{"type": "image"}`` placeholders) and an ``images`` column (``Sequence(Image())``),
   built from matplotlib's sample photos and generated images of assorted sizes; rows hold
   0 to 3 images, some end with an assistant answer (so they have labels), some with a
   user turn (prompts for generation);
2. encode: ``ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2,
   **mmpipe.map_kwargs(processor, ds))``,
   saved with ``save_to_disk`` (``--out``, default a temporary directory) and loaded back;
3. collate: ``DataLoader(enc, batch_size=4, collate_fn=mmpipe.Collator(processor),
   num_workers=2)``;
4. model: ``model(**batch.model_inputs())``;
5. unbatch: ``mmpipe.unbatch(batch)`` must equal the encoded rows.

Checks (`mmpipe.cli.demo_checks.DemoChecks`; the exit status is 1 if any fails): ``unbatch(collate(rows)) == rows``; the float32
``pixel_values`` built from the compact uint8 rows equal the processor's own output
(exactly, for the offline PIL image processor); and, for the offline tiny model, each
row's logits in the padded batch equal the row run alone (padding and positions are right).

Real model (quickstart): ``--model DIR`` loads ``AutoModelForImageTextToText`` from a local
directory and the processor from ``--processor DIR`` (default: the model directory) through
`mmpipe.processors.load_processor` (AutoProcessor; images-only where torchvision is missing).
``--processor DIR`` alone runs encode/collate/unbatch with the real processor and skips the
model. In transformers 5.x the stock Qwen-VL processors also build a video processor, which
may need torchvision installed (normally present on GPU machines).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from mmpipe.cli.demo_checks import SUMMARY_OK, DemoChecks
from mmpipe.cli.encode import dir_bytes
from mmpipe.families import DEFAULT_FAMILY, VISION_FAMILIES

__all__ = ["SUMMARY_OK", "build_rows", "image_pool", "main"]  # SUMMARY_OK: the checks' OK line (demo_checks.py)


# (images in the row, assistant answer?) cycles over these; row 4 is two turns.
_PLAN = [(1, True), (0, True), (2, False), (1, True), (3, True), (0, False), (1, False), (2, True)]
_QUESTIONS = [
    "Describe this image in one sentence.",
    "What is shown in the picture?",
    "How many objects are there in the image?",
    "What color is the sky?",
    "Read the text in the image and translate it into English.",
]
_TEXT_ONLY = [
    "Please write a short story about a robot that learns to paint pictures of the sea.",
    "Numbers like 1, 2, 3 and 42: which one is the largest?",
]
_ANSWERS = [
    "The photograph shows a woman in a uniform standing in front of a flag.",
    "There are four objects in the image.",
    "The robot painted the sea in the morning light, with white boats and blue waves.",
    "The sky is grey.",
    "The answer is twelve.",
]


# ---- raw rows ----------------------------------------------------------------------------
def image_pool() -> list[tuple[str, Any]]:
    """matplotlib's sample photos, then the generated images (assorted sizes and modes)."""
    from mmpipe.offline import generated_images, sample_photos

    return list(sample_photos()) + list(generated_images())


def build_rows(n: int, pool: Sequence[tuple[str, Any]]):
    """``n`` raw rows in the Hub chat convention, as a ``datasets.Dataset``.

    Returns ``(dataset, image_names)`` where ``image_names[i]`` lists row i's image names.
    """
    import datasets

    def text(t: str) -> dict:
        return {"type": "text", "text": t}

    image = {"type": "image", "text": None}
    messages, images, names = [], [], []
    k = 0  # next image of the pool
    for i in range(n):
        n_img, answered = _PLAN[i % len(_PLAN)]
        take = [pool[(k + j) % len(pool)] for j in range(n_img)]
        k += n_img
        if n_img == 0:
            msgs = [{"role": "user", "content": [text(_TEXT_ONLY[i % len(_TEXT_ONLY)])]}]
        elif n_img == 3:  # two user turns: two images, an answer, then one more image
            msgs = [
                {"role": "user", "content": [image, image, text("Compare the two pictures.")]},
                {"role": "assistant", "content": [text(_ANSWERS[i % len(_ANSWERS)])]},
                {"role": "user", "content": [text("And this one?"), image]},
            ]
        else:
            msgs = [{"role": "user", "content": [image] * n_img + [text(_QUESTIONS[i % len(_QUESTIONS)])]}]
        if answered:
            msgs.append({"role": "assistant", "content": [text(_ANSWERS[(i + 1) % len(_ANSWERS)])]})
        messages.append(msgs)
        images.append([im for _, im in take])
        names.append([name for name, _ in take])
    content = datasets.List({"type": datasets.Value("string"), "text": datasets.Value("string")})
    features = datasets.Features(
        {
            "messages": datasets.List({"role": datasets.Value("string"), "content": content}),
            "images": datasets.Sequence(datasets.Image()),
        }
    )
    return datasets.Dataset.from_dict({"messages": messages, "images": images}, features=features), names


# ---- helpers -----------------------------------------------------------------------------
def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def parser(prog: str = "python -m mmpipe.cli.demo") -> argparse.ArgumentParser:
    """The demo's argument parser (``mmpipe demo ...`` passes its arguments here, as ``prog``
    ``"mmpipe demo"``: its usage and errors name the command the user typed)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="mmpipe demo: raw chat rows with images -> encode (datasets.map) -> save/load -> "
        "DataLoader + Collator -> model -> unbatch, with checks. Offline by default.",
    )
    p.add_argument("--family", choices=VISION_FAMILIES, default=DEFAULT_FAMILY,
                   help=f"offline processor + tiny model family (default {DEFAULT_FAMILY}); ignored with --processor/--model")
    p.add_argument("--rows", type=int, default=12, help="number of raw rows (default 12)")
    p.add_argument("--num-proc", type=int, default=2, help="datasets.map processes (default 2; <=1: in-process)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader num_workers (default 2)")
    p.add_argument("--batch-size", type=int, default=4, help="DataLoader batch size (default 4)")
    p.add_argument("--out", default=None, help="directory to save the encoded dataset to (default: a temp dir, removed)")
    p.add_argument("--processor", default=None, metavar="PATH",
                   help="local model directory for transformers AutoProcessor (default: --model's directory)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="local model directory for transformers AutoModelForImageTextToText")
    p.add_argument("--device", default=None, help="device for a real --model (default: cuda if available, else cpu)")
    return p


def _parse(argv: Optional[Sequence[str]], prog: Optional[str] = None) -> argparse.Namespace:
    p = parser() if prog is None else parser(prog)
    args = p.parse_args(argv)
    if args.rows < 1:
        p.error("--rows must be at least 1")
    if args.batch_size < 1:
        p.error("--batch-size must be at least 1")
    if args.workers < 0:
        p.error("--workers must be >= 0")
    if args.model and not args.processor:
        args.processor = args.model
    return args


def _load(args):
    """(processor, model or None, label, offline?)"""
    import torch

    if args.processor is None:
        from mmpipe.offline import build_model, build_processor

        return build_processor(args.family), build_model(args.family), f"offline tiny {args.family}", True
    from transformers import AutoModelForImageTextToText

    from mmpipe.processors import load_processor

    # AutoProcessor, or the same files images-only where the stock class needs torchvision
    processor = load_processor(args.processor)
    if getattr(processor, "image_processor", None) is None:
        raise SystemExit(
            f"load_processor({args.processor!r}) gave a {type(processor).__name__}, not a "
            "vision-language processor: the directory needs the model's config.json and "
            "preprocessor_config.json (a Qwen2-VL, Qwen2.5-VL or Qwen3-VL checkpoint)"
        )
    model = None
    if args.model:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForImageTextToText.from_pretrained(args.model, dtype="auto", local_files_only=True)
        model.to(device).eval()
    return processor, model, f"{args.model or args.processor}", False


def _lap(times: dict[str, float], name: str, t0: float) -> float:
    now = time.perf_counter()
    times[name] = now - t0
    return now


# ---- main --------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None) -> int:
    """Run the demo (see the module docstring); returns the exit status (1 if a check failed).
    ``prog``: the command named in usage and argument errors (``mmpipe demo`` from the CLI).

    The steps: load the processor and model (`_load`), build the raw rows (`build_rows`),
    encode with ``datasets.map``, save and load back, then collate with a DataLoader and check
    every batch (`DemoChecks`), and print the table (`_print_report`)."""
    args = _parse(argv, prog)
    t_start = time.perf_counter()
    times: dict[str, float] = {}

    import datasets
    import transformers

    import mmpipe
    from mmpipe.families import family_of

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()

    t = time.perf_counter()
    processor, model, label, offline = _load(args)
    fam = family_of(processor)
    t = _lap(times, "load", t)

    ds, _ = build_rows(args.rows, image_pool())
    t = _lap(times, "rows", t)

    num_proc = args.num_proc if args.num_proc > 1 else None
    enc = ds.map(
        mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=num_proc, remove_columns=ds.column_names,
        **mmpipe.map_kwargs(processor, ds),  # bounded writer buffer, as the README's Quickstart
    )
    t = _lap(times, "encode", t)

    checks = DemoChecks(ds, processor, model, fam, offline)
    out_dir = Path(args.out) if args.out else None
    disk_bytes = _save_load_and_check(enc, out_dir, args, checks, times, t)
    problems = [f for fs in checks.failures.values() for f in fs]
    try:
        print(f"mmpipe demo: {label} ({fam.name}), {len(ds)} rows, batch size {args.batch_size}, "
              f"map num_proc={num_proc or 1}, DataLoader num_workers={args.workers}")
        _print_report(checks, times, disk_bytes, out_dir)
        seconds = time.perf_counter() - t_start
        print(f"rows {len(ds)}, batches {checks.n_batches}, {seconds:.1f} s; " + "; ".join(checks.summary()))
    except BrokenPipeError:  # `mmpipe demo | head`: the reader left; the checks still set the status
        from mmpipe.cli.stops import reader_left

        reader_left()
    return 0 if not problems else 1


def _save_load_and_check(enc, out_dir: Optional[Path], args, checks: DemoChecks, times: dict[str, float],
                         t: float) -> int:
    """Save ``enc`` to ``out_dir`` (None: a temporary directory, removed after), load it back,
    and run every DataLoader batch through ``checks``; returns the bytes on disk."""
    import datasets
    from torch.utils.data import DataLoader

    import mmpipe

    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mmpipe-demo-")
        out_dir = Path(tmp.name) / "encoded"
    try:
        enc.save_to_disk(str(out_dir))
        disk_bytes = dir_bytes(out_dir)
        enc = checks.enc = datasets.load_from_disk(str(out_dir))
        t = _lap(times, "save+load", t)

        loader = DataLoader(
            enc, batch_size=args.batch_size, collate_fn=mmpipe.Collator(checks.processor), num_workers=args.workers
        )
        for batch in loader:
            checks.batch(batch)
        times["collate+model+checks"] = time.perf_counter() - t
        if checks.row0 != len(enc):
            checks.failures["loader"].append(f"the loader yielded {checks.row0} rows, the dataset holds {len(enc)}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return disk_bytes


def _print_report(checks: DemoChecks, times: dict[str, float], disk_bytes: int, out_dir: Optional[Path]) -> None:
    """The per-row table, the pixel sizes, the times and every failed check."""
    head = ("row", "tokens", "imgs", "grids (t x h x w)", "img tok", "uint8 px", "float32 px", "model")
    w = [3, 6, 4, 26, 7, 9, 10, 0]
    print("  ".join(h.rjust(x) if i not in (3, 7) else h.ljust(x) for i, (h, x) in enumerate(zip(head, w))))
    for r, n, ni, g, nt, u8, f32, stat in checks.table:
        cells = [str(r), str(n), str(ni), g, str(nt), _mb(u8) if u8 else "0", _mb(f32) if f32 else "0", stat]
        print("  ".join(c.rjust(x) if i not in (3, 7) else c.ljust(x) for i, (c, x) in enumerate(zip(cells, w))))
    ratio = f" ({checks.f32_total / checks.u8_total:.0f}x smaller)" if checks.u8_total else ""
    print(f"pixels stored uint8: {_mb(checks.u8_total)}; as float32 pixel_values: {_mb(checks.f32_total)}{ratio}. "
          f"Encoded dataset on disk: {_mb(disk_bytes)}" + (f" at {out_dir}" if out_dir is not None else " (temp dir, removed)"))
    print("times: " + ", ".join(f"{k} {v:.2f}s" for k, v in times.items()))
    for f in (f for fs in checks.failures.values() for f in fs):
        print(f"CHECK FAILED: {f}")


if __name__ == "__main__":
    sys.exit(main())
