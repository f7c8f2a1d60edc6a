"""Offline fixtures: sample images - real photographs that ship with matplotlib, and
deterministic synthetic images of assorted sizes and modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from mmpipe.errors import ArgumentError

__all__ = ["sample_photos", "tiny_image", "generated_images"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def sample_photos() -> list[tuple[str, Image.Image]]:
    """The real images shipped with matplotlib (``mpl-data/sample_data``), as RGB PIL images.

    Sorted by file name, e.g. ``("grace_hopper.jpg", <512x600 RGB>)``. Fresh image objects each
    call. Needs matplotlib (the demo and test extras).
    """
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover
        raise ImportError("sample_photos() needs matplotlib (pip install mmpipe[demo])") from e
    root = Path(matplotlib.get_data_path()) / "sample_data"
    out = []
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        if not path.is_file() or path.suffix.lower() not in _IMAGE_SUFFIXES:
            continue
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except OSError:
            continue
        out.append((path.relative_to(root).as_posix(), img))
    return out


def tiny_image(h: int, w: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic ``w x h`` PIL image: colour gradients plus seeded noise, in ``mode``.

    ``mode`` "RGB", "RGBA" (alpha is a gradient too), "L" or anything PIL converts RGB to.
    """
    if h <= 0 or w <= 0:
        raise ArgumentError(f"image size must be positive, got {h}x{w}")
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h, dtype=np.float64)[:, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float64)[None, :]
    phase = rng.uniform(0, 2 * np.pi, size=3)
    base = np.stack(
        [
            0.5 + 0.5 * np.sin(2 * np.pi * (x + 0.5 * y) + phase[0]) * np.ones_like(y),
            0.5 + 0.5 * np.cos(2 * np.pi * (y - 0.3 * x) + phase[1]) * np.ones_like(x),
            0.5 + 0.5 * np.sin(6 * np.pi * x * y + phase[2]),
        ],
        axis=-1,
    )
    noise = rng.normal(0.0, 0.08, size=(h, w, 3))
    arr = np.clip((base + noise) * 255.0, 0, 255).round().astype(np.uint8)
    if mode == "RGB":
        return Image.fromarray(arr, "RGB")
    if mode == "RGBA":
        alpha = np.clip((0.25 + 0.75 * x * np.ones_like(y)) * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(np.dstack([arr, alpha]), "RGBA")
    return Image.fromarray(arr, "RGB").convert(mode)


def generated_images(seed: int = 0) -> list[tuple[str, Image.Image]]:
    """A few deterministic synthetic images of assorted sizes and modes, as ``(name, image)``.

    Names give height then width: RGB h48 x w64, h300 x w400 (the FACTS example: 308x392
    after smart_resize with the real bounds), h97 x w211, h512 x w128 (aspect ratios 0.25 to
    2.2), a flat grey 28x28, one RGBA and one grayscale ("L") image. Fresh objects each call.
    """
    specs = [  # (name, h, w, mode)
        ("rgb_h48_w64", 48, 64, "RGB"),
        ("rgb_h300_w400", 300, 400, "RGB"),
        ("rgb_h97_w211", 97, 211, "RGB"),
        ("rgb_h512_w128", 512, 128, "RGB"),
        ("rgba_h90_w120", 90, 120, "RGBA"),
        ("gray_h100_w150", 100, 150, "L"),
    ]
    out = [(name, tiny_image(h, w, seed=seed + i, mode=mode)) for i, (name, h, w, mode) in enumerate(specs)]
    out.insert(4, ("flat_h28_w28", Image.new("RGB", (28, 28), (128, 128, 128))))
    return out
