"""How many frames an uncompressed audio file's header declares: WAV, RF64, Sony Wave64, AIFF / AIFC
and Sun AU (``.au`` / ``.snd``).

libsndfile reads a file cut short (an interrupted download or copy) up to where it ends and says
nothing: its ``frames`` is clamped to what is there, and so is the chat path's ``load_audio``. The
header still holds the full size, so `declared_frames` lets `mmpipe.audio.load_audio` refuse such a
file instead of training the row on part of its clip. Compressed layouts (ADPCM, GSM, IMA4...)
and streamed files (a size of 0 or 0xFFFFFFFF: readers size them from the file) give None.
"""

from __future__ import annotations

import io

__all__ = ["declared_frames"]

_PCM_TAGS = (1, 3, 0xFFFE)  # PCM, IEEE float, extensible: a frame is block_align bytes
_AIFC_PLAIN = (b"NONE", b"sowt", b"twos", b"raw ", b"fl32", b"FL32", b"fl64", b"FL64", b"in24", b"in32",
               b"ulaw", b"alaw", b"ULAW", b"ALAW")  # one sample frame is numSampleFrames' unit
_AU_BYTES = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4, 6: 4, 7: 8, 27: 1}  # encoding -> bytes a sample
_UNKNOWN = (0, 0xFFFFFFFF)


def declared_frames(source) -> tuple[int, str] | None:
    """``source`` (a path or the file's bytes) -> (frames its header declares, the container's name),
    or None: another format, a compressed layout, a streamed size, or a header that does not parse."""
    f = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray)) else open(source, "rb")
    with f:
        head = f.read(40)
        if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
            return _riff(f, 12, head[:4] == b"RF64")
        if head[:4] == b"riff" and head[24:28] == b"wave":
            return _wave64(f)
        if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            return _aiff(f, head[8:12] == b"AIFC")
        if head[:4] == b".snd" and len(head) >= 24:
            return _au(head)
    return None


def _block(fmt: bytes) -> int:
    """A WAV ``fmt `` chunk's body -> bytes a frame (0: a compressed or unparsed layout)."""
    tag = int.from_bytes(fmt[:2], "little") if len(fmt) >= 16 else 0
    return int.from_bytes(fmt[12:14], "little") if tag in _PCM_TAGS else 0


def _chunks(f, pos: int, order: str):
    """A RIFF / IFF file's chunks from ``pos`` -> (4-byte id, body size), ``f`` left at the body; sizes in
    byte ``order`` ("little": RIFF, "big": IFF), bodies padded to an even size."""
    while True:
        f.seek(pos)
        chunk = f.read(8)
        if len(chunk) < 8:
            return
        size = int.from_bytes(chunk[4:], order)
        yield chunk[:4], size
        pos += 8 + size + (size & 1)


def _riff(f, pos: int, rf64: bool) -> tuple[int, str] | None:
    """WAV / RF64 chunks from ``pos``: the ``data`` chunk's size (RF64: its ``ds64`` chunk's) // a frame."""
    block, big = 0, None
    for name, size in _chunks(f, pos, "little"):
        if name == b"fmt ":
            block = _block(f.read(16))
        elif name == b"ds64":  # RF64: riff size, data size, sample count (64-bit each)
            body = f.read(16)
            big = int.from_bytes(body[8:16], "little") if len(body) == 16 else None
        elif name == b"data":
            if rf64 and size == 0xFFFFFFFF:
                size = big or 0
            return (size // block, "RF64" if rf64 else "WAV") if block and size not in _UNKNOWN else None
    return None


def _wave64(f) -> tuple[int, str] | None:
    """Sony Wave64: 16-byte GUID chunk ids, 64-bit sizes that count the 24-byte chunk header, 8-byte aligned."""
    block, pos = 0, 40
    while True:
        f.seek(pos)
        chunk = f.read(24)
        if len(chunk) < 24:
            return None
        size = int.from_bytes(chunk[16:24], "little")
        if size < 24:
            return None
        if chunk[:4] == b"fmt ":
            block = _block(f.read(16))
        elif chunk[:4] == b"data":
            return ((size - 24) // block, "Wave64") if block else None
        pos += size + (-size % 8)


def _aiff(f, aifc: bool) -> tuple[int, str] | None:
    """AIFF / AIFC: the ``COMM`` chunk's numSampleFrames (big-endian), for uncompressed sound."""
    for name, _ in _chunks(f, 12, "big"):
        if name == b"COMM":
            body = f.read(22)
            if len(body) < 18 or (aifc and body[18:22] not in _AIFC_PLAIN):
                return None
            frames = int.from_bytes(body[2:6], "big")
            return (frames, "AIFF") if frames else None
    return None


def _au(head: bytes) -> tuple[int, str] | None:
    """Sun AU: data size, encoding and channels from its 24-byte big-endian header."""
    size, encoding, _, channels = (int.from_bytes(head[i:i + 4], "big") for i in range(8, 24, 4))
    width = _AU_BYTES.get(encoding, 0)
    if not width or not channels or size in _UNKNOWN:
        return None
    return size // (width * channels), "AU"
