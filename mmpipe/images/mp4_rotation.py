"""The display rotation of an MP4 / MOV file's first video track, read from its header boxes (no
frame decoded): what FFmpeg's mov demuxer exports as the stream's display matrix (the track header
``tkhd``'s matrix, multiplied by the movie header ``mvhd``'s) and PyAV shows as ``frame.rotation``
once a frame is decoded. `mmpipe.images.video_container.Container.rotation` asks here first, so
that a layout-only encode of a phone video reads its upright size without decoding a frame (a 720p
H.264 file: the first frame's decode more than doubled the time).

Only the plain case is answered: one ``moov`` box, an identity ``mvhd`` matrix, a ``tkhd`` matrix
that is a pure rotation (no flip, no scale), on the first track whose handler is ``vide``; anything
else is None and the caller decodes the first frame (FFmpeg's answer, whatever it is)."""

from __future__ import annotations

import io
import math
import struct
from typing import Optional

__all__ = ["mp4_rotation_degrees"]

MAX_MOOV_BYTES = 64 << 20  # a larger movie header is read by decoding instead
_IDENTITY = (0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)  # 16.16 a b c d, 2.30 u v w


def _boxes(buf: bytes, start: int, end: int):
    """(type, payload start, box end) of each box in ``buf[start:end]``; stops at a malformed size."""
    p = start
    while p + 8 <= end:
        size, kind = struct.unpack(">I4s", buf[p:p + 8])
        head = 8
        if size == 1:
            if p + 16 > end:
                return
            size, head = struct.unpack(">Q", buf[p + 8:p + 16])[0], 16
        elif size == 0:
            size = end - p
        if size < head or p + size > end:
            return
        yield kind, p + head, p + size
        p += size


def _matrix(buf: bytes, start: int, end: int, skip_v0: int, skip_v1: int) -> Optional[tuple]:
    """The 9 matrix values of a full box (``mvhd`` / ``tkhd``) whose matrix follows ``skip_v0`` /
    ``skip_v1`` bytes (version 0 / 1) after its version and flags."""
    if start + 4 > end:
        return None
    off = start + 4 + (skip_v1 if buf[start] == 1 else skip_v0)
    return struct.unpack(">9i", buf[off:off + 36]) if off + 36 <= end else None


def _first_video_matrix(moov: bytes) -> Optional[tuple]:
    """The ``tkhd`` matrix of the first ``vide`` track in a ``moov`` payload; None when the
    movie matrix is not the identity, or no such track is found."""
    movie, tracks = None, []
    for kind, s, e in _boxes(moov, 0, len(moov)):
        if kind == b"mvhd":  # times, timescale, duration, rate(4), volume(2), reserved(10)
            movie = _matrix(moov, s, e, 4 + 4 + 4 + 4 + 4 + 2 + 10, 8 + 8 + 4 + 8 + 4 + 2 + 10)
        elif kind == b"trak":
            tracks.append((s, e))
    if movie is not None and movie != _IDENTITY:
        return None
    for s, e in tracks:
        matrix, handler = None, None
        for kind, ts, te in _boxes(moov, s, e):
            if kind == b"tkhd":  # times, track id, reserved, duration, reserved(8), layer, group, volume, reserved
                matrix = _matrix(moov, ts, te, 4 + 4 + 4 + 4 + 4 + 8 + 2 + 2 + 2 + 2,
                                 8 + 8 + 4 + 4 + 8 + 8 + 2 + 2 + 2 + 2)
            elif kind == b"mdia":
                for mk, ms, me in _boxes(moov, ts, te):
                    if mk == b"hdlr" and ms + 12 <= me:  # version/flags, pre_defined, handler_type
                        handler = moov[ms + 8:ms + 12]
        if handler == b"vide":
            return matrix
    return None


def _read_moov(f) -> Optional[bytes]:
    """The payload of the file's one ``moov`` box (top-level boxes walked by their sizes), None
    without one, with two, or one over `MAX_MOOV_BYTES`."""
    f.seek(0, io.SEEK_END)
    end = f.tell()
    p, found = 0, None
    while p + 8 <= end:
        f.seek(p)
        head = f.read(16)
        size, kind = struct.unpack(">I4s", head[:8])
        hlen = 8
        if size == 1 and len(head) == 16:
            size, hlen = struct.unpack(">Q", head[8:16])[0], 16
        elif size == 0:
            size = end - p
        if size < hlen:
            return None
        if kind == b"moov":
            if found is not None or size - hlen > MAX_MOOV_BYTES:
                return None
            f.seek(p + hlen)
            found = f.read(size - hlen)
        p += size
    return found


def mp4_rotation_degrees(src) -> Optional[float]:
    """Degrees counter-clockwise of the first video track's display matrix, as FFmpeg computes
    them (``av_display_rotation_get``; PyAV's ``frame.rotation``, before its cast to int), 0.0 for
    the identity; None when the header does not answer plainly (module doc). ``src``: a path or
    a seekable binary file (its position is kept)."""
    own = not hasattr(src, "read")
    f = open(src, "rb") if own else src
    pos = None if own else f.tell()
    try:
        moov = _read_moov(f)
    except (OSError, struct.error, ValueError):
        return None
    finally:
        if own:
            f.close()
        else:
            f.seek(pos)
    m = _first_video_matrix(moov) if moov is not None else None
    if m is None:
        return None
    if m == _IDENTITY:
        return 0.0
    a, b, c, d = (x / 65536 for x in (m[0], m[1], m[3], m[4]))
    pure = m[2] == m[5] == m[6] == m[7] == 0 and m[8] == 0x40000000
    # a rotation: [[cos, sin], [-sin, cos]] up to rounding of the 16.16 values (det +1, unit columns)
    if not pure or abs(a * d - b * c - 1) > 1e-3 or abs(math.hypot(a, c) - 1) > 1e-3 or abs(math.hypot(b, d) - 1) > 1e-3:
        return None
    # av_display_rotation_get: -atan2(matrix[1] / scale1, matrix[0] / scale0), scales the column norms
    return -math.degrees(math.atan2(b / math.hypot(b, d), a / math.hypot(a, c)))
