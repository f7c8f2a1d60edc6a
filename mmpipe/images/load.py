"""Any image value (datasets.Image() dict, path, bytes, data URI, PIL, uint8 array) -> an upright
RGB PIL image, or an `ImageError` naming the image. Header-only size reads for the layout path."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Optional

import numpy as np
from PIL import Image, ImageFile

from mmpipe.errors import ArgumentError, ImageError, InputError
from mmpipe.images.headers import bomb_error, decoded_unless_whole, open_whole, unreadable_error  # noqa: F401
from mmpipe.images.orientation import SWAPS_AXES, exif_orientation, read_pixels, upright  # noqa: F401 - here too
from mmpipe.images.rgb import check_range, to_rgb_array, to_rgb_image, unconvertible_error  # noqa: F401 - here too
from mmpipe.images.transparency import (ENGINE_TRANSPARENCY, TRANSPARENCY_ENV, TRANSPARENCY_RULES,  # noqa: F401
                                        apply_rule, check_transparency, has_transparency, installed_transparency,
                                        rule_of, transparency_rule)

# ---- image files -------------------------------------------------------------------------
MAX_IMAGE_BYTES_ENV = "MMPIPE_MAX_IMAGE_BYTES"
DEFAULT_MAX_IMAGE_BYTES = 256 * 2**20  # 256 MiB; PIL's pixel limit bounds the decode itself


def max_image_bytes() -> int:
    """The largest image file mmpipe reads: ``$MMPIPE_MAX_IMAGE_BYTES`` or 256 MiB."""
    raw = os.environ.get(MAX_IMAGE_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_IMAGE_BYTES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise ArgumentError(f"{MAX_IMAGE_BYTES_ENV}={raw!r} must be a positive number of bytes "
                            f"(unset: {DEFAULT_MAX_IMAGE_BYTES})")
    return n


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_OPEN_FIX = ("point the path at an image file: mmpipe opens only regular files (a FIFO, device or socket "
             "could block or never end), or drop the row (on_error='skip')")


def file_kind(mode: int) -> str:
    """What a path of ``st_mode`` ``mode`` is, in words ("a directory", "a FIFO (named pipe)"...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _file_error(path: str, where: Optional[str], found: str, fix: str = _OPEN_FIX) -> ImageError:
    return ImageError(f"image path {path!r} is {found}, not a regular file", where=where,
                      expected="a regular image file", found=found, fix=fix)


def _stat_error(path: str, e: OSError, where: Optional[str]) -> ImageError:
    if isinstance(e, FileNotFoundError):
        found = "a dangling symlink" if os.path.islink(path) else "a missing path"
        looked = "" if os.path.isabs(path) else f" (a relative path resolves against the working directory {os.getcwd()!r})"
        return ImageError(f"no such file: {path!r}", where=where, expected="an existing image file", found=found,
                          fix=f"fix the path{looked} or embed the image bytes with datasets.Image()")
    found = {errno.ELOOP: "a symlink loop", errno.ENOTDIR: "a path through a non-directory",
             errno.EACCES: "not readable (permission denied)", errno.ENXIO: "a socket or device with no reader",
             errno.ENAMETOOLONG: "a path that is too long"}.get(e.errno, f"not readable ({e.strerror})")
    return _file_error(path, where, found, fix="fix the path or its permissions, or drop the row (on_error='skip')")


def _check_stat(path: str, st: os.stat_result, where: Optional[str], limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _file_error(path, where, file_kind(st.st_mode))
    if st.st_size > limit:
        raise _too_large(path, f"{st.st_size} bytes", where, limit)


def _too_large(path: str, found: str, where: Optional[str], limit: int) -> ImageError:
    return ImageError(f"image file {path!r} has {found}, more than the {limit}-byte limit",
                      where=where, expected=f"at most {limit} bytes (${MAX_IMAGE_BYTES_ENV})", found=found,
                      fix=f"downscale or re-encode the image, or raise ${MAX_IMAGE_BYTES_ENV} if you trust it")


def check_image_file(path: str, *, where: Optional[str] = "image") -> os.stat_result:
    """``os.stat`` of an image path that is a regular file within `max_image_bytes`, else an
    `ImageError` naming the path, what it is (FIFO, directory, device, socket, symlink loop,
    missing, too large) and the fix. Nothing is opened."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stat_error(path, e, where) from None
    _check_stat(path, st, where, max_image_bytes())
    return st


def open_image_file(path: str, *, where: Optional[str] = "image"):
    """A binary file object on a checked regular image file (`check_image_file`). Opened
    non-blocking and checked again with ``fstat``, so a FIFO swapped in after the check
    cannot block the read. The caller closes it."""
    check_image_file(path, where=where)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _stat_error(path, e, where) from None
    try:
        _check_stat(path, os.fstat(fd), where, max_image_bytes())
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_image_file(path: str, *, where: Optional[str] = "image") -> bytes:
    """The bytes of a regular image file, reading at most `max_image_bytes` + 1 bytes."""
    limit = max_image_bytes()
    with open_image_file(path, where=where) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # the file grew after the check
        raise _too_large(path, "more bytes than its size said (it grew while read)", where, limit)
    return data


def image_path(value: Any, *, where: Optional[str] = "image") -> Optional[str]:
    """The local file an image value names (a path, ``file://`` path, or ``datasets.Image()``
    dict without bytes), or None for in-memory values (bytes, data: URIs, PIL, arrays).
    URLs raise `ImageError` (mmpipe does not fetch)."""
    if isinstance(value, dict):
        if value.get("bytes") is not None or value.get("path") is None:
            return None
        value = value["path"]
    if isinstance(value, str) and value.startswith("data:"):
        return None
    if not isinstance(value, (str, os.PathLike)):
        return None
    path = os.fsdecode(os.fspath(value))
    if path.startswith("file://"):
        path = path[len("file://"):]
    if path.startswith(("http://", "https://")):
        raise ImageError(f"{path[:80]!r} is a URL; mmpipe does not fetch images", where=where,
                         expected="a local path, encoded bytes, a data: URI or a PIL image", found="a URL",
                         fix="download the images first (e.g. datasets' Image() cast on a local copy)")
    return path


def check_image_root(root) -> Optional[str]:
    """An ``image_root`` option: None, or an existing directory (its absolute, symlink-free
    path); anything else raises `ArgumentError`."""
    if root is None:
        return None
    if not isinstance(root, (str, os.PathLike)) or not os.path.isdir(root):
        raise ArgumentError(f"image_root must be an existing directory, got {root!r:.120}")
    return os.path.realpath(os.fsdecode(os.fspath(root)))


def confine_image(value: Any, root: Optional[str], *, where: Optional[str] = "image") -> None:
    """Raise `ImageError` when ``value`` names a file outside directory ``root`` (after
    resolving symlinks and ``..``; relative paths resolve against the working directory).
    In-memory values and ``root=None`` pass. For datasets from untrusted sources."""
    path = image_path(value, where=where)
    if root is None or path is None:
        return
    real, top = os.path.realpath(path), os.path.realpath(root)
    try:
        inside = os.path.commonpath([real, top]) == top
    except ValueError:  # different drives
        inside = False
    if not inside:
        raise ImageError(f"image path {path!r} resolves to {real!r}, outside the image root {top!r}", where=where,
                         expected=f"a file under {top}", found=real,
                         fix="the dataset refers to a file outside image_root: fix the path, drop the row "
                             "(on_error='skip'), or widen image_root if you trust the source")


# ---- loading ---------------------------------------------------------------------------
def load_image(value: Any, *, where: str = "image") -> Image.Image:
    """Any supported image value -> PIL image (not yet decoded where PIL can avoid it).

    Accepted: PIL image; ``datasets.Image()`` value ``{"bytes": ..., "path": ...}``; a file
    path (or ``file://``); a base64 ``data:image/...`` URI; raw encoded bytes; a uint8 array
    ``[H, W]``, ``[H, W, 1|3|4]``. URLs are refused (mmpipe does not fetch). A path is read
    only when it is a regular file of at most `max_image_bytes` (``$MMPIPE_MAX_IMAGE_BYTES``,
    default 256 MiB; `read_image_file`): a FIFO, directory, device, socket, symlink loop,
    missing or oversized file raises `ImageError` naming the path and what it is.
    """
    if isinstance(value, Image.Image):
        if closed_before_read(value):
            raise closed_error(value, where)
        return value
    found = f"{type(value).__name__}"
    try:
        if isinstance(value, dict):
            if value.get("bytes") is not None:
                data = value["bytes"]
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise ImageError("the image dict's 'bytes' is not bytes", where=where,
                                     expected="{'bytes': <encoded image bytes>}", found=type(data).__name__,
                                     fix="store the encoded file's bytes (e.g. open(path, 'rb').read()), or give 'path'")
                return open_whole(bytes(data), where)
            if value.get("path") is not None:
                return load_image(value["path"], where=where)
            raise ImageError("the image dict has neither 'bytes' nor 'path'", where=where,
                             expected="{'bytes': <encoded image>} or {'path': <file>}", found=f"keys {sorted(value)}",
                             fix="store images with datasets.Image() or give a path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return open_whole(bytes(value), where)
        if isinstance(value, str) and value.startswith("data:"):
            return open_whole(data_uri_bytes(value, where), where)
        if isinstance(value, (str, os.PathLike)):
            path = image_path(value, where=where)
            found = f"file {path!r}"
            return open_whole(read_image_file(path, where=where), where)
        if hasattr(value, "detach"):
            value = tensor_array(value, where)
        value = nested_lists_array(value, where)
        if isinstance(value, np.ndarray):
            return _array_to_pil(value, where)
    except (ImageError, ArgumentError):
        raise
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise unreadable_error(e, where, found) from e
    raise ImageError(
        f"unsupported image value of type {type(value).__name__}", where=where,
        expected="a PIL image, a datasets Image dict, a path, encoded bytes or a uint8 array [H, W, C]",
        found=type(value).__name__, fix="convert the value to one of those",
    )


def closed_before_read(img: Image.Image) -> bool:
    """Whether ``img`` is a PIL image whose file was closed before its pixels were read (PIL
    reads them on first use): ``with Image.open(p) as im: images.append(im)``."""
    if not isinstance(img, ImageFile.ImageFile):
        return False
    # an image unpickled in another process (DataLoader workers hand rows back by pickle) has no
    # ``fp`` attribute at all: its pixels came with it
    fp = getattr(img, "fp", None)
    if fp is not None and not getattr(fp, "closed", False):
        return False
    return bool(img.tile) or getattr(img, "_im", None) is None  # nothing loaded yet


def closed_error(img: Image.Image, where: str) -> ImageError:
    kind = f"{img.format} " if img.format else ""
    return ImageError(
        "the PIL image's file was closed before the image was read (PIL reads the pixels on first use, "
        "after the file is opened)", where=where, expected="a PIL image that is loaded, or whose file is still open",
        found=f"a {kind}image ({img.mode}, {img.width}x{img.height}) whose file is closed, its pixels unread",
        fix="call im.load() inside the `with Image.open(...) as im:` block (or keep the file open until encoding), "
            "or pass the image's path or bytes instead")


def data_uri_bytes(uri: str, where: str, *, error: type = ImageError, kind: str = "image",
                   column: Optional[str] = None) -> bytes:
    """``data:<kind>/<type>;base64,<payload>`` (an OpenAI-style ``image_url`` / ``audio_url``, what
    the chat path's loaders take) -> the encoded file's bytes; a URI that is not base64 is an
    ``error`` (`ImageError`, or the caller's: `mmpipe.audio.load` gives `AudioError`)."""
    import base64
    import binascii

    head, sep, payload = uri.partition(",")
    expected, fix = (f"data:{kind}/<type>;base64,<payload>",
                     f"base64-encode the {kind} file's bytes (base64.b64encode), or give its path or bytes")
    if not sep or not head.endswith(";base64"):
        raise error("unsupported data: URI (not valid base64: no ';base64' before the comma)", where=where,
                    column=column, expected=expected, found=repr(uri[:40]), fix=fix)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise error(f"the data: URI's base64 payload is invalid (not valid base64: {e})", where=where,
                    column=column, expected=expected, found=f"{uri[:40]!r}...", fix=fix) from e


def nested_lists_array(value: Any, where: str = "image") -> Any:
    """An image held as nested lists of integers (what ``datasets`` stores of a numpy array in a
    row: ``Dataset.from_list``, a ``map`` returning frames) -> that uint8 array [H, W(, C)];
    any other value is returned as it is (ragged or non-integer lists stay lists and are
    refused as such). Values outside 0..255 raise `ImageError` (never wrapped around)."""
    if not (isinstance(value, list) and value and isinstance(value[0], list)):
        return value
    try:
        arr = np.asarray(value)
    except ValueError:  # ragged rows
        return value
    if arr.dtype.kind not in "iu" or arr.size == 0:
        return value
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > 255:
        raise ImageError("an image given as nested lists holds values outside 0..255", where=where,
                         expected="uint8 values [H, W, C]", found=f"values {lo}..{hi}",
                         fix="store uint8 pixels (np.clip(x, 0, 255).astype(np.uint8))")
    return arr.astype(np.uint8)


def _array_to_pil(arr: np.ndarray, where: str = "image") -> Image.Image:
    arr = _check_array(arr, where)
    if arr.ndim == 2:
        return Image.fromarray(arr, mode="L")
    return Image.fromarray(arr, mode="RGB" if arr.shape[-1] == 3 else "RGBA")


def tensor_array(value: Any, where: str = "image") -> np.ndarray:
    """A torch image or frame stack (any device) -> numpy. bfloat16 (a dtype numpy lacks; torch's
    ``.numpy()`` raised a bare TypeError) is refused as every non-uint8 image is (`_dtype_error`)."""
    if str(getattr(value, "dtype", "")) == "torch.bfloat16":
        raise _dtype_error("torch.bfloat16", where, "x.float().clamp(0, 255).to(torch.uint8)")
    return value.detach().cpu().numpy()


def _dtype_error(dtype: Any, where: str, convert: str = "np.clip(x, 0, 255).astype(np.uint8)") -> ImageError:
    return ImageError("image arrays must be uint8", where=where, expected="dtype uint8 [H, W, C]",
                      found=f"dtype {dtype}", fix=f"convert with {convert} (x*255 first for 0..1 floats)")


def _check_array(arr: np.ndarray, where: str) -> np.ndarray:
    """A uint8 [H, W] / [H, W, 1|3|4] array (a trailing channel of 1 dropped), or raise."""
    if arr.dtype != np.uint8:
        raise _dtype_error(arr.dtype, where)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4)):
        return arr
    raise ImageError("image arrays must be [H, W] or [H, W, 1|3|4]", where=where,
                     expected="[H, W], [H, W, 1], [H, W, 3] or [H, W, 4]", found=f"shape {arr.shape}",
                     fix="channels last; one image per array")


def decoded_rgb(value: Any, *, where: str = "image", orient: bool = True,
                transparency: Optional[str] = None) -> Image.Image:
    """One image (any form `load_image` takes) -> the RGB PIL image (upright by its EXIF unless
    ``orient=False``; ``transparency``: `to_rgb_image`'s rule), its whole file decoded now (PIL
    decodes lazily): a truncated or corrupt file is this image's `ImageError` (`unreadable_error`,
    `bomb_error`), not PIL's ``OSError`` later (in a processor's call)."""
    img = load_image(value, where=where)
    try:
        read_pixels(img)  # one thread at a time per image object (`mmpipe.images.orientation`)
        return to_rgb_image(upright(img) if orient else img, transparency)
    except InputError as e:
        raise located(e, where)
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:  # PIL: truncated data, bad chunks, unknown modes
        raise unreadable_error(e, where) from e


def image_hw(value: Any, *, where: str = "image") -> tuple[int, int]:
    """(height, width) of the upright image from the header alone; no pixel decode."""
    value = nested_lists_array(value, where)
    if isinstance(value, np.ndarray):
        _check_array(value, where)
        return int(value.shape[0]), int(value.shape[1])
    path = image_path(value, where=where)
    if path is None:  # a decode error: `decoded_unless_whole`'s ImageError, as the pixel route's
        return _upright_hw(decoded_unless_whole(load_image(value, where=where), where))
    with open_image_file(path, where=where) as f:  # the header alone, from a checked regular file
        try:
            return _upright_hw(decoded_unless_whole(Image.open(f), where))
        except ImageError:
            raise
        except Image.DecompressionBombError as e:
            raise bomb_error(e, where) from e
        except (OSError, ValueError) as e:
            raise unreadable_error(e, where, f"file {path!r}") from e


def _upright_hw(img: Image.Image) -> tuple[int, int]:
    w, h = img.size
    return (w, h) if exif_orientation(img) in SWAPS_AXES else (h, w)


def located(e: InputError, where: str) -> InputError:
    """``e`` with ``where`` as its location where its raiser left that to the caller (``where=""``:
    `check_range` inside `to_rgb_image`); returns ``e``."""
    if e.where == "":
        e.where = where
    return e
