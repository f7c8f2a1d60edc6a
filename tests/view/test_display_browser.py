"""A batch's HTML page opened in a real browser (headless Chromium, Debian's ``chromium``).

The image count is read off the screenshot: every thumbnail has a border in its own colour
(`mmpipe.view.view.media_colour`), so each rendered image is a ring of that exact colour whose
inside is the image itself, pixel for pixel. A broken or missing ``<img>`` draws no such
ring around the right pixels. The DOM Chromium builds is checked as well."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import deque

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import view
from mmpipe import testing

from conftest import processor_for

CHROMIUM = shutil.which("chromium") or (os.path.exists("/usr/bin/chromium") and "/usr/bin/chromium") or None
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian: apt-get install chromium; .ci/run installs it)",
)

WIDTH, HEIGHT = 1280, 2600
BORDER = 4  # px, .mmpipe-figure img border in mmpipe/view/html.py


def chromium(page, tmp_path, *args):
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--force-device-scale-factor=1", "--force-color-profile=srgb",
           "--hide-scrollbars", *args, page.as_uri()]
    env = dict(os.environ, HOME=str(tmp_path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


def components(mask: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """4-connected regions of a boolean mask: (top, left, bottom, right, size) each."""
    seen = np.zeros_like(mask)
    out = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        q, top, left, bottom, right, n = deque([(y0, x0)]), y0, x0, y0, x0, 0
        while q:
            y, x = q.popleft()
            n += 1
            top, left, bottom, right = min(top, y), min(left, x), max(bottom, y), max(right, x)
            for yy, xx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= yy < mask.shape[0] and 0 <= xx < mask.shape[1] and mask[yy, xx] and not seen[yy, xx]:
                    seen[yy, xx] = True
                    q.append((yy, xx))
        out.append((int(top), int(left), int(bottom), int(right), n))
    return out


def rendered_images(shot: np.ndarray, thumbs: list) -> dict[int, int]:
    """For each batch image i: how many rings of its colour in the screenshot enclose exactly
    its thumbnail (shown enlarged by a whole factor, pixelated)."""
    found = {}
    for i, th in enumerate(thumbs):
        colour = np.asarray([int(view.media_colour(i)[k:k + 2], 16) for k in (1, 3, 5)], np.uint8)
        mask = (shot == colour).all(axis=-1)
        ref = np.asarray(th)
        hits = 0
        for top, left, bottom, right, n in components(mask):
            inner = shot[top + BORDER:bottom - BORDER + 1, left + BORDER:right - BORDER + 1]
            h, w = inner.shape[:2]
            if h < ref.shape[0] or w < ref.shape[1] or h % ref.shape[0] or w % ref.shape[1]:
                continue
            f = h // ref.shape[0]
            if w // ref.shape[1] != f:
                continue
            if np.array_equal(inner[f // 2::f, f // 2::f], ref):  # one sample per image pixel
                hits += 1
        found[i] = hits
    return found


def test_batch_page_in_headless_chromium_shows_every_image(tmp_path):
    proc = processor_for("qwen2_vl")
    sizes = [(40, 60), (64, 48), (30, 90), (56, 56), (45, 70), (80, 40)]
    rows, k = [], 0
    for b, n in enumerate((1, 0, 3, 2)):
        content = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": f"row {b}: <what> & why?"}]
        imgs = [testing.tiny_image(*sizes[(k + j) % len(sizes)], seed=k + j) for j in range(n)]
        k += n
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": "Fine & <ok>."}]
        rows.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc,
                                      pixels="float32" if b == 3 else "uint8"))
    batch = mmpipe.collate(rows, processor=proc)
    n_images = int(batch.image_grid_thw.shape[0])
    assert n_images == 6
    thumbs = [th for b, idx in enumerate(batch.sample_to_image_indices)
              for th in view.image_thumbnails(rows[b], spec=proc)]

    page = tmp_path / "batch.html"
    page.write_text(view.html_page(batch, tokenizer=proc, title="mmpipe batch"), encoding="utf-8")
    png = tmp_path / "batch.png"
    run = chromium(page, tmp_path, f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}")
    assert png.exists(), f"chromium wrote no screenshot (rc {run.returncode}): {run.stderr[-2000:]}"
    shot = np.asarray(Image.open(png).convert("RGB"))
    assert shot.shape[:2] == (HEIGHT, WIDTH)
    assert (shot[-40:] == 255).all(), "page taller than the screenshot window: raise HEIGHT"

    found = rendered_images(shot, thumbs)
    assert found == {i: 1 for i in range(n_images)}, f"images rendered per batch image: {found}"
    assert sum(found.values()) == n_images

    # the DOM chromium built holds the same images (and nothing external or scripted)
    dom = chromium(page, tmp_path, "--dump-dom").stdout
    assert dom.count("data-mmpipe-image=") == n_images
    assert dom.count(' data-image="') == n_images  # one token span per image
    assert "<script" not in dom
