"""What `mmpipe.data.streaming.encode_stream` leaves out of a stream, recorded: rows that failed
(``on_error="skip"``) and rows dropped (``truncation="drop"``) are each logged as a warning and
appended to the caller's ``errors=`` / ``dropped=`` list, from any DataLoader worker (a
``multiprocessing.Manager().list()`` collects them all), with the worker and the row's kept
columns: skipped means skipped, counted and named, never an empty row the Collator takes."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from mmpipe.data.stream_rows import stream_place
from mmpipe.errors import ArgumentError

logger = logging.getLogger("mmpipe")


def leave_out(mapped, marks: dict, names: Sequence[str], *, errors=None, dropped=None, batch_size: int,
              caveat: Optional[str] = None):
    """``mapped`` (an ``IterableDataset`` that carries the ``marks`` columns, ``{"drop":
    DROP_REASON_COLUMN, "error": ERROR_COLUMN}`` or either) without the marked rows, each recorded
    by `_DropFailed` (``names``: kept input columns copied into each record)."""
    return mapped.filter(_DropFailed(errors, names, dropped=dropped, marks=list(marks), caveat=caveat),
                         input_columns=[*marks.values(), *names], batched=True, batch_size=batch_size,
                         with_indices=True)


class _DropFailed:
    """Batched ``filter`` function (``with_indices``) over `ERROR_COLUMN` and/or
    ``DROP_REASON_COLUMN`` (``marks``: which of the two the stream carries) and ``names``, the kept
    input columns: keep the encoded rows. Each failed row is logged (a warning: seen from any
    DataLoader worker) and its ``{"row", "stage", "column", "reason"}`` appended to ``errors`` when
    given; each dropped row (``truncation="drop"``) likewise, as ``{"row", "reason"}`` appended to
    ``dropped``. Both get ``"worker"`` (the DataLoader worker whose stream ``row`` counts in) and
    ``"keep"`` (the row's ``keep_columns`` values, e.g. its id)."""

    def __init__(self, errors, names: Sequence[str] = (), *, dropped=None, marks: Sequence[str] = ("error",),
                 caveat: Optional[str] = None):
        self.errors, self.dropped, self.caveat = errors, dropped, caveat  # caveat: `stream_place`'s
        self.names = list(names)
        self.marks = tuple(marks)
        self._told = set()

    def __call__(self, *columns: list) -> list[bool]:
        import json

        *columns, indices = columns
        marks, kept = dict(zip(self.marks, columns)), columns[len(self.marks):]
        worker = _worker_id()
        where = "" if worker is None else f" of DataLoader worker {worker}'s stream"
        bad, none = [False] * len(indices), [""] * len(indices)
        errors, drops = marks.get("error", none), marks.get("drop", none)
        for i in range(len(indices)):
            failed, reason = errors[i], drops[i]
            if not (failed or reason):
                continue
            bad[i] = True
            rec = json.loads(failed) if failed else {"row": indices[i], "reason": reason}
            if not failed and stream_place(indices[i], self.caveat) is not None:  # a position, not a dataset row
                rec = {"row": None, "stream_row": indices[i], "reason": reason}
            if worker is not None:
                rec["worker"] = worker
            if self.names:
                rec["keep"] = {c: values[i] for c, values in zip(self.names, kept)}
            keep = "".join(f"{k}={v!r} " for k, v in rec.get("keep", {}).items())
            if failed:
                logger.warning("mmpipe.encode_stream skipped row %s%s %s(stage %s, column %s): %s", _row(rec),
                               where, keep, rec.get("stage"), rec.get("column"), rec.get("reason"))
                self._record(self.errors, "errors", rec, worker)
            else:
                logger.warning("mmpipe.encode_stream dropped row %s%s %s(%s: truncation='drop')", _row(rec), where,
                               keep, reason)
                self._record(self.dropped, "dropped", rec, worker)
        return [not b for b in bad]

    def _record(self, sink, name: str, rec: dict, worker: Optional[int]) -> None:
        if sink is None:
            return
        if worker is not None and type(sink) is list and name not in self._told:
            self._told.add(name)  # a worker's copy of a plain list: the caller's list never sees it
            logger.warning("mmpipe.encode_stream: %s= is a plain list, which DataLoader worker %s only "
                           "copies; pass %s=multiprocessing.Manager().list() to collect the rows "
                           "of every worker", name, worker, name)
        sink.append(rec)


def _row(rec: dict) -> str:
    """A record's row for the log: the dataset row, else its stream position as such."""
    return str(rec["row"]) if rec.get("row") is not None else f"(stream position {rec.get('stream_row')})"


def _worker_id() -> Optional[int]:
    """The torch DataLoader worker running this code, None in the main process."""
    import sys

    torch = sys.modules.get("torch")
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return None if info is None else info.id


def check_errors_sink(errors, what: str, *, name: str = "errors") -> None:
    """``errors`` (the argument ``name``) must be None or a list-like with ``append`` (a list, or a
    ``multiprocessing.Manager().list()`` that DataLoader workers share)."""
    if errors is not None and (isinstance(errors, (str, bytes)) or not callable(getattr(errors, "append", None))):
        raise ArgumentError(f"{name} must be a list ({what} are appended to it; multiprocessing.Manager().list() "
                            f"to collect them from DataLoader workers) or None, got {type(errors).__name__}")
