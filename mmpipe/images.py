"""Images in, resized uint8 patches out, and float32 ``pixel_values`` back at collate time.

The transformers PIL Qwen image processor does: RGB conversion (alpha composited on
white) -> bicubic PIL resize of the uint8 image to the `smart_resize` size -> ``x/255`` ->
``(x - mean) / std`` in float32 -> patch layout. Everything after the resize is a function
of each uint8 value and its channel, so a 256-entry table per channel reproduces the
processor bit for bit (`VisionSpec.lut`). We therefore store the resized uint8 image once
and produce float32 only when a batch is built.

Bad input (policy, tested by the corpus in ``tests/bad_inputs.py``): every failure is an
`mmpipe.errors.ImageError` naming the image. EXIF orientation is applied on every route
(bytes, path, PIL, ``datasets.Image()``; the layout-only path reads it from the header), so
an EXIF-rotated photo is upright - as ``datasets`` decodes it, and unlike the transformers
processor given the raw PIL image, which ignores the tag. Modes convert as the processor
does (``convert("RGB")``, transparency over white); 16-bit/int/float modes whose values do
not fit 0..255 raise instead of being clipped to white. Images beyond PIL's
decompression-bomb limit (2 x ``PIL.Image.MAX_IMAGE_PIXELS``) raise, which bounds decode
memory (PIL holds RGB in 4 bytes per pixel; grayscale, 1, is resized before RGB conversion).
"""

from __future__ import annotations

import io
import math
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from PIL import Image, ImageOps

from .errors import ImageError
from .families import ModelFamily, family_of


@dataclass(frozen=True)
class VisionSpec:
    """Image-processing constants, read from a processor (or a family's defaults)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple
    image_std: tuple
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = 3  # PIL.Image.BICUBIC, the Qwen processors' filter

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_family(cls, fam: ModelFamily) -> "VisionSpec":
        return cls(
            fam.patch_size, fam.temporal_patch_size, fam.merge_size, fam.min_pixels, fam.max_pixels,
            tuple(fam.image_mean), tuple(fam.image_std),
        )

    @classmethod
    def from_processor(cls, processor, min_pixels=None, max_pixels=None) -> "VisionSpec":
        ip = getattr(processor, "image_processor", None)
        fam = family_of(processor)
        if ip is None:
            return cls.from_family(fam)
        size = getattr(ip, "size", None) or {}
        get = (lambda k: size.get(k)) if isinstance(size, dict) else (lambda k: getattr(size, k, None))
        mn = min_pixels or get("shortest_edge") or getattr(ip, "min_pixels", None) or fam.min_pixels
        mx = max_pixels or get("longest_edge") or getattr(ip, "max_pixels", None) or fam.max_pixels
        mean = getattr(ip, "image_mean", None) or fam.image_mean
        std = getattr(ip, "image_std", None) or fam.image_std
        mean = tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * 3
        std = tuple(std) if isinstance(std, (list, tuple)) else (std,) * 3
        return cls(
            int(getattr(ip, "patch_size", fam.patch_size)),
            int(getattr(ip, "temporal_patch_size", fam.temporal_patch_size)),
            int(getattr(ip, "merge_size", fam.merge_size)),
            int(mn), int(mx), mean, std,
            float(getattr(ip, "rescale_factor", 1 / 255)),
            bool(getattr(ip, "do_rescale", True)),
            bool(getattr(ip, "do_normalize", True)),
            int(getattr(ip, "resample", None) if getattr(ip, "resample", None) is not None else 3),
        )

    def lut(self) -> np.ndarray:
        """float32 [3, 256]: the processor's value for each uint8 value of each channel,
        computed with the processor's own float ops (float64 rescale, float32 normalise)."""
        v = np.arange(256, dtype=np.uint8)
        x = v.astype(np.float64) * self.rescale_factor if self.do_rescale else v.astype(np.float64)
        x = x.astype(np.float32)
        if not self.do_normalize:
            return np.stack([x, x, x])
        mean = np.asarray(self.image_mean, dtype=np.float32)
        std = np.asarray(self.image_std, dtype=np.float32)
        return ((x[None, :] - mean[:, None]) / std[:, None]).astype(np.float32)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen's resize target: both sides multiples of ``factor``, area within bounds,
    aspect ratio kept as closely as possible (ratio must be < 200)."""
    if min(height, width) <= 0:
        raise ImageError(
            f"image has size {height}x{width}; an image needs at least one pixel each way",
            where="", expected="height >= 1 and width >= 1", found=f"{height}x{width}",
            fix="drop the row or replace the empty image",
        )
    if max(height, width) / min(height, width) > 200:
        raise ImageError(
            f"image {height}x{width} has aspect ratio {max(height, width) / min(height, width):.1f}; "
            "Qwen-VL processors need it to be at most 200", where="",
            expected="max(h, w) / min(h, w) <= 200 (transformers smart_resize)",
            found=f"{max(height, width) / min(height, width):.1f}", fix="crop or pad the image",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# ---- loading ---------------------------------------------------------------------------
def load_image(value: Any, *, where: str = "image") -> Image.Image:
    """Any supported image value -> PIL image (not yet decoded where PIL can avoid it).

    Accepted: PIL image; ``datasets.Image()`` value ``{"bytes": ..., "path": ...}``; a file
    path (or ``file://``); a base64 ``data:image/...`` URI; raw encoded bytes; a uint8 array
    ``[H, W]``, ``[H, W, 1|3|4]``. URLs are refused (mmpipe does not fetch).
    """
    if isinstance(value, Image.Image):
        return value
    found = f"{type(value).__name__}"
    try:
        if isinstance(value, dict):
            if value.get("bytes") is not None:
                return Image.open(io.BytesIO(value["bytes"]))
            if value.get("path") is not None:
                return load_image(value["path"], where=where)
            raise ImageError("the image dict has neither 'bytes' nor 'path'", where=where,
                             expected="{'bytes': <encoded image>} or {'path': <file>}", found=f"keys {sorted(value)}",
                             fix="store images with datasets.Image() or give a path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return Image.open(io.BytesIO(bytes(value)))
        if isinstance(value, str) and value.startswith("data:"):
            return Image.open(io.BytesIO(_data_uri_bytes(value, where)))
        if isinstance(value, (str, os.PathLike)):
            path = os.fspath(value)
            if path.startswith("file://"):
                path = path[len("file://"):]
            if path.startswith(("http://", "https://")):
                raise ImageError(f"{path[:80]!r} is a URL; mmpipe does not fetch images", where=where,
                                 expected="a local path, encoded bytes, a data: URI or a PIL image", found="a URL",
                                 fix="download the images first (e.g. datasets' Image() cast on a local copy)")
            if not os.path.exists(path):
                raise ImageError(f"no such file: {path!r}", where=where, expected="an existing image file",
                                 found="a missing path",
                                 fix="fix the path (relative paths resolve against the working directory) "
                                     "or embed the image bytes with datasets.Image()")
            return Image.open(path)
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            return _array_to_pil(value, where)
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        raise _bomb_error(e, where) from e
    except (OSError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise _unreadable(e, where, found) from e
    raise ImageError(
        f"unsupported image value of type {type(value).__name__}", where=where,
        expected="a PIL image, a datasets Image dict, a path, encoded bytes or a uint8 array [H, W, C]",
        found=type(value).__name__, fix="convert the value to one of those",
    )


def _data_uri_bytes(uri: str, where: str) -> bytes:
    """``data:image/png;base64,...`` (OpenAI-style ``image_url``) -> the encoded image bytes."""
    import base64
    import binascii

    head, sep, payload = uri.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError("unsupported data: URI", where=where, expected="data:image/<type>;base64,<payload>",
                         found=repr(uri[:40]), fix="base64-encode the image bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"the data: URI's base64 payload is invalid ({e})", where=where,
                         fix="re-encode the image with base64.b64encode") from e


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _unreadable(e: Exception, where: str, found: str = "") -> ImageError:
    # PIL names the stream by its repr ("<_io.BytesIO object at 0x7f...>"): keep the
    # message (and an on_error="skip" record) the same from run to run
    detail = _OBJECT_REPR.sub("the image data", str(e))
    return ImageError(
        f"cannot read the image ({type(e).__name__}: {detail})", where=where,
        expected="a complete PNG/JPEG/WebP/GIF/... file", found=found or None,
        fix="the bytes are corrupt or truncated: re-export the image, or drop the row (on_error='skip')",
    )


def _bomb_error(e: Exception, where: str) -> ImageError:
    return ImageError(
        f"the image is larger than PIL's decompression-bomb limit ({e})", where=where,
        expected=f"at most {2 * Image.MAX_IMAGE_PIXELS} pixels (2 x PIL.Image.MAX_IMAGE_PIXELS)",
        fix="downscale the file before encoding, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the "
            "source (decoding takes about 3 bytes per pixel)",
    )


def _array_to_pil(arr: np.ndarray, where: str = "image") -> Image.Image:
    arr = _check_array(arr, where)
    if arr.ndim == 2:
        return Image.fromarray(arr, mode="L")
    return Image.fromarray(arr, mode="RGB" if arr.shape[-1] == 3 else "RGBA")


def _check_array(arr: np.ndarray, where: str) -> np.ndarray:
    """A uint8 [H, W] / [H, W, 1|3|4] array (a trailing channel of 1 dropped), or raise."""
    if arr.dtype != np.uint8:
        raise ImageError("image arrays must be uint8", where=where, expected="dtype uint8 [H, W, C]",
                         found=f"dtype {arr.dtype}",
                         fix="convert with np.clip(x, 0, 255).astype(np.uint8) (x*255 first for 0..1 floats)")
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4)):
        return arr
    raise ImageError("image arrays must be [H, W] or [H, W, 1|3|4]", where=where,
                     expected="[H, W], [H, W, 1], [H, W, 3] or [H, W, 4]", found=f"shape {arr.shape}",
                     fix="channels last; one image per array")


# EXIF orientations 5..8 swap width and height (transpose / rotate by 90 degrees)
_EXIF_ORIENTATION = 0x0112
_SWAPS_AXES = (5, 6, 7, 8)


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1..8; 1 = upright) from the header; no pixel decode.

    A PNG's eXIf chunk counts only when it comes before the image data (where the PNG
    standard puts it, and PIL writes it): looking for a later one makes PIL decode the image."""
    if img.format == "PNG" and "exif" not in img.info:
        return 1
    try:
        o = img.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block: PIL itself ignores it when decoding
        return 1
    return int(o) if isinstance(o, int) and 1 <= o <= 8 else 1


def upright(img: Image.Image) -> Image.Image:
    """The image as displayed: EXIF orientation applied (``PIL.ImageOps.exif_transpose``,
    as ``datasets.Image()`` decoding does); the image itself when already upright."""
    if exif_orientation(img) == 1:
        return img
    return ImageOps.exif_transpose(img)


def image_hw(value: Any, *, where: str = "image") -> tuple[int, int]:
    """(height, width) of the upright image from the header alone; no pixel decode."""
    if isinstance(value, np.ndarray):
        _check_array(value, where)
        return int(value.shape[0]), int(value.shape[1])
    img = load_image(value, where=where)
    w, h = img.size
    return (w, h) if exif_orientation(img) in _SWAPS_AXES else (h, w)


_WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")


def _check_range(img: Image.Image) -> None:
    """16-bit / int / float images: PIL's (and so the processor's) RGB conversion clips
    values to 0..255, turning a 16-bit photo white. Raise instead of training on that."""
    if img.mode not in _WIDE_MODES:
        return
    lo, hi = img.getextrema()
    if lo < 0 or hi > 255:
        raise ImageError(
            f"{img.mode} image with values {lo}..{hi}: converting it to RGB clips them to 0..255 "
            "(what the transformers processor does), which would wash the image out", where="",
            expected="8-bit data (values 0..255)", found=f"mode {img.mode}, values {lo}..{hi}",
            fix="convert to 8 bits yourself, e.g. Image.fromarray((np.asarray(img) >> 8).astype(np.uint8))",
        )


def to_rgb_image(img: Image.Image) -> Image.Image:
    """The RGB PIL image the processor works on, transparency composited onto white (as
    transformers does). An RGB image without transparency is returned as is (no copy)."""
    _check_range(img)
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3], transparency composited onto white (as transformers does)."""
    return np.asarray(to_rgb_image(img))


def resize_image(img: Image.Image, spec: VisionSpec) -> np.ndarray:
    """uint8 [H', W', 3]: the image exactly as the Qwen processor resizes it.

    The processor converts to a numpy array and back to PIL before its bicubic resize; PIL
    resizes the same pixels the same way without the round trip, so this resizes the RGB PIL
    image directly (two full-image copies fewer). EXIF orientation is applied first.

    Grayscale ("L") images are resized before the conversion to RGB: the conversion copies
    the one band into three and the resize treats each band alike, so the result is the same
    bytes, while a large grayscale image is never held as RGB (1 byte per source pixel, not 4)."""
    img = upright(img)
    w, h = img.size
    th, tw = smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels)
    if img.mode == "L" and img.info.get("transparency") is None:
        small = img.resize((tw, th), resample=spec.resample) if (tw, th) != img.size else img
        return np.asarray(small.convert("RGB"))
    rgb = to_rgb_image(img)
    if (tw, th) != rgb.size:
        rgb = rgb.resize((tw, th), resample=spec.resample)
    return np.asarray(rgb)


# ---- patch layout ----------------------------------------------------------------------
def patchify_u8(img: np.ndarray, spec: VisionSpec) -> np.ndarray:
    """uint8 [H, W, 3] (H, W multiples of patch*merge) -> uint8 [gh*gw, 3*p*p] in the
    processor's merge-window-major order (each merge^2 consecutive rows are one token)."""
    p, m = spec.patch_size, spec.merge_size
    H, W, C = img.shape
    gh, gw = H // p, W // p
    x = img.reshape(gh // m, m, p, gw // m, m, p, C)
    # -> (gh/m, gw/m, m_h, m_w, C, p_h, p_w)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)
    return np.ascontiguousarray(x).reshape(gh * gw, C * p * p)


def unpatchify_u8(patches: np.ndarray, grid_h: int, grid_w: int, spec: VisionSpec) -> np.ndarray:
    """Inverse of `patchify_u8`: uint8 [gh*gw, 3*p*p] -> uint8 [gh*p, gw*p, 3]."""
    p, m = spec.patch_size, spec.merge_size
    x = patches.reshape(grid_h // m, grid_w // m, m, m, 3, p, p)
    x = x.transpose(0, 2, 5, 1, 3, 6, 4)  # (gh/m, m_h, p_h, gw/m, m_w, p_w, C)
    return np.ascontiguousarray(x).reshape(grid_h * p, grid_w * p, 3)


def u8_to_pixel_values(patches: np.ndarray, lut: np.ndarray, temporal_patch_size: int, *,
                       threads: Optional[int] = None) -> np.ndarray:
    """Compact image patches uint8 [N, 3*p*p] -> float32 [N, 3*T*p*p], the processor's
    ``pixel_values`` (the still image repeated over the T temporal slots).

    ``threads``: worker threads for large inputs (default `default_threads`)."""
    n, d = patches.shape
    out = _lut_expand(patches.reshape(n, 3, d // 3), lut, temporal_patch_size, threads)
    return out.reshape(n, 3 * temporal_patch_size * (d // 3))


def u8_video_to_pixel_values(patches: np.ndarray, lut: np.ndarray, *, threads: Optional[int] = None) -> np.ndarray:
    """Compact video patches uint8 [Nv, 3*T*p*p] -> float32 [Nv, 3*T*p*p]."""
    n, d = patches.shape
    return _lut_expand(patches.reshape(n, 3, d // 3), lut, 1, threads).reshape(n, d)


# The float32 expansion is a table lookup per byte, written T times. Done as one numpy gather
# per (chunk, channel) with a table indexed by TWO adjacent pixels (uint16 -> the two float32
# values as one 8-byte word: 65536 entries, 512 KB per channel), i.e. half the lookups of a
# 256-entry table; the gathered chunk stays in cache while it is copied to its T slots. On
# one thread this runs at ~70-80% of the speed of a plain copy of the output into fresh
# memory, on two about at it (bench/): numpy's gather releases the GIL, so large batches are
# split over threads.
_PAIR_TABLES: dict[bytes, np.ndarray] = {}
_CHUNK_ROWS = 512  # patch rows per gather: ~200-400 KB of output, cache-resident
_MIN_BYTES_PER_THREAD = 16 << 20


def _pair_table(lut: np.ndarray) -> np.ndarray:
    """float32 [3, 256] -> uint64 [3, 65536]: entry v holds the float32 values of the two
    pixels whose bytes, in memory order, make the uint16 v."""
    key = lut.tobytes()
    table = _PAIR_TABLES.get(key)
    if table is None:
        two_bytes = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(65536, 2)
        table = np.ascontiguousarray(lut.astype(np.float32)[:, two_bytes]).view(np.uint64).reshape(3, 65536)
        if len(_PAIR_TABLES) >= 8:
            _PAIR_TABLES.clear()
        _PAIR_TABLES[key] = table
    return table


def _lut_expand(x: np.ndarray, lut: np.ndarray, reps: int, threads: Optional[int]) -> np.ndarray:
    """uint8 [n, 3, k] -> float32 [n, 3, reps, k]: lut[c][x[:, c]] copied into each of the reps slots."""
    n, _, k = x.shape
    x = np.ascontiguousarray(x)
    if k % 2 == 0:  # pairs of pixels per lookup
        table, idx, width, dtype = _pair_table(lut), x.view(np.uint16), k // 2, np.uint64
    else:
        table, idx, width, dtype = np.ascontiguousarray(lut, dtype=np.float32), x, k, np.float32
    out = np.empty((n, 3, reps, width), dtype)

    def work(r0: int, r1: int) -> None:
        tmp = np.empty((min(_CHUNK_ROWS, r1 - r0), width), dtype)
        for s in range(r0, r1, _CHUNK_ROWS):
            e = min(r1, s + _CHUNK_ROWS)
            t = tmp[: e - s]
            for c in range(3):
                np.take(table[c], idx[s:e, c], out=t, mode="wrap")  # "wrap": indices are in range; unbuffered
                for r in range(reps):
                    out[s:e, c, r] = t

    _parallel_rows(work, n, out.nbytes, threads)
    return out.view(np.float32).reshape(n, 3, reps, k)


def _parallel_rows(work, n: int, nbytes: int, threads: Optional[int]) -> None:
    """Run ``work(r0, r1)`` over row ranges covering 0..n, on up to ``threads`` threads."""
    k = default_threads() if threads is None else max(1, int(threads))
    k = min(k, max(1, nbytes // _MIN_BYTES_PER_THREAD), max(1, n // _CHUNK_ROWS))
    if k <= 1:
        work(0, n)
        return
    step = -(-n // k)
    step = -(-step // _CHUNK_ROWS) * _CHUNK_ROWS
    bounds = [(s, min(n, s + step)) for s in range(0, n, step)]
    futures = [thread_pool().submit(work, a, b) for a, b in bounds[1:]]
    work(*bounds[0])
    for f in futures:
        f.result()


# ---- worker threads --------------------------------------------------------------------
# PIL's decode and resize and numpy's gather release the GIL, so threads give real
# parallelism for them. The pool is made on first use and forgotten in a forked child
# (its threads do not exist there).
_POOL = None
_POOL_LOCK = threading.Lock()


def default_threads() -> int:
    """Threads mmpipe uses for image work in this process: 1 in a forked worker process
    (``datasets.map(num_proc=...)``, DataLoader workers: the processes already share the
    cores), else torch's intra-op thread count when torch is loaded (``torch.set_num_threads``
    governs it), else the usable CPU count; at most 8. ``MMPIPE_THREADS`` overrides it."""
    env = os.environ.get("MMPIPE_THREADS")
    if env:
        return max(1, int(env))
    from . import _fork

    if _fork._forked_child:
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return max(1, min(8, torch.get_num_threads()))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def thread_pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mmpipe")
        return _POOL


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _invert_lut(x: np.ndarray, lut: np.ndarray, what: str) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 [n, 3, k] with lut[c][out] == x exactly, or raise."""
    out = np.empty(x.shape, dtype=np.uint8)
    for c in range(3):  # each channel's table is strictly increasing (std > 0)
        idx = np.searchsorted(lut[c], x[:, c, :]).clip(0, 255)
        if not np.array_equal(lut[c][idx], x[:, c, :]):
            raise ValueError(f"{what} were not produced from uint8 pixels with these normalisation constants")
        out[:, c, :] = idx
    return out


def pixel_values_to_u8(pixel_values: np.ndarray, lut: np.ndarray, temporal_patch_size: int) -> np.ndarray:
    """Inverse of `u8_to_pixel_values` for still images: float32 [N, 3*T*p*p] -> uint8
    [N, 3*p*p]. Exact, or raises (values not from the table, or temporal copies differ)."""
    n, d = pixel_values.shape
    x = pixel_values.reshape(n, 3, temporal_patch_size, d // (3 * temporal_patch_size))
    if not (x == x[:, :, :1, :]).all():
        raise ValueError("pixel_values hold different temporal copies: a video, not a still image")
    return _invert_lut(np.ascontiguousarray(x[:, :, 0, :]), lut, "pixel_values").reshape(n, d // temporal_patch_size)


def video_pixel_values_to_u8(pixel_values: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Inverse of `u8_video_to_pixel_values`: float32 [Nv, 3*T*p*p] -> uint8, exact or raise."""
    n, d = pixel_values.shape
    return _invert_lut(pixel_values.reshape(n, 3, d // 3), lut, "pixel_values_videos").reshape(n, d)


def encode_image(value: Any, spec: VisionSpec, *, where: str = "image") -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (uint8 patches [gh*gw, 3*p*p], grid (1, gh, gw))."""
    img = load_image(value, where=where)
    try:
        resized = resize_image(img, spec)
    except ImageError as e:
        e.where = where if e.where == "" else e.where
        raise
    except Image.DecompressionBombError as e:
        raise _bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:  # decoding happens here (PIL opens lazily)
        raise _unreadable(e, where, getattr(img, "format", None) and f"a {img.format} image") from e
    p = spec.patch_size
    return patchify_u8(resized, spec), (1, resized.shape[0] // p, resized.shape[1] // p)


def image_grid(value: Any, spec: VisionSpec, *, where: str = "image") -> tuple[int, int, int]:
    """Grid (1, gh, gw) from the image size alone (layout-only path)."""
    h, w = image_hw(value, where=where)
    try:
        th, tw = smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels)
    except ImageError as e:
        e.where = where if e.where == "" else e.where
        raise
    return 1, th // spec.patch_size, tw // spec.patch_size
