"""Encode, step 1 (part): a raw row's image and video columns, and the queues their
placeholders take values from (`mmpipe.encoding.parse` uses them).

A ``{"type": "image"}`` / ``{"type": "video"}`` item (or an ``<image>`` / ``<video>`` marker in
prompt text) takes the next value of the row's images / videos column, in order of appearance;
every value must be taken exactly once. A video item may carry its value inline (``"video"``,
``"video_url"`` (str or ``{"url"}``) or ``"path"``) and per-video options with qwen-vl-utils'
names (``fps``, ``nframes``, ``min_frames``, ``max_frames``, ``min_pixels``, ``max_pixels``,
``total_pixels``; ``sample_fps``: the rate of a frame list): such an item yields
``{"video": value, **options}`` (`mmpipe.encoding.videos` reads it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpipe.errors import ImageError, ParseError, PlaceholderError, VideoError
from mmpipe.records.columns import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

__all__ = ["VIDEO_ITEM_OPTIONS", "SINGULAR_COLUMNS", "UnreadableImages", "MediaQueue", "column_values", "media_column",
           "is_video_item", "inline_video",
           "is_audio_item", "inline_audio"]

# per-video options a video item may carry (qwen-vl-utils' names); `sample_fps`: a frame list's rate;
# `video_start` / `video_end`: the clip in seconds; `resized_height` / `resized_width` are carried so
# that mmpipe.encoding.videos refuses them (a VideoError) instead of their being dropped here unseen
VIDEO_ITEM_OPTIONS = ("fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels",
                      "sample_fps", "video_start", "video_end", "resized_height", "resized_width")
# LLaVA-Instruct, ShareGPT4V and LLaVA-OneVision rows name their image ``image`` (one value, or a
# list), LLaVA-Video's its video ``video``: read where the row has no images / videos of its own
SINGULAR_COLUMNS = {"images": "image", "videos": "video"}
_MARKERS = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER, "audio": AUDIO_PLACEHOLDER}


def is_video_item(item: dict) -> bool:
    """Whether a content item stands for a video (``{"type": "video" | "video_url", ...}``, or an
    untyped item holding a ``video`` value)."""
    t = item.get("type")
    return t in ("video", "video_url") or (t is None and item.get("video") is not None)


def inline_video(item: dict) -> Any:
    """The video a video item carries itself (with its per-video options: ``{"video": value,
    **options}``), or None for a bare placeholder."""
    value = item.get("video")
    if value is None:
        url = item.get("video_url")
        value = url.get("url") if isinstance(url, dict) else url
    value = value if value is not None else item.get("path")
    if value is None:
        return None
    options = {k: item[k] for k in VIDEO_ITEM_OPTIONS if item.get(k) is not None}
    return {"video": value, **options} if options else value


def is_audio_item(item: dict) -> bool:
    """Whether a content item stands for an audio clip (``{"type": "audio" | "audio_url" |
    "input_audio", ...}``, or an untyped item holding an ``audio`` value)."""
    t = item.get("type")
    return t in ("audio", "audio_url", "input_audio") or (t is None and item.get("audio") is not None)


def inline_audio(item: dict) -> Any:
    """The clip an audio item carries itself (``audio``, ``audio_url`` (str or ``{"url"}``),
    OpenAI's ``input_audio`` ``{"data": base64, "format"}`` as its bytes, ``path`` or ``url`` (as the
    chat path reads an audio item), or None for a bare placeholder. Data that is not base64: `AudioError`."""
    import base64
    import binascii

    value = item.get("audio")
    if value is None and item.get("audio_url") is not None:
        url = item["audio_url"]
        value = url.get("url") if isinstance(url, dict) else url
    if value is None and isinstance(item.get("input_audio"), dict) and item["input_audio"].get("data"):
        try:
            value = base64.b64decode(item["input_audio"]["data"])  # lenient: line-wrapped base64 too
        except (binascii.Error, ValueError, TypeError) as e:
            from mmpipe.errors import AudioError

            raise AudioError("an input_audio item whose data is not base64", column="audios",
                             expected="{'data': base64 of the audio file, 'format': 'wav' | 'mp3' | ...}",
                             found=f"{type(e).__name__}: {e}"[:120],
                             fix="encode the file's bytes with base64.b64encode(...).decode()") from None
    if value is None:
        value = item.get("path")
    return value if value is not None else item.get("url")


class UnreadableImages:
    """A row's ``column`` that ``datasets`` failed to decode lazily (a corrupt ``datasets.Image()``
    file, or a ``datasets.Video()`` column without torchcodec): its stored value (``{"bytes",
    "path"}`` dicts; None: unknown) and the exception."""

    def __init__(self, example, column: str, exc: Exception):
        table = getattr(example, "pa_table", None)  # a one-row datasets row object holds the stored value
        ok = table is not None and column in table.column_names and table.num_rows == 1
        self.stored, self.exc = table.column(column)[0].as_py() if ok else None, exc

    def error(self, where: str, column: str) -> ImageError:
        """The `ImageError` naming the row, the column and the bad image (decoding them one by one)."""
        from mmpipe.images.load import load_image

        bad, why = None, f"{type(self.exc).__name__}: {self.exc}"
        stored = self.stored if isinstance(self.stored, (list, tuple)) else [self.stored]
        for j, value in enumerate(stored if self.stored is not None else ()):
            try:
                load_image(value, where=f"image {j}").load()
            except Exception as e:  # noqa: BLE001 - the first image that does not decode is the bad one
                bad, why = j, f"{type(e).__name__}: {e}"
                break
        return ImageError(f"datasets could not decode {'an image' if bad is None else f'image {bad}'} of column "
                          f"{column!r} ({why:.200})", where=where, column=column, image=bad,
                          expected="decodable images", found="a corrupt or unreadable image",
                          fix="read the column undecoded so mmpipe decodes (and names) each image: "
                              "ds = mmpipe.encoding.undecoded_images(ds), or use mmpipe.encode_dataset; "
                              "skip such rows with on_error='skip'")

    def video_error(self, where: str, column: str) -> VideoError:
        """The `VideoError` of a ``datasets.Video()`` column ``datasets`` could not decode."""
        return VideoError(f"datasets could not decode column {column!r} ({type(self.exc).__name__}: {self.exc})"[:300],
                          where=where, column=column, expected="undecoded videos ({'path', 'bytes'} dicts)",
                          found="a datasets.Video() column that decodes (with torchcodec)",
                          fix="read the column undecoded (mmpipe decodes it with PyAV): "
                              "ds = mmpipe.encoding.undecoded_images(ds), ds.cast_column(column, "
                              "datasets.List(datasets.Video(decode=False))), or use mmpipe.encode_dataset")


def _is_list(values) -> bool:
    return isinstance(values, (list, tuple)) or (isinstance(values, np.ndarray) and values.dtype == object
                                                 and values.ndim == 1)


def media_column(example: dict, column: str) -> str:
    """The column a row's images (``column="images"``) or videos (``"videos"``) come from:
    ``column`` itself, or its singular LLaVA name (`SINGULAR_COLUMNS`: ``image`` / ``video``)
    when the row holds a value there and none (absent, None or empty) under ``column``. Other
    column names are taken as given."""
    one = SINGULAR_COLUMNS.get(column)
    if one is None:
        return column
    try:
        plural = example.get(column)
        if plural is not None and len(plural):
            return column
    except Exception:  # noqa: BLE001 - a value datasets cannot decode: column_values names it
        return column
    try:
        return one if example.get(one) is not None else column
    except Exception:  # noqa: BLE001
        return one


def column_values(example: dict, column: str, where: str, kind: str = "image") -> list:
    """The row's images (``kind="image"``) or videos column as a list ([] when absent); a
    singular LLaVA column (``image`` / ``video``, `media_column`) may hold one value."""
    try:
        values = example.get(column)
    except Exception as e:  # noqa: BLE001 - datasets decodes Image() / Video() values lazily, on this read
        values = UnreadableImages(example, column, e)
    if column in SINGULAR_COLUMNS.values() and values is not None and not _is_list(values) \
            and not isinstance(values, UnreadableImages):
        values = [values]
    if isinstance(values, UnreadableImages):
        if kind == "audio":
            from mmpipe.errors import AudioError

            raise AudioError(f"datasets could not decode column {column!r} ({type(values.exc).__name__}: "
                             f"{values.exc})"[:300], where=where, column=column, expected="undecoded audio",
                             found="a datasets.Audio() column that does not decode",
                             fix=f"read the column undecoded (mmpipe decodes it): ds.cast_column({column!r}, "
                                 "datasets.List(datasets.Audio(decode=False)))")
        raise values.error(where, column) if kind == "image" else values.video_error(where, column)
    if kind == "image" and isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim == 4:
        values = list(values)  # datasets' numpy format stacks a row's same-size images: [n, H, W, C] uint8
    if values is not None and not _is_list(values):
        # one bare value (or a string) instead of a list: iterating it would crash or split it (found by fuzzing)
        raise ParseError(f"column {column!r} must hold a list of {kind}s", where=where, column=column,
                         expected=f"a list (datasets.Sequence(datasets.{kind.title()}()))", found=type(values).__name__,
                         fix=f"wrap it: {{{column!r}: [{kind}]}}")
    return list(values) if values is not None else []


class MediaQueue:
    """An images or videos column, consumed in order by the placeholders of the messages."""

    def __init__(self, values: list, column: str, where: str, kind: str = "image"):
        self.images, self.column, self.where, self.kind, self.used = values, column, where, kind, 0

    def take(self) -> Any:
        if self.used >= len(self.images):
            raise PlaceholderError(
                f"the messages hold more {self.kind} placeholders than the "
                f"{len(self.images)} {self.kind}(s) of column {self.column!r}", where=self.where,
                column=self.column, expected=f"{len(self.images)} {self.kind} placeholder(s), one per {self.kind}",
                found=f"more than {len(self.images)}", fix=f"give one {self.kind} per placeholder",
            )
        self.used += 1
        return self.images[self.used - 1]

    def check_all_used(self) -> None:
        if self.used != len(self.images):
            raise PlaceholderError(
                f"column {self.column!r} holds {len(self.images)} {self.kind}(s) but the messages hold "
                f"{self.used} placeholder(s) for them", where=self.where, column=self.column,
                expected=f"{len(self.images)} {self.kind} placeholder(s), one per {self.kind}",
                found=f"{self.used} placeholder(s)",
                fix=f"every {self.kind} needs exactly one placeholder ({{'type': '{self.kind}'}} in a content list, "
                    f"or {_MARKERS[self.kind]} in prompt text)",
            )
