"""Naming a streamed row. ``IterableDataset.map(with_indices=True)`` counts positions in the stream
this process reads; they are the dataset's rows only for an unshuffled, unsplit stream read by one
process. Elsewhere (a shuffle, a rank split, a filter, several DataLoader workers) `encode_stream`'s
errors and skip records name the stream position as such, ``row`` None, instead of a wrong row."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Optional

from mmpipe.errors import InputError
from mmpipe.records.columns import ERROR_COLUMN

# what in a stream's chain of example iterables (datasets' class names) moves its rows off their positions
_SHUFFLED = ("Shuffled",)
_MOVED = ("Filtered", "Skip", "Step", "Cycling")


def position_caveat(ds) -> Optional[str]:
    """Why a stream position of ``ds`` is not its dataset row (a shuffle, a split over ranks, a
    filter or skip before the encode), or None when it is (as far as this process knows)."""
    names, it = [], getattr(ds, "_ex_iterable", None)
    while it is not None and len(names) < 64:
        names.append(type(it).__name__)
        it = getattr(it, "ex_iterable", None)
    if any(k in n for n in names for k in _SHUFFLED):
        return "the stream is shuffled"
    if getattr(ds, "_distributed", None) is not None or any(k in n for n in names for k in _MOVED):
        return "the stream was split, filtered or skipped before the encode"
    return None


def stream_place(position: int, caveat: Optional[str]) -> Optional[str]:
    """The location text of stream position ``position`` where it is not a dataset row (``caveat``,
    or this process one of several DataLoader workers), else None."""
    torch = sys.modules.get("torch")
    info = torch.utils.data.get_worker_info() if torch is not None else None
    where = f"stream row {position}"
    if info is not None and info.num_workers > 1:
        where += f" of DataLoader worker {info.id}"
        caveat = caveat or f"each of {info.num_workers} DataLoader workers reads part of the stream"
    if caveat is None:
        return None
    return f"{where} (not a dataset row: {caveat}; keep an id column to find the row)"


def relocated_record(text: str, caveat: Optional[str]) -> str:
    """An `ERROR_COLUMN` record (JSON, ``""`` for a good row) naming its stream position where that is
    not a dataset row: ``row`` None, ``stream_row`` the position, the reason's location replaced."""
    rec = json.loads(text) if text else None
    place = stream_place(rec["row"], caveat) if rec and isinstance(rec.get("row"), int) else None
    if place is None:
        return text
    rec["reason"] = re.sub(rf"^row {rec['row']}(?=[,:])", place, rec.get("reason") or "", count=1)
    rec["row"], rec["stream_row"] = None, rec["row"]
    return json.dumps(rec)


class StreamRows:
    """The stream's batched map function (``fn(batch, indices, **fn_kwargs)``, e.g. ``mmpipe.encode``)
    whose failed rows name their stream position where it is not a dataset row (`stream_place`):
    a raised `InputError` and each ``on_error="skip"`` record get ``row`` None and that text."""

    def __init__(self, fn, caveat: Optional[str]):
        self.fn, self.caveat = fn, caveat

    def __call__(self, batch: dict, indices: Any, **kwargs) -> dict:
        try:
            out = self.fn(batch, indices, **kwargs)
        except InputError as e:
            place = stream_place(e.row, self.caveat) if isinstance(e.row, int) else None
            if place is not None:
                e.where, e.row = place + ("" if e.image is None else f", image {e.image}"), None
                e.restage(e.stage)  # the message composed again
            raise
        if out.get(ERROR_COLUMN):
            out[ERROR_COLUMN] = [relocated_record(t, self.caveat) for t in out[ERROR_COLUMN]]
        return out
