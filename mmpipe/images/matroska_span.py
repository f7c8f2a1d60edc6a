"""Declared against held seconds of a Matroska / WebM container: a file cut short (an interrupted
download or copy) keeps the duration its header declares while its data ends early, and FFmpeg
(torchcodec too, the chat path's decoder) decodes up to the cut without a word. Its header has
no frame or sample count to check instead. Other formats are not checked here: their durations
may be estimates (from the bit rate of a raw stream, from the packets themselves in MPEG-TS).

Both media routes ask it, each with what it reads and its own error: video frames
(`mmpipe.images.video_container`: the packets' end, a `VideoError`) and a sound track
(`mmpipe.audio.video`: the decoded sound's end, an `AudioError`).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["matroska_shortfall"]

AV_TIME_BASE = 1_000_000  # FFmpeg's container clock: ticks per second


def matroska_shortfall(container: Any, end: float, slack: float) -> Optional[tuple[float, float]]:
    """``(declared, held)`` seconds where PyAV ``container`` is Matroska / WebM with a declared
    duration and its data, ending at ``end`` seconds (the last packet's or decoded frame's end, on
    the stream clock), holds less than that by more than ``slack`` seconds; else None."""
    if not container.duration or not container.format.name.startswith("matroska"):
        return None
    declared = container.duration / AV_TIME_BASE
    held = end - max(0.0, (container.start_time or 0) / AV_TIME_BASE)
    return (declared, held) if held < declared - slack else None
