"""Benchmark data: real photos (matplotlib's sample_data, in their own files) and photo-like
JPEGs at realistic sizes (random crops of the Grace Hopper photo scaled to 640x480..1920x1080,
with mild sensor noise), encoded as a ``datasets.Image()`` column stores them, in chat rows with
1, 2 and 8 images.

Everything is deterministic (fixed seeds) so two runs time the same work.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mmpipe import testing

# (width, height): common camera / screen sizes from 640x480 to 1920x1080, both orientations.
REALISTIC_SIZES = [(640, 480), (480, 640), (800, 600), (1024, 768), (1280, 720), (720, 1280),
                   (1280, 960), (1366, 768), (1600, 900), (1920, 1080)]
# --quick: the same code paths on small images.
QUICK_SIZES = [(160, 120), (120, 160), (200, 150), (256, 192)]

FAMILY = "qwen2_vl"
# The released Qwen2-VL checkpoints' preprocessor_config.json (min_pixels / max_pixels): 56*56 and
# 12845056 (= 28*28*16384) pixels, so no photo up to 1920x1080 is scaled down, only rounded to
# multiples of 28 (1920x1080 -> 1932x1092: 10,764 patch rows, 2,691 tokens).
REAL_MIN_PIXELS = 3136
REAL_MAX_PIXELS = 12845056


def processor(quick: bool = False, backend: str = "pil"):
    """The real Qwen2-VL processor with the real checkpoint bounds (small bounds in quick mode).

    ``backend="torchvision"``: the same processor with transformers' torchvision image processor
    (``Qwen2VLImageProcessor``, same bounds and constants), what GPU users and vLLM get; it needs
    torchvision, which only the vLLM test environment has (``bash scripts/bench.sh --torchvision``)."""
    proc = testing.build_processor(FAMILY) if quick else \
        testing.build_processor(FAMILY, min_pixels=REAL_MIN_PIXELS, max_pixels=REAL_MAX_PIXELS)
    if backend == "torchvision":
        import transformers

        from mmpipe.images.backends import processor_backend

        pil = proc.image_processor
        proc.image_processor = transformers.Qwen2VLImageProcessor(
            size=dict(pil.size), patch_size=pil.patch_size, temporal_patch_size=pil.temporal_patch_size,
            merge_size=pil.merge_size, image_mean=list(pil.image_mean), image_std=list(pil.image_std))
        if processor_backend(proc) != "torchvision":
            raise RuntimeError("transformers built the PIL image processor: torchvision is not importable here; "
                               "run `bash scripts/bench.sh --torchvision` (the vLLM test environment)")
    return proc


def _photo_like(w: int, h: int, seed: int, photos: list[Image.Image]) -> Image.Image:
    """A real photo, randomly cropped and bicubically scaled to (w, h), with mild sensor noise."""
    rng = np.random.default_rng(seed)
    src = photos[seed % len(photos)]
    sw, sh = src.size
    cw, ch = int(sw * rng.uniform(0.6, 1.0)), int(sh * rng.uniform(0.6, 1.0))
    x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
    im = src.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.BICUBIC)
    arr = np.asarray(im, dtype=np.int16) + rng.normal(0, 3, size=(h, w, 3)).astype(np.int16)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def encoded(img: Image.Image, fmt: str) -> dict:
    """A ``datasets.Image()`` storage value: ``{"bytes": ..., "path": None}``."""
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.convert("RGB").save(buf, format="JPEG", quality=90)
    elif fmt == "WEBP":
        img.convert("RGB").save(buf, format="WEBP", quality=90)
    else:
        img.save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


@dataclass
class ImagePool:
    """Encoded images (``datasets.Image()`` values) and where each came from."""

    values: list[dict]
    names: list[str]

    def pick(self, k: int, start: int) -> list[dict]:
        return [self.values[(start + j) % len(self.values)] for j in range(k)]


def image_pool(quick: bool = False, seed: int = 0, flatten_alpha: bool = False) -> ImagePool:
    """The matplotlib photos at their own sizes (PNG stays PNG) plus, per realistic size, two
    photo-like JPEGs and one WebP (random crops of a real photo scaled to that size, with mild
    sensor noise).

    ``flatten_alpha``: RGBA files composited onto white and saved as RGB PNG (what transformers
    5.20+ and mmpipe do to them). The torchvision bench runs in the vLLM environment, whose
    transformers 5.19 drops the alpha channel instead, so identical outputs need RGB inputs."""
    import matplotlib

    photos = testing.sample_photos()
    root = os.path.join(matplotlib.get_data_path(), "sample_data")
    values, names = [], []
    for name, im in photos:  # the files' own bytes (PNG or JPEG), as a dataset would hold them
        with open(os.path.join(root, name), "rb") as f:
            values.append({"bytes": f.read(), "path": None})
        if flatten_alpha and Image.open(io.BytesIO(values[-1]["bytes"])).mode in ("RGBA", "LA", "P"):
            from mmpipe.images.load import to_rgb_image

            values[-1] = encoded(to_rgb_image(Image.open(io.BytesIO(values[-1]["bytes"]))), "PNG")
        names.append(f"{name} {im.size[0]}x{im.size[1]}")
    real = [im for name, im in photos if im.size[0] >= 256]  # grace_hopper, logo2
    real = [im for name, im in photos if name.endswith(".jpg")] or real
    for i, (w, h) in enumerate(QUICK_SIZES if quick else REALISTIC_SIZES):
        values.append(encoded(_photo_like(w, h, seed + i, real), "JPEG"))
        names.append(f"photo-like {w}x{h} jpeg")
        values.append(encoded(_photo_like(w, h, seed + 100 + i, real), "JPEG"))
        names.append(f"photo-like {w}x{h} jpeg (2)")
        values.append(encoded(_photo_like(w, h, seed + 200 + i, real), "WEBP"))  # the third format people store
        names.append(f"photo-like {w}x{h} webp")
    return ImagePool(values, names)


def chat_row(images: list, i: int, answer: bool = True) -> dict:
    """A Hub-convention chat row: ``messages`` with one ``{"type": "image"}`` per image."""
    content = []
    for k in range(len(images)):
        content += [{"type": "image"}, {"type": "text", "text": f"Picture {k + 1}."}]
    content.append({"type": "text", "text": f"Row {i}: describe what the pictures show, then count the objects."})
    msgs = [{"role": "user", "content": content}]
    if answer:
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": "The picture shows a woman in a uniform standing in front of a flag."}]})
    return {"messages": msgs, "images": list(images)}


def chat_rows(pool: ImagePool, counts: dict[int, int], start: int = 0) -> list[dict]:
    """``counts``: {images per row: number of rows}, e.g. {1: 12, 2: 8, 8: 2}."""
    rows, k = [], start
    for n_img, n_rows in counts.items():
        for _ in range(n_rows):
            rows.append(chat_row(pool.pick(n_img, k), len(rows)))
            k += n_img
    return rows


def decode_images(row: dict) -> list[Image.Image]:
    """What ``datasets`` hands a map function for an ``Image()`` column: decoded PIL images."""
    out = []
    for v in row["images"]:
        im = Image.open(io.BytesIO(v["bytes"]))
        im.load()
        out.append(im)
    return out
