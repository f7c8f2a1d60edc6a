"""``mmpipe encode``'s image references -> ``datasets.Image(decode=False)`` values, before encoding.

Every image of a file input (``.jsonl`` / ``.json`` / ``.parquet``), in the images column or
inline in content items, is resolved here (`resolve_images`): a relative path against the input
file's directory (not the working directory), ``file://`` paths, ``data:image/...;base64`` URIs,
``{"bytes", "path"}`` dicts. Inline items become ``{"type": "image"}`` placeholders and their
images move, in order, into the images column. A missing file, a non-file (FIFO, device, ...)
or a path outside ``--image-root`` is reported with its row before any pixel is decoded. The
files of inline audio and video items, and of the videos / audios columns (`resolve_media_paths`),
are made absolute against the same directory (`media_path`); the encoder loads and checks them.

Under ``--on-error skip`` (``strict=False``) such a row is left to the encoder, which fails it
and records it; the resolver keeps its own reason (which says where a relative path was looked
up) in `RESOLVE_ERRORS`, and `explain_failures` puts that reason into the encode report in
place of the encoder's (which can only name the absolute path it was given).
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any, Optional

from mmpipe.errors import ImageError

__all__ = ["RESOLVE_ERRORS", "ImageResolver", "resolve_images", "resolve_media_paths", "resolver_errors",
           "explain_failures"]

# per row: JSON list of the references that did not resolve ({"image", "path", "reason"}), or ""
RESOLVE_ERRORS = "mmpipe_resolve_errors"
_NOT_A_LIST = "<images value is not a list>"  # RESOLVE_ERRORS "path" of a row whose images value is one string


def _resolve_one(value: Any, base: Path, loc: dict, root: Optional[str] = None) -> Optional[dict]:
    """One image reference -> a ``datasets.Image`` storage dict ``{"bytes", "path"}``.

    ``loc``: where it is (``{"row", "image", "column"}``); ``root``: ``--image-root``."""
    if value is None:
        return None
    if isinstance(value, dict):
        b, p = value.get("bytes"), value.get("path")
        if b is None:
            if not p:
                raise ImageError("image dict has neither 'bytes' nor 'path'", **loc, found=repr(value)[:80],
                                 fix="give the image's encoded bytes or its file path")
            return {"bytes": None, "path": _local_path(str(p), base, loc, root)}
        return {"bytes": bytes(b), "path": p}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": bytes(value), "path": None}
    if isinstance(value, str):
        if value.startswith("data:"):
            return {"bytes": _data_uri_bytes(value, loc), "path": None}
        return {"bytes": None, "path": _local_path(value, base, loc, root)}
    raise ImageError(f"unsupported image value of type {type(value).__name__}", **loc,
                     expected="a path, a data:image/...;base64 URI or a {'bytes', 'path'} dict",
                     found=type(value).__name__)


def _data_uri_bytes(value: str, loc: dict) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URI, decoded strictly: whitespace (line-wrapped
    base64, as ``base64.encodebytes`` writes and transformers' ``load_image`` reads) is dropped,
    anything else outside the base64 alphabet or wrong padding is an ImageError (a lenient decoder
    drops such characters and hands the encoder other bytes). Not checked here: that the bytes are an
    image (the encoder's ImageError names the row)."""
    header, sep, data = value.partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise ImageError(f"data URI {value[:40]!r}... is not base64 encoded", **loc,
                         expected="data:image/png;base64,<base64 data>", found=f"{header[:40]!r}",
                         fix="encode the image data as base64 and write 'data:image/<type>;base64,' before it")
    data = "".join(data.split())
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"data URI {value[:40]!r}... holds invalid base64 ({e})", **loc,
                         expected="standard base64 (A-Z a-z 0-9 + /, '=' padding to a multiple of 4 characters)",
                         found=f"{len(data)} characters{_odd_char(data)}",
                         fix="re-encode the image with base64.b64encode (not URL-safe, not truncated)") from None
    if not decoded:
        raise ImageError(f"data URI {value[:40]!r} holds no data", **loc, expected="the image's base64 bytes",
                         found="an empty payload", fix="encode the image's bytes after 'base64,'")
    return decoded


def _odd_char(data: str) -> str:
    odd = next((c for c in data if not (c.isascii() and (c.isalnum() or c in "+/="))), None)
    return "" if odd is None else f", first odd character {odd!r} at {data.index(odd)}"


def _absolute(p: str, base: Path) -> Path:
    """Path ``p`` (``~`` expanded) made absolute against ``base``, the input file's directory."""
    full = Path(p).expanduser()
    return full if full.is_absolute() else base / full


def _local_path(p: str, base: Path, loc: dict, root: Optional[str] = None) -> str:
    """Absolute path of image file ``p``: under ``root``, a regular file (`check_image_file`; not opened)."""
    from mmpipe.images.load import check_image_file, confine_image

    if p.startswith(("http://", "https://")):
        raise ImageError(f"image {p!r} is a URL; mmpipe encode reads local files only", **loc,
                         fix="download the images and refer to them by path")
    if p.startswith("file://"):
        p = p[len("file://"):]
    full = _absolute(p, base)
    try:
        confine_image(str(full), root, where=None)
        if full.exists() or full.is_symlink():  # a FIFO, directory, device, loop, ...: say which
            check_image_file(str(full), where=None)
    except ImageError as e:
        raise e.locate(**loc) from None
    if not full.is_file():
        raise ImageError(f"image file {p!r} not found (looked for {str(full)!r}; relative paths are "
                         f"resolved against the input file's directory {str(base)!r})", **loc,
                         fix="fix the path or add the file")
    return str(full.resolve())


_INLINE_KEYS = ("image", "image_url", "path", "url")
_MEDIA_PATH_KEYS = ("audio", "video", "path")  # where an inline audio / video item names its file


class ImageResolver:
    """``dataset.map`` function (``with_indices=True``): every image of a raw row, in order,
    into ``images_column`` as ``{"bytes", "path"}`` dicts with absolute paths; inline content
    items become ``{"type": "image"}`` placeholders. Picklable (``num_proc``)."""

    def __init__(self, base: Path, images_column: str = "images", *, strict: bool = True,
                 image_root: Optional[str] = None):
        self.base = Path(base)
        self.image_root = image_root  # --image-root: every path must resolve under it
        self.images_column = images_column
        # strict=False (on_error="skip"): an unresolvable reference is passed on as a path, so
        # the encoder fails that row (recorded in the report) instead of the whole run
        self.strict = strict

    def __call__(self, example: dict, idx: int) -> dict:
        from mmpipe.encoding.media import media_column

        source = media_column(example, self.images_column)  # a LLaVA row's single `image`: resolved too
        raw = example.get(source)
        failed: list = []
        if source != self.images_column and not isinstance(raw, (list, tuple)):
            raw = [raw]
        if isinstance(raw, (str, bytes)):
            # one image where a list is expected: list() would make each character an "image"
            # ("image file 'i' not found")
            err = ImageError(f"column {self.images_column!r} holds one value, not a list of images",
                             row=idx, column=self.images_column, expected="a list of images per row",
                             found=f"{type(raw).__name__} {raw!r:.80}",
                             fix=f'wrap it in a list: "{self.images_column}": ["photo.jpg"]')
            if self.strict:
                raise err
            failed.append({"image": 0, "path": _NOT_A_LIST, "reason": str(err)})
            raw = None
        column = list(raw or [])
        images: list = []
        next_col = 0
        out: dict = {}
        for key in ("messages", "prompt"):
            msgs = example.get(key)
            if not isinstance(msgs, list):
                continue
            new_msgs = []
            for msg in msgs:
                content = msg.get("content") if isinstance(msg, dict) else None
                if not isinstance(content, list):
                    new_msgs.append(msg)
                    if isinstance(content, str):
                        n = content.count("<image>")
                        images.extend(column[next_col:next_col + n])
                        next_col += n
                    continue
                items, next_col = self._items(content, column, images, next_col)
                new_msgs.append({**msg, "content": items})
            out[key] = new_msgs
        images.extend(column[next_col:])  # surplus images: encode reports the mismatch
        out[self.images_column] = [self._resolve(v, {"row": idx, "image": i, "column": self.images_column}, failed)
                                   for i, v in enumerate(images)]
        if not self.strict:
            out[RESOLVE_ERRORS] = json.dumps(failed) if failed else ""
        return out

    def _items(self, content: list, column: list, images: list, next_col: int) -> tuple[list, int]:
        """One message's content items: an image item's image appended to ``images`` (inline, or
        the images ``column``'s next, whose index is ``next_col``) and the item made a placeholder;
        an inline audio / video item's file made absolute (`media_path`). -> (items, next_col)."""
        from mmpipe.encoding.media import is_audio_item, is_video_item
        from mmpipe.encoding.parse import inline_image, is_image_item

        items = []
        for item in content:
            if isinstance(item, dict) and is_image_item(item):
                inline = inline_image(item)
                if inline is None:
                    if next_col < len(column):
                        images.append(column[next_col])
                    next_col += 1
                else:
                    images.append(inline)
                    item = {**item, **{k: None for k in _INLINE_KEYS if k in item}, "type": "image"}
            elif isinstance(item, dict) and (is_audio_item(item) or is_video_item(item)):
                item = {**item, **{k: media_path(item[k], self.base) for k in _MEDIA_PATH_KEYS
                                   if isinstance(item.get(k), str)}}
            items.append(item)
        return items, next_col

    def _resolve(self, value, loc: dict, failed: list):
        try:
            return _resolve_one(value, self.base, loc, self.image_root)
        except ImageError as e:
            if self.strict:
                raise
            path = value if isinstance(value, str) and not value.startswith("data:") else (
                value.get("path") if isinstance(value, dict) else None)  # a data URI is no path
            passed = str(self.base / path) if path else "<unreadable image value>"
            failed.append({"image": loc["image"], "path": passed, "reason": str(e)})
            return {"bytes": None, "path": passed}


def resolve_images(ds, base: Path, *, images_column: str = "images", num_proc: Optional[int] = None,
                   strict: bool = True, image_root: Optional[str] = None):
    """`ImageResolver` over ``ds``; the images column becomes ``List(Image(decode=False))``
    (``strict=False``: plus the `RESOLVE_ERRORS` column, see `resolver_errors`)."""
    import datasets

    feats = ds.features.copy()
    if not strict:
        feats[RESOLVE_ERRORS] = datasets.Value("string")
    if images_column in feats:
        # decode=False: read as {"bytes", "path"} dicts, not decoded PIL images
        feats[images_column] = datasets.List(datasets.Image(decode=False))
        is_image_list = isinstance(getattr(ds.features[images_column], "feature", None), datasets.Image)
        ds = ds.cast_column(images_column, feats[images_column]) if is_image_list else ds
    else:
        feats[images_column] = datasets.List(datasets.Image(decode=False))
    return ds.map(ImageResolver(base, images_column, strict=strict, image_root=image_root), with_indices=True, features=feats, num_proc=num_proc,
                  desc="mmpipe: resolve images")


def media_path(value, base: Path):
    """A video / audio reference made absolute against ``base`` when it is a relative local path
    (``~`` expanded, ``file://`` dropped); anything else (bytes, dicts, URLs, ``data:``) as it is."""
    if isinstance(value, str) and value.startswith("file://"):
        value = value[len("file://"):]
    if not isinstance(value, str) or "://" in value or value.startswith("data:"):
        return value
    return str(_absolute(value, base))


def resolve_media_paths(ds, base: Path, columns, *, num_proc: Optional[int] = None):
    """The relative file paths in ``ds``'s media ``columns`` (lists of video files or audio clips) made
    absolute against ``base`` (the input file's directory, as image paths are; ``~`` expanded, ``file://``
    dropped); bytes, dicts, arrays, URLs and absolute paths are left as they are. A missing file is left to the encoder,
    whose typed error names the row, the column and the path it was given."""
    import datasets

    def paths(feature) -> bool:  # a list of strings (a column of bytes, dicts or Video() values is left alone)
        inner = getattr(feature, "feature", None)
        return isinstance(inner, datasets.Value) and inner.dtype in ("string", "large_string")

    cols = [c for c in dict.fromkeys(columns) if c in ds.column_names and paths(ds.features[c])]
    if not cols:
        return ds

    def row(r):
        return {c: r[c] if not isinstance(r[c], list) else [media_path(v, base) for v in r[c]] for c in cols}

    return ds.map(row, num_proc=num_proc, desc="mmpipe: resolve media paths")


def resolver_errors(ds) -> tuple:
    """``ds`` after a non-strict `resolve_images` -> ``(ds without RESOLVE_ERRORS, {row: [{"image",
    "path", "reason"}, ...]})`` (rows whose references all resolved are left out)."""
    if RESOLVE_ERRORS not in ds.column_names:
        return ds, {}
    found = {i: json.loads(x) for i, x in enumerate(ds[RESOLVE_ERRORS]) if x}
    return ds.remove_columns([RESOLVE_ERRORS]), found


def explain_failures(errors: list, unresolved: dict) -> list:
    """The encode report's row errors (``{"row", "stage", "column", "reason"}``), each image error
    of a row whose reference did not resolve carrying the resolver's reason (it names the
    reference as written and the directory relative paths were looked up in) instead of the
    encoder's, which names only the absolute path it was passed. Other errors are kept."""
    out = []
    for e in errors:
        match = next((u for u in unresolved.get(e.get("row"), ()) if u["path"] == _NOT_A_LIST or (
            e.get("stage") == "image" and repr(u["path"]) in str(e.get("reason", "")))), None)
        # an images value that is not a list fails the row at the template stage (no images
        # for its placeholders): the resolver's reason names the real cause
        out.append({**e, "reason": match["reason"]} if match else e)
    return out
