"""Video files through PyAV (imported lazily, the ``video`` extra): resolving a row's video value to
what ``av.open`` takes (`av_source`), the opened container with its first video stream, frame rate,
size and frame count (`Container`), the codec checks, and one decoding pass over sampled frames
(`decode_sampled`). Every failure is a `mmpipe.errors.VideoError` naming where and the fix.
`mmpipe.images.video` builds the patch grids on top of it.

Frames come out upright: a stream's display matrix (phone videos recorded portrait store landscape
frames and "rotate 90") is applied in quarter turns (`Container.rotation`), as FFmpeg's CLI, players
and torchcodec >= 0.11 do (torchcodec is what transformers' processors and qwen-vl-utils decode
with); PyAV and transformers' ``pyav`` backend return the coded frames. PyAV shows the matrix on
decoded frames only: an MP4 / MOV header's is read from its boxes (`mmpipe.images.mp4_rotation`),
another container's first frame is decoded to read it (and kept for `Container.frames`)."""

from __future__ import annotations

import io
import math
import os
from typing import Any, Iterator, Optional

import numpy as np

from mmpipe.errors import VideoError
from mmpipe.images.matroska_span import matroska_shortfall
from mmpipe.images.mp4_rotation import mp4_rotation_degrees

__all__ = ["Container", "av_source", "check_codec", "decode_sampled", "import_av", "rgb_frame"]


def import_av():
    try:
        import av  # noqa: PLC0415 - optional, lazily
    except ImportError:
        raise ImportError("decoding videos needs PyAV: pip install av") from None
    return av


def av_source(value: Any, where: str):
    """A video value (path, bytes, ``{"path", "bytes"}``) -> a path or binary file for ``av.open``."""
    if isinstance(value, dict):
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(value))
    if isinstance(value, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(value))
        path = path[len("file://"):] if path.startswith("file://") else path
        if path.startswith(("http://", "https://")):
            raise VideoError(f"{path[:80]!r} is a URL; mmpipe does not fetch videos", where=where,
                             expected="a local path or encoded bytes", found="a URL", fix="download the video first")
        if not os.path.isfile(path):
            found = "a missing path" if not os.path.exists(path) else "not a regular file"
            raise VideoError(f"video path {path!r} is {found}", where=where, expected="a regular video file",
                             found=found, fix="fix the path, or drop the row (on_error='skip')")
        return path
    raise VideoError(f"cannot read a video from {type(value).__name__}", where=where,
                     expected="a path, bytes, a {'path', 'bytes'} dict or a list of frames",
                     found=type(value).__name__, fix="pass the video file or its frames")


# demuxers that open other files named inside the one given (HLS playlists, concat lists): a row's
# video would read media from anywhere on the machine, past an encoder's image_root
PLAYLIST_FORMATS = frozenset({"hls", "applehttp", "concat", "dash"})
_PLAYLIST_MAGIC = (b"#EXTM3U", b"ffconcat")


def _head(src, n: int = 16) -> bytes:
    """The first ``n`` bytes of ``av_source``'s result (a path or a BytesIO, left at its start)."""
    if isinstance(src, io.BytesIO):  # read + seek: getbuffer() would copy a BytesIO sharing its bytes
        head = src.read(n)
        src.seek(0)
        return head
    with open(src, "rb") as f:
        return f.read(n)


def _size(src) -> int:
    """The byte size of ``av_source``'s result (a path, or a BytesIO left at its start; seek, not
    getbuffer(), which would copy a BytesIO sharing its bytes); 0 where unknown."""
    if isinstance(src, io.BytesIO):
        size = src.seek(0, io.SEEK_END)
        src.seek(0)
        return size
    try:
        return os.path.getsize(src)
    except OSError:
        return 0


def _refuse_playlist(head: bytes, where: str) -> None:
    if head.lstrip(b"\xef\xbb\xbf").startswith(_PLAYLIST_MAGIC):
        raise VideoError("the file is a playlist (HLS .m3u8 or an ffconcat list), not a video", where=where,
                         expected="a video file", found=f"a file starting {head[:8]!r}",
                         fix="give the media file itself (mmpipe does not follow playlists to other files)")


class Container:
    """An open container's first video stream and its metadata (frame count, fps, size)."""

    def __init__(self, value: Any, where: str):
        av = import_av()
        self.where = where
        try:
            src = av_source(value, where)
            _refuse_playlist(_head(src), where)
            self._src = src  # read again for the header's display rotation (`_header_rotation`)
            self._size = _size(src)
            self.c = av.open(src, mode="r", metadata_errors="ignore")
        except VideoError:
            raise
        except (av.FFmpegError, OSError, ValueError, UnicodeDecodeError) as e:
            raise self.error("the video container cannot be opened", "a readable video file", e) from None
        if self.c.format.name in PLAYLIST_FORMATS:  # found by content past the check above
            self.c.close()
            _refuse_playlist(b"#EXTM3U", where)
        if not self.c.streams.video:
            self.c.close()
            raise VideoError("the file has no video stream", where=where, expected="a video stream",
                             found="no video stream", fix="check that the file is a video")
        self.s = self.c.streams.video[0]
        rate = self.s.average_rate or self.s.guessed_rate or self.s.base_rate
        self.fps = float(rate) if rate else 0.0
        cc = self.s.codec_context  # None: FFmpeg knows no codec for the stream
        self.height, self.width = (cc.height, cc.width) if cc is not None else (0, 0)  # coded, not upright
        if cc is not None:
            self.s.thread_type = "AUTO"
        self._decoder = None  # the one decoding pass (`_next_frame`), started on first use
        self._peeked: list = []  # the first frame, decoded by `rotation` and not yet given out
        self._rotation = None

    def error(self, what: str, expected: str, e: Exception) -> VideoError:
        return VideoError(what, where=self.where, expected=expected, found=f"{type(e).__name__}: {e}"[:200],
                          fix="re-encode the video (e.g. ffmpeg -c:v libx264) or drop the row (on_error='skip')")

    def _header_short(self, n: int) -> bool:
        """Whether a header count of ``n`` frames covers less time than the stream lasts by more
        than a frame and a half: a fragmented MP4 (``movflags=frag_keyframe``) counts only the
        samples in its moov (its first fragment), not those in the moof fragments after it. The
        stream's duration, else the container's (which may be a longer audio track's: then the
        packets are counted for nothing, never wrongly)."""
        spans = []
        if self.s.duration and self.s.time_base:
            spans.append(float(self.s.duration * self.s.time_base))
        if self.c.duration:
            spans.append(self.c.duration / 1_000_000)  # AV_TIME_BASE
        return bool(spans) and self.fps > 0 and n / self.fps < max(spans) - 1.5 / self.fps

    def total_frames(self) -> int:
        """The stream's frame count: its header, else (no count, or one that covers less than the
        stream's duration, `_header_short`) one pass over the packets (no decoding). Decoders that
        scan (torchcodec's exact mode, what transformers' processors and qwen-vl-utils use) count
        every frame, so a header's partial count would sample the clip's first fragment only."""
        n = int(self.s.frames or 0)
        self._check_header_count(n)
        if n <= 0 or self._header_short(n):
            n, end = self._count_packets()
            self._check_declared_span(n, end)
        if n <= 0 or self.fps <= 0:
            raise VideoError("the video has no frames", where=self.where, expected="at least one frame",
                             found=f"{n} frames at {self.fps:g} fps", fix="drop the row or replace the video")
        return n

    def _check_header_count(self, n: int) -> None:
        """A `VideoError` where the header counts more frames than the file has bytes (each coded
        frame takes at least one): a damaged or forged header (an AVI claiming 2**31 frames) gave a
        layout of 768 frames spread over days of a clip that holds 20, and the decode allocated
        16 GiB for its frame table before reading a frame."""
        size = self._size
        if size and n > size:
            raise VideoError("the video header counts more frames than the file could hold", where=self.where,
                             expected=f"at most {size} frames (one byte each, the file's size)",
                             found=f"{n} frames in the header", fix="re-encode or remux the video (e.g. ffmpeg "
                             "-i in -c copy out.mkv rewrites the header), or drop the row (on_error='skip')")

    def _count_packets(self) -> tuple[int, float]:
        """(the video stream's packets, the end in seconds of the last packet of any stream): one
        pass over every stream's packets (no decoding), the file left at its start."""
        av = import_av()
        n, end = 0, 0.0
        try:
            for pk in self.c.demux():
                if pk.stream.index == self.s.index and pk.size:
                    n += 1
                if pk.pts is not None and pk.time_base:
                    end = max(end, float((pk.pts + (pk.duration or 0)) * pk.time_base))
            self.c.seek(0, stream=self.s) if n else None
        except (av.FFmpegError, OSError) as e:
            raise self.error("the video stream cannot be read", "a readable video stream", e) from None
        return n, end

    def _check_declared_span(self, n: int, end: float) -> None:
        """A `VideoError` where a Matroska / WebM header declares more time than the packets hold
        (by over 1.5 frames and a quarter second): the file was cut short (an interrupted download
        or copy). Its header has no frame count, so the packets are counted, and a cut file would
        be sampled from its first part silently (a 10 s clip cut at 30 %: 3 s of frames, spread
        over the grid as if they were the whole clip). The rule: `matroska_shortfall`."""
        short = matroska_shortfall(self.c, end, max(1.5 / self.fps if self.fps > 0 else 0.0, 0.25)) if n else None
        if short is not None:
            declared, held = short
            raise VideoError("the video file is truncated: its header declares more time than its packets hold",
                             where=self.where, expected=f"{declared:.2f} s (the Matroska / WebM header's duration)",
                             found=f"{held:.2f} s of packets ({n} video frames)",
                             fix="re-download or re-encode the video (e.g. ffmpeg -c:v libx264), or drop the row "
                                 "(on_error='skip')")

    def _next_frame(self):
        """The next decoded frame of the stream's one decoding pass, None at its end."""
        av = import_av()
        try:
            if self._decoder is None:
                self._decoder = self.c.decode(self.s)
            return next(self._decoder, None)
        except (av.FFmpegError, OSError, ValueError) as e:
            raise self.error("the video stream cannot be decoded", "a decodable video stream", e) from None

    def frames(self) -> Iterator:
        """Decoded frames in order (PyAV frames, one at a time; `rgb_frame` gives the upright
        uint8 [H, W, 3] RGB: only sampled frames are converted)."""
        self.rotation()  # reads (and keeps) the first frame now, never from inside this pass
        while self._peeked:
            yield self._peeked.pop()
        while (frame := self._next_frame()) is not None:
            yield frame

    def rotation(self) -> int:
        """Quarter turns counter-clockwise (0..3) that make the frames upright: the display
        matrix's rotation (PyAV's ``frame.rotation``, degrees counter-clockwise) rounded to a
        multiple of 90 degrees as torchcodec rounds it; flips are not applied. Read from an MP4 /
        MOV header where it answers plainly (`mmpipe.images.mp4_rotation`), else from the first
        frame, which is decoded once and kept for `frames`."""
        if self._rotation is None:
            degrees = self._header_rotation()
            if degrees is None:
                first = self._next_frame()
                self._peeked = [first] if first is not None else []
                degrees = getattr(first, "rotation", 0) or 0
            self._rotation = int(round(float(degrees) / 90)) % 4
        return self._rotation

    def _header_rotation(self) -> Optional[int]:
        """An MP4 / MOV file's display rotation from its header (`mp4_rotation_degrees`, cast to
        int as PyAV's ``frame.rotation`` casts it), None where the first frame must tell."""
        if not self.c.format.name.startswith("mov,mp4") or self._src is None:
            return None
        degrees = mp4_rotation_degrees(self._src)
        return None if degrees is None or math.isnan(degrees) else int(degrees)

    def may_be_cut(self) -> bool:
        """Whether an MP4 / MOV file may be cut short (an interrupted download or copy): a
        top-level box runs past the file's end, or no ``mdat`` box holds the samples (a file cut
        right after its ``moov``). Its ``moov`` can still be whole (it comes first in a
        ``faststart`` file): then PyAV opens it and counts every frame, and only decoding finds
        the samples missing. Read from the box headers (16 bytes each); False for other formats
        (a Matroska / WebM one is checked by its duration, `_check_declared_span`)."""
        if not self.c.format.name.startswith("mov,mp4") or self._src is None:
            return False
        return _mp4_boxes_cut(self._src)

    def refuse_if_cut(self, idx: np.ndarray, total: int) -> None:
        """The layout-only route's check (`mmpipe.images.video.video_layout`): where the file may
        be cut (`may_be_cut`), the sampled frames ``idx`` are decoded as `decode_sampled` decodes
        them on the pixel route, so a cut file raises the same `VideoError` here (a length
        filter) as in training; a whole file is not decoded."""
        if self.may_be_cut():
            decode_sampled(self, np.asarray(idx), total, lambda frame: None)

    def upright_size(self) -> tuple[int, int]:
        """(height, width) of the upright frames: the coded size, swapped for a quarter turn."""
        return (self.width, self.height) if self.rotation() % 2 else (self.height, self.width)

    def close(self) -> None:
        self.c.close()


def _mp4_boxes_cut(src) -> bool:
    """`Container.may_be_cut` of an MP4 / MOV ``src`` (a path, or a binary file whose position
    is kept): its top-level boxes walked by their sizes."""
    own = not hasattr(src, "read")
    f = open(src, "rb") if own else src
    pos = None if own else f.tell()
    try:
        end = f.seek(0, io.SEEK_END)
        p, mdat = 0, False
        while p + 8 <= end:
            f.seek(p)
            head = f.read(16)
            size, kind = int.from_bytes(head[:4], "big"), head[4:8]
            hlen = 8
            if size == 1:
                size, hlen = (int.from_bytes(head[8:16], "big"), 16) if len(head) == 16 else (0, 16)
            elif size == 0:  # the last box, to the file's end
                size = end - p
            if size < hlen or p + size > end:
                return True
            mdat = mdat or kind == b"mdat"
            p += size
        return not mdat
    except OSError:
        return True
    finally:
        f.close() if own else f.seek(pos)


def rgb_frame(c: Container, frame) -> np.ndarray:
    """One decoded frame -> uint8 [H, W, 3] RGB, upright (`Container.rotation` applied)."""
    av = import_av()
    try:
        rgb = frame.to_ndarray(format="rgb24")
    except (av.FFmpegError, ValueError) as e:
        raise c.error("a video frame cannot be converted to RGB", "a decodable video stream", e) from None
    k = c.rotation()
    # np.rot90 turns counter-clockwise from axis 0 to axis 1 (rows to columns), as the display
    # matrix asks; contiguous for the torch resize (a rotated view has negative strides)
    return np.ascontiguousarray(np.rot90(rgb, k)) if k else rgb


def check_codec(c: Container) -> None:
    av = import_av()
    cc = c.s.codec_context
    tag = getattr(cc, "name", None) or getattr(c.s, "codec_tag", None) or "unknown"
    problem = None if cc is not None else f"FFmpeg knows no codec for the stream (tag {tag!r})"
    if problem is None:
        try:
            av.codec.Codec(cc.name, "r")
        except (av.FFmpegError, ValueError) as e:
            problem = f"{type(e).__name__}: {e}"[:200]
    if problem is not None:
        c.close()
        raise VideoError(f"no decoder for the video codec {tag!r}", where=c.where, expected="a codec PyAV decodes",
                         found=problem, fix="re-encode the video (e.g. ffmpeg -c:v libx264) or drop the row")
    if not c.height or not c.width:
        c.close()
        raise VideoError("the video stream has no frame size", where=c.where, expected="frames of at least 1x1",
                         found=f"{c.height}x{c.width}", fix="re-encode the video or drop the row")


def _check_frame_size(c: Container, frame, i: int) -> None:
    """A `VideoError` where decoded frame ``i`` is not the stream's size (the grid's): a stream
    whose frames change size mid-stream (joined clips, an adaptive-bitrate capture) would be
    resized to the first size's grid, silently stretched; a frame list of mixed sizes is refused
    alike (`mmpipe.images.video`)."""
    if (frame.height, frame.width) != (c.height, c.width):
        raise VideoError("the video's frames change size mid-stream", where=c.where,
                         expected=f"every frame {c.height}x{c.width} (height x width: the stream's size, the grid's)",
                         found=f"frame {i} is {frame.height}x{frame.width}",
                         fix="re-encode the video at one size (e.g. ffmpeg -vf scale=W:H -c:v libx264), or drop "
                             "the row (on_error='skip')")


def decode_sampled(c: Container, idx: np.ndarray, total: int, convert) -> list[np.ndarray]:
    """The frames at ``idx`` (sampled indices into the ``total`` frames; repeats kept), each uint8 RGB
    [H, W, 3] passed through ``convert``, decoded in one pass that stops after the last one; a
    `VideoError` when the stream ends before it (the header promised more frames than it holds)."""
    uniq, counts = np.unique(idx, return_counts=True)  # how often each source frame is used (a table of
    want = dict(zip(uniq.tolist(), counts.tolist()))  # `total` entries is 16 GiB for a header of 2**31 frames)
    out: list[np.ndarray] = []
    last = int(idx[-1])
    for i, frame in enumerate(c.frames()):
        _check_frame_size(c, frame, i)
        if i < total and want.get(i):
            out.extend([convert(rgb_frame(c, frame))] * want[i])
        if i >= last:
            break
    if len(out) < len(idx):
        raise VideoError("the video stream ends early", where=c.where,
                         expected=f"{total} frames (the header's count, else its packets')",
                         found=f"{len(out)} of {len(idx)} sampled frames decoded", fix="re-encode the video")
    return out
