"""Resize to the processor's size, uint8 patches <-> float32 ``pixel_values`` through the
per-channel table, and one image -> (uint8 patches [N, 3*p*p], grid (t, h, w))."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from PIL import Image

from mmpipe._fork import torch_fork_safe
from mmpipe.errors import ImageError, PixelDataError
from mmpipe.images import buffers
from mmpipe.images.load import bomb_error, image_hw, load_image, located, to_rgb_image, unreadable_error, upright
from mmpipe.images.backends import resize_u8_torch
from mmpipe.images.spec import VisionSpec
from mmpipe.images.threads import CHUNK_ROWS, parallel_rows


def resize_image(img: Image.Image, spec: VisionSpec) -> np.ndarray:
    """uint8 [H', W', 3]: the image exactly as the Qwen processor resizes it.

    The processor converts to a numpy array and back to PIL before its bicubic resize; PIL
    resizes the same pixels the same way without the round trip, so this resizes the RGB PIL
    image directly (two full-image copies fewer). EXIF orientation is applied first.

    Grayscale ("L") images are resized before the conversion to RGB: the conversion copies
    the one band into three and the resize treats each band alike, so the result is the same
    bytes, while a large grayscale image is never held as RGB (1 byte per source pixel, not 4).

    ``spec.backend == "torchvision"``: the RGB image resized by torch's uint8 antialiased
    bicubic instead, as transformers' torchvision backend does (`backends.resize_u8_torch`)."""
    img = upright(img)
    w, h = img.size
    th, tw = spec.target_size(h, w)
    rule = getattr(spec, "transparency", None)  # None: the installed transformers' rule
    if spec.backend == "torchvision":  # its processor resizes even to the same size, unless do_resize=False
        rgb = np.asarray(to_rgb_image(img, rule))
        return rgb if not getattr(spec, "do_resize", True) else resize_u8_torch(rgb, th, tw)
    if img.mode == "L" and img.info.get("transparency") is None:
        small = img.resize((tw, th), resample=spec.resample) if (tw, th) != img.size else img
        return rgb_view(small.convert("RGB"))
    rgb = to_rgb_image(img, rule)
    if (tw, th) != rgb.size:
        rgb = rgb.resize((tw, th), resample=spec.resample)
    return rgb_view(rgb)


def rgb_view(rgb: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3] of an RGB PIL image: a view of PIL's own pixel memory where it exports one
    (Pillow >= 11.2's Arrow interface: RGB is held as 4 bytes a pixel, the 4th not viewed; the
    view keeps the memory alive), else ``np.asarray`` (a copy through ``tobytes``: two passes
    over the image, ~5% of an encode). Pillow exports an image held in one block (up to its 16
    MiB block size: ~4 MP); a larger one takes the copy."""
    export = getattr(rgb, "__arrow_c_array__", None)
    if export is not None and rgb.mode == "RGB":
        try:
            import pyarrow as pa

            flat = pa.array(rgb)
            w, h = rgb.size
            if flat.type.list_size == 4 and len(flat) == w * h and flat.offset == 0 and flat.null_count == 0:
                data = flat.values.buffers()[1]
                view = np.frombuffer(data, np.uint8, count=w * h * 4).reshape(h, w, 4)[:, :, :3]
                view.flags.writeable = False
                return view
        except (ValueError, TypeError, AttributeError, ImportError):  # several blocks, an older Pillow
            pass
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
    out = buffers.PIXEL_BUFFERS.empty((n, 3, reps, width), dtype)  # a large one: memory already mapped

    def work(r0: int, r1: int) -> None:
        tmp = np.empty((min(CHUNK_ROWS, r1 - r0), width), dtype)
        for s in range(r0, r1, CHUNK_ROWS):
            e = min(r1, s + CHUNK_ROWS)
            t = tmp[: e - s]
            for c in range(3):
                np.take(table[c], idx[s:e, c], out=t, mode="wrap")  # "wrap": indices are in range; unbuffered
                for r in range(reps):
                    out[s:e, c, r] = t

    parallel_rows(work, n, out.nbytes, threads)
    return out.view(np.float32).reshape(n, 3, reps, k)


def _invert_lut(x: np.ndarray, lut: np.ndarray, what: str, stage: str) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 [n, 3, k] with lut[c][out] == x exactly, or raise."""
    out = np.empty(x.shape, dtype=np.uint8)
    for c in range(3):  # each channel's table is strictly increasing (std > 0)
        idx = np.searchsorted(lut[c], x[:, c, :]).clip(0, 255)
        if not np.array_equal(lut[c][idx], x[:, c, :]):
            odd = x[:, c, :][lut[c][idx] != x[:, c, :]]
            raise PixelDataError(f"{what} were not produced from uint8 pixels with these normalisation constants",
                                 where="", column=what, stage=stage, expected=f"channel {c}: values of its table",
                                 found=f"channel {c}: {odd.size} value(s) off it, e.g. {float(odd[0])!r}",
                                 fix="pass the spec (processor) the pixels were made with")
        out[:, c, :] = idx
    return out


def pixel_values_to_u8(pixel_values: np.ndarray, lut: np.ndarray, temporal_patch_size: int, *,
                       stage: str = "collate") -> np.ndarray:
    """Inverse of `u8_to_pixel_values` for still images: float32 [N, 3*T*p*p] -> uint8
    [N, 3*p*p]. Exact, or raises `PixelDataError` at the caller's ``stage`` (values not from
    the table, or temporal copies differ)."""
    n, d = pixel_values.shape
    x = pixel_values.reshape(n, 3, temporal_patch_size, d // (3 * temporal_patch_size))
    if not (x == x[:, :, :1, :]).all():
        raise PixelDataError("pixel_values hold different temporal copies: a video, not a still image", where="",
                             column="pixel_values", stage=stage, expected=f"{temporal_patch_size} equal copies",
                             found="copies that differ",
                             fix="store videos as pixel_values_videos with video_grid_thw")
    u8 = _invert_lut(np.ascontiguousarray(x[:, :, 0, :]), lut, "pixel_values", stage)
    return u8.reshape(n, d // temporal_patch_size)


def video_pixel_values_to_u8(pixel_values: np.ndarray, lut: np.ndarray, *, stage: str = "collate") -> np.ndarray:
    """Inverse of `u8_video_to_pixel_values`: float32 [Nv, 3*T*p*p] -> uint8, exact or raise
    `PixelDataError` at the caller's ``stage``."""
    n, d = pixel_values.shape
    return _invert_lut(pixel_values.reshape(n, 3, d // 3), lut, "pixel_values_videos", stage).reshape(n, d)


def encode_image(value: Any, spec: VisionSpec, *, where: str = "image") -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (uint8 patches [gh*gw, 3*p*p], grid (1, gh, gw))."""
    img = load_image(value, where=where)
    try:
        resized = resize_image(img, spec)
    except ImageError as e:
        raise located(e, where)
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:  # decoding happens here (PIL opens lazily)
        raise unreadable_error(e, where, getattr(img, "format", None) and f"a {img.format} image") from e
    p = spec.patch_size
    return patchify_u8(resized, spec), (1, resized.shape[0] // p, resized.shape[1] // p)


def image_grid(value: Any, spec: VisionSpec, *, where: str = "image") -> tuple[int, int, int]:
    """Grid (1, gh, gw) from the image size alone (layout-only path)."""
    h, w = image_hw(value, where=where)
    try:
        th, tw = spec.target_size(h, w)
    except ImageError as e:
        raise located(e, where)
    return 1, th // spec.patch_size, tw // spec.patch_size



def u8_to_pixel_values_torch(patches, lut, reps: int):
    """The torch twin of `u8_to_pixel_values` / `u8_video_to_pixel_values`, on the device of
    ``patches``: uint8 [N, 3*k] -> float32 [N, 3*reps*k] = lut[c][byte] per channel c, each
    channel's block written ``reps`` times (the temporal slots of a still image; 1 for videos).
    ``lut``: float32 [3, 256] (numpy or torch). A table lookup, so bit for bit the CPU result:
    a trainer gets uint8 from its DataLoader (1/(4*reps) of the float32 bytes over the bus) and
    expands on its GPU. In a forked child (a ``Pool``, a ``datasets.map`` worker) torch runs on one
    thread first: its CPU gather deadlocks there once the parent has run a parallel torch op."""
    import torch

    torch_fork_safe()
    n, d = patches.shape
    table = torch.as_tensor(np.array(lut, np.float32) if isinstance(lut, np.ndarray) else lut,
                            dtype=torch.float32, device=patches.device)
    x = patches.reshape(n, 3, d // 3).long()
    vals = torch.stack([table[c][x[:, c]] for c in range(3)], 1)  # [N, 3, k]
    return vals.unsqueeze(2).expand(n, 3, reps, d // 3).reshape(n, 3 * reps * (d // 3))
