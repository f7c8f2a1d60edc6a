"""The example rows ``schemas/*.json`` show: for every family of the table (and the generic
path, through the offline Idefics3 processor), one tiny encoded row as stored, the batch of
that row and a text-only row, and their pack, each shortened deterministically.

Shortening keeps a value whole when it holds at most `KEEP_VALUES` numbers; a longer array
becomes ``{"shape": [...], "first": [the first FIRST_VALUES values, flat]}`` (``{"bytes": n,
"first": [...]}`` for binary); floats are rounded to 4 decimals. Everything comes from the
offline builders (`mmpipe.offline`): no download, the same text on every run.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.families import ALL_FAMILIES, GENERIC_FAMILY, TEXT

KEEP_VALUES = 12
FIRST_VALUES = 8
GENERIC_EXAMPLE = "idefics3"  # a processor without a family row of its own: the generic path
IMAGE_HW = (28, 28)


def _processor(name: str):
    """The offline processor an example of family ``name`` is encoded with: the family's own, the
    tokenizer for the text family, and a processor without a row for the generic path."""
    from mmpipe.offline import build_processor, build_tokenizer
    from mmpipe.offline.other_vlms import build_foreign_processor

    if name == GENERIC_FAMILY:
        return build_foreign_processor(GENERIC_EXAMPLE)
    return build_tokenizer() if name == TEXT.name else build_processor(name)


def _raws(name: str) -> list[dict]:
    """One row with an image (the text family: text only) and one text-only row."""
    from mmpipe.offline import tiny_image

    image = name != TEXT.name
    content = [{"type": "image"}] * image + [{"type": "text", "text": "What is this?"}]
    return [
        {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "A cat."}],
         "images": [tiny_image(*IMAGE_HW)] * image},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
    ]


@functools.lru_cache(maxsize=None)
def example_records(name: str) -> tuple:
    """(rows, batch, pack or the reason a pack is refused) of family ``name``'s example: the
    rows encoded with `_processor` (default pixel storage), collated left-padded."""
    import mmpipe

    proc = _processor(name)
    rows = [mmpipe.encode_row(r, proc) for r in _raws(name)]
    batch = mmpipe.collate(rows, processor=proc, padding_side="left")
    try:
        packed = mmpipe.pack(rows, processor=proc)
    except ArgumentError as e:  # the family's attention does not allow packed rows
        packed = str(e)
    return rows, batch, packed


def shorten(value: Any) -> Any:
    """A stored value as the JSON an example shows (see the module docstring)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        return {"bytes": len(b), "first": list(b[:FIRST_VALUES])}
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict) and isinstance(value.get("data"), bytes) and "dtype" in value:
        # a named tensor (mmpipe.records.batch_arrow.TENSOR): show its values, not its bytes
        values = np.frombuffer(value["data"], np.dtype(value["dtype"]).newbyteorder("<"))
        return {**{k: shorten(v) for k, v in value.items() if k != "data"}, "data": shorten(values)}
    if isinstance(value, dict):
        return {k: shorten(v) for k, v in value.items()}
    if not isinstance(value, (list, tuple)):
        return value
    flat = _leaves(value)
    if flat is not None and len(flat) > KEEP_VALUES:
        shape = _shape(value)
        first = [shorten(v) for v in flat[:FIRST_VALUES]]
        return {"shape": shape, "first": first} if shape else {"values": len(flat), "first": first}
    return [shorten(v) for v in value]


def _leaves(value) -> Any:
    """The numbers of a nested list, flat; None when it holds anything else (dicts, bytes)."""
    out = []
    for v in value:
        if isinstance(v, (list, tuple)):
            sub = _leaves(v)
            if sub is None:
                return None
            out += sub
        elif isinstance(v, (int, float, bool, str)) or v is None:
            out.append(v)
        else:
            return None
    return out


def _shape(value) -> list:
    """The shape of a rectangular nested list, [] when ragged."""
    try:
        return list(np.asarray(value).shape)
    except ValueError:
        return []


def row_examples() -> dict[str, dict]:
    """Family -> its example row as stored (``MultiModalInputs.to_dict``), shortened."""
    return {name: shorten(example_records(name)[0][0].to_dict()) for name in ALL_FAMILIES}


def batch_examples() -> dict[str, dict]:
    """Family -> its example batch (one row with an image, one without) as its Arrow row, shortened."""
    return {name: shorten(example_records(name)[1].to_arrow().to_pylist()[0]) for name in ALL_FAMILIES}


def packed_examples() -> dict[str, Any]:
    """Family -> the pack of its example rows as its Arrow row, shortened; for a family whose rows
    cannot be packed, the reason (``{"not packable": ...}``)."""
    out: dict[str, Any] = {}
    for name in ALL_FAMILIES:
        packed = example_records(name)[2]
        if isinstance(packed, str):
            out[name] = {"not packable": packed}
        else:
            out[name] = shorten(packed.to_arrow().to_pylist()[0])
    return out
