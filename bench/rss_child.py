"""Subprocess of the RSS case: encode N rows with ``dataset.map(mmpipe.encode)`` and report the
process's peak RSS (``ru_maxrss``) after each of a few row counts. One JSON line on stdout.

Rows reference a few small image files by path (a ``datasets.Image()`` column) and the input
dataset is built in memory, so it is a few MB, all resident before the first row: what could
grow is the encoder's state. (A saved input dataset would be memory-mapped and embed the image
bytes; its pages, read once each, would add file-backed RSS in proportion to the rows read.)
The output goes to a cache file in 100-row writes (datasets' ``writer_batch_size``; with the
default 1000 the 1k mark would fall just before the first write), so every mark sees the
write buffer at its steady-state size.
"""

from __future__ import annotations

import argparse
import json
import os


def _status_mb() -> dict:
    """VmHWM (peak RSS), VmRSS, RssAnon, RssFile of this process, MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--marks", default="1000,2500,5000")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    marks = [int(x) for x in args.marks.split(",")]
    n = marks[-1]

    import datasets

    import mmpipe
    from mmpipe import testing

    from . import data

    datasets.disable_progress_bars()
    proc = data.processor(args.quick)
    img_dir = os.path.join(args.workdir, "rss_images")
    os.makedirs(img_dir, exist_ok=True)
    paths = []
    for i, (h, w) in enumerate([(96, 128), (120, 160), (64, 64), (150, 100), (112, 112)]):
        p = os.path.join(img_dir, f"{i}.jpg")
        testing.tiny_image(h, w, seed=i).save(p, quality=90)
        paths.append(p)
    rows = [data.chat_row([paths[i % len(paths)]] * (1 + i % 2), i) for i in range(n)]
    raw = datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    report: dict = {}
    before = _status_mb()
    wanted = set(marks)
    anon_peak = [0.0]

    def probe(example, idx):
        out = mmpipe.encode(example, idx, processor=proc)
        if idx % 25 == 0 or idx + 1 in wanted:
            st = _status_mb()
            anon_peak[0] = max(anon_peak[0], st["RssAnon"])
            if idx + 1 in wanted:
                report[idx + 1] = {"peak_mb": st["VmHWM"], "rss_mb": st["VmRSS"], "anon_mb": st["RssAnon"],
                                   "file_mb": st["RssFile"], "anon_peak_mb": anon_peak[0]}
        return out

    enc = raw.map(probe, with_indices=True, remove_columns=raw.column_names, load_from_cache_file=False,
                  new_fingerprint="mmpipe-bench-rss", writer_batch_size=100,
                  cache_file_name=os.path.join(args.workdir, "rss_encoded.arrow"))
    # the probed map wrote the same rows as encoding them directly
    same = len(enc) == n and all(
        enc[i]["pixel_values_u8"] == mmpipe.encode(raw[i], processor=proc)["pixel_values_u8"] for i in (0, n // 2, n - 1))
    print(json.dumps({"rows": n, "before_map": before, "marks": report, "identical": bool(same)}))


if __name__ == "__main__":
    main()
