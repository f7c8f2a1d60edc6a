"""The stored files of ``pixels="source"`` rows (`mmpipe.encoding.sources`): does each one still
open as an image? Its header is read, nothing is decoded (collate decodes). Damage inside the
compressed data that leaves the header readable is what the row's ``pixel_digest`` catches.
Stage: validate (`mmpipe.data.validate`)."""

from __future__ import annotations

import io
from typing import Optional

import pyarrow as pa

__all__ = ["unreadable_sources"]


def unreadable_sources(table: pa.Table, chunk: int = 1024) -> dict[str, list[int]]:
    """``{why: [row, ...]}`` for the rows of ``table`` whose ``image_sources`` hold a file that
    does not open (empty bytes, not an image, a cut header); {} when all open or the table has
    no ``image_sources`` column."""
    bad: dict[str, list[int]] = {}
    if "image_sources" not in table.column_names:
        return bad
    for start in range(0, table.num_rows, chunk):
        for i, sources in enumerate(table.column("image_sources").slice(start, chunk).to_pylist()):
            for data in sources or ():
                why = _unreadable(data)
                if why:
                    bad.setdefault(why, []).append(start + i)
                    break
    return bad


def _unreadable(data: Optional[bytes]) -> str:
    """'' when ``data`` opens as an image (header only), else why not."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        return "empty bytes"
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        return f"not a readable image ({type(e).__name__})"
    return "" if w > 0 and h > 0 else f"size {w}x{h}"
