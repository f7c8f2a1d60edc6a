"""Length filtering at scale: tokens per raw row (text + image tokens) without decoding pixels.

A row's token count after image expansion depends only on the text and each image's size
(``t*h*w / merge**2`` tokens per image from the resized grid), so the layout-only encode
(``pixels="none"``) counts it from the image headers: no decode, resize or patchify. The
raw rows are read as Arrow (``with_format("arrow")``), so ``datasets`` does not decode the
``Image()`` columns either; images reach the encoder as ``{"bytes", "path"}`` values whose
header alone is read. Counts equal ``len(input_ids)`` of the full encode with the same
options (tested), so a filter here keeps exactly the rows that fit ``max_length`` later.

Example::

    kept, report = mmpipe.data.filters.filter_by_length(ds, processor, max_tokens=4096, num_proc=8,
                                                   lengths_column="num_tokens")
    print(report)   # kept 9,812 of 10,000 rows; 188 over 4096 tokens, 0 under 0
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.mapping import as_input_error
from mmpipe.records.columns import ERROR_COLUMN


class TokenCounter:
    """Batched ``Dataset.map`` function over Arrow batches: total and image tokens per row.

    ``options``: the `mmpipe.Encoder` options the training encode will use (``min_pixels``,
    ``max_pixels``, ``add_generation_prompt``, ``chat_template_kwargs``, ``end_of_turn``,
    ``images_column``); pixel and truncation options do not change a count and are overridden, and
    so are labels, except under ``end_of_turn="stop_token"``, where a labelled encode appends the stop
    token to replies the template ends without one (GLM-4.1V/4.6V): counted as that encode counts. With
    ``on_error="skip"`` a row that fails to encode counts -1 (`filter_by_length` removes it) and
    a third column, ``mmpipe_error``, holds its JSON ``{"row", "stage", "column", "reason"}``
    (``""`` on counted rows), as ``mmpipe.encode`` records it.
    """

    def __init__(self, processor, **options):
        labels = options.pop("labels", True) and options.get("end_of_turn") == "stop_token"  # the appended stops
        for name in ("pixels", "max_length", "truncation"):
            options.pop(name, None)
        self.encoder = Encoder(processor, pixels="none", labels=bool(labels), **options)

    def __call__(self, batch, indices: list[int]) -> dict[str, list]:
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else [
            {k: v[i] for k, v in batch.items()} for i in range(len(indices))]
        total, image, errors = [], [], []
        skip = getattr(self.encoder, "on_error", "raise") == "skip"
        for row, idx in zip(rows, indices):
            try:
                r = self.encoder.encode_row(row, idx)
            except Exception as e:
                if not skip:
                    raise
                total.append(-1)
                image.append(-1)
                errors.append(json.dumps(as_input_error(e, idx).record()))  # which row, and why: never only a count
                continue
            total.append(r.num_tokens)
            image.append(int((r.mm_token_type_ids == 1).sum()))
            errors.append("")
        return {"num_tokens": total, "num_image_tokens": image, **({ERROR_COLUMN: errors} if skip else {})}


@dataclass
class TokenLengths:
    """Per-row token counts of a dataset: ``total`` and ``image`` int64 [n] (-1: the row failed to
    encode under ``on_error="skip"``; ``errors`` holds each such row's ``{"row", "stage", "column",
    "reason"}``)."""

    total: np.ndarray
    image: np.ndarray
    errors: list = field(default_factory=list)

    @property
    def text(self) -> np.ndarray:
        """int64 [n]: tokens that are not image tokens."""
        return self.total - self.image


def token_lengths(ds, processor, *, num_proc: Optional[int] = None, batch_size: int = 64, **options) -> TokenLengths:
    """Tokens per row of a ``datasets.Dataset`` of raw rows (text + image tokens), from the
    image headers only, in ``num_proc`` processes. ``options``: see `TokenCounter`."""
    import datasets

    if not isinstance(ds, datasets.Dataset):
        raise TypeError(
            f"token_lengths needs a datasets.Dataset, found {type(ds).__name__}; for a stream, drop "
            "over-long rows while encoding: mmpipe.data.streaming.encode_stream(ds, processor, max_length=N, "
            "truncation='drop')"
        )
    if len(ds) == 0:
        return TokenLengths(np.zeros(0, np.int64), np.zeros(0, np.int64))
    counted = ds.with_format("arrow").map(
        TokenCounter(processor, **options), batched=True, batch_size=batch_size, with_indices=True,
        remove_columns=ds.column_names, num_proc=num_proc, desc="mmpipe token lengths",
    )
    table = counted.data.table
    errors = [json.loads(x) for x in table.column(ERROR_COLUMN).to_pylist() if x] \
        if ERROR_COLUMN in table.column_names else []
    return TokenLengths(
        total=table.column("num_tokens").to_numpy().astype(np.int64),
        image=table.column("num_image_tokens").to_numpy().astype(np.int64),
        errors=errors,
    )


@dataclass
class LengthFilterReport:
    """What `filter_by_length` removed: rows over ``max_tokens``, rows under ``min_tokens``,
    rows that failed to encode (``on_error="skip"`` only: ``failed`` of them, each one's
    ``{"row", "stage", "column", "reason"}`` in ``errors``, as `mmpipe.encode_dataset` reports them)."""

    rows_in: int
    rows_out: int
    too_long: int
    too_short: int
    max_tokens: Optional[int]
    min_tokens: Optional[int]
    tokens_in: int
    tokens_out: int
    failed: int = 0
    errors: list = field(default_factory=list)

    @property
    def removed(self) -> int:
        return self.rows_in - self.rows_out

    def __str__(self) -> str:
        return (f"kept {self.rows_out:,} of {self.rows_in:,} rows ({self.tokens_out:,} of {self.tokens_in:,} tokens); "
                f"{self.too_long:,} over {self.max_tokens} tokens, {self.too_short:,} under {self.min_tokens}"
                + (f", {self.failed:,} failed to encode" if self.failed else ""))


def filter_by_length(ds, processor, *, max_tokens: Optional[int] = None, min_tokens: Optional[int] = None,
                     num_proc: Optional[int] = None, batch_size: int = 64, lengths_column: Optional[str] = None,
                     **options):
    """Keep the rows whose token count (text + image tokens) is within
    ``[min_tokens, max_tokens]`` (either bound may be None).

    Returns ``(filtered, LengthFilterReport)``; ``filtered`` is ``ds.select(kept)`` (rows
    unchanged, in order), with the counts added as ``lengths_column`` when given (int64,
    e.g. for a token-budget sampler). ``options``: the encode options (see `TokenCounter`).
    """
    if max_tokens is None and min_tokens is None:
        raise ArgumentError("filter_by_length needs max_tokens and/or min_tokens")
    if max_tokens is not None and min_tokens is not None and min_tokens > max_tokens:
        raise ArgumentError(f"min_tokens={min_tokens} is above max_tokens={max_tokens}; nothing could be kept")
    counted = token_lengths(ds, processor, num_proc=num_proc, batch_size=batch_size, **options)
    lengths = counted.total
    failed = lengths < 0
    too_long = (lengths > max_tokens) if max_tokens is not None else np.zeros(len(lengths), bool)
    too_short = (lengths < min_tokens) & ~failed if min_tokens is not None else np.zeros(len(lengths), bool)
    keep = ~(too_long | too_short | failed)
    out = ds.add_column(lengths_column, lengths) if lengths_column else ds
    out = out.select(np.flatnonzero(keep))
    report = LengthFilterReport(
        rows_in=len(ds), rows_out=int(keep.sum()), too_long=int(too_long.sum()), too_short=int(too_short.sum()),
        max_tokens=max_tokens, min_tokens=min_tokens, tokens_in=int(lengths[~failed].sum()),
        tokens_out=int(lengths[keep].sum()), failed=int(failed.sum()), errors=counted.errors,
    )
    return out, report
