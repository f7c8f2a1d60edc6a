"""Frames -> ``data:`` URLs for the chat API, plus the digest the answer cache keys on."""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from typing import Any

from PIL import Image

from mmpipe.images.load import image_path, load_image, read_image_file, read_pixels, unreadable_error

# Formats every OpenAI-compatible VLM server decodes; others are re-encoded as PNG.
_PASS_THROUGH = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_PNG_MODES = {"RGB", "RGBA", "L", "LA"}


@dataclass(frozen=True)
class EncodedFrame:
    """One frame ready to send.

    Attributes:
        url: ``str`` ``data:<mime>;base64,<payload>``.
        sha256: ``str`` hex digest of the encoded bytes (the cache key's image part).
        size: ``tuple[int, int]`` (width, height).
    """

    url: str
    sha256: str
    size: tuple[int, int]


def encode_frame(value: Any, *, where: str = "frame") -> EncodedFrame:
    """Any image value `mmpipe.images.load_image` accepts -> `EncodedFrame`.

    Accepted: PIL image, ``datasets.Image()`` dict (``{"bytes", "path"}``), a path, encoded
    bytes, a uint8 array ``[H, W]`` / ``[H, W, 1|3|4]`` or a torch tensor of that shape.
    Already-encoded PNG/JPEG/WEBP/GIF bytes are sent unchanged; everything else is encoded
    as PNG (lossless, so equal pixels give equal digests).

    Raises:
        mmpipe.errors.ImageError (a ValueError): the value is not an image or cannot be read
        (the message names ``where``).
    """
    raw = _encoded_bytes(value, where)
    if raw is not None:
        try:
            with Image.open(io.BytesIO(raw)) as im:
                fmt, size = im.format, im.size
        except OSError as e:  # PIL.UnidentifiedImageError is an OSError
            raise unreadable_error(e, where, f"{len(raw)} unreadable bytes",
                                   fix="pass a PIL image, a uint8 [H, W, 3] array, a path or valid encoded bytes") from e
        if fmt in _PASS_THROUGH:
            return _frame(raw, _PASS_THROUGH[fmt], size)
        value = raw
    img = read_pixels(load_image(value, where=where))  # one thread at a time per image object
    if img.mode not in _PNG_MODES:
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return _frame(buf.getvalue(), "image/png", img.size)


def _encoded_bytes(value: Any, where: str = "frame"):
    """The encoded file bytes behind a bytes / datasets-dict / path value, else None. A path
    is read with `read_image_file` (regular files only, at most ``$MMPIPE_MAX_IMAGE_BYTES``):
    a FIFO, directory, device or oversized file raises `ImageError` instead of blocking."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict) and value.get("bytes") is not None:
        return bytes(value["bytes"])
    path = image_path(value, where=where)
    return None if path is None else read_image_file(path, where=where)


def _frame(data: bytes, mime: str, size: tuple[int, int]) -> EncodedFrame:
    url = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
    return EncodedFrame(url, hashlib.sha256(data).hexdigest(), size)
