"""Skip means skipped AND named, on every route that offers ``on_error="skip"`` (error-routes hunt).

The same broken rows (a truncated JPEG, a zero-byte file, a missing path, two placeholders for one
image) go through each route: every failed row is left out, counted, and reported as
``{"row", "stage", "column", "reason"}`` with the row index the user can look up, from any number
of worker processes."""

from __future__ import annotations

import io

import datasets
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data import filters

from conftest import processor_for


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    testing.tiny_image(40, 56, seed=seed).save(buf, "JPEG")
    return buf.getvalue()


def _row(image, placeholders: int = 1) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}] * placeholders + [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
            "images": [image]}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """8 rows: 1 truncated JPEG, 3 zero bytes, 4 missing path, 6 a placeholder too many; the rest good."""
    d = tmp_path_factory.mktemp("broken")
    files = {"good": _jpeg(0), "trunc": _jpeg(1)[:100], "zero": b""}
    for name, data in files.items():
        (d / f"{name}.jpg").write_bytes(data)
    p = {name: str(d / f"{name}.jpg") for name in ("good", "trunc", "zero", "missing")}
    rows = [_row(p["good"]), _row(p["trunc"]), _row(p["good"]), _row(p["zero"]), _row(p["missing"]),
            _row(p["good"]), _row(p["good"], 2), _row(p["good"])]
    return datasets.Dataset.from_list(rows)


FAILED = {(1, "image", "images"), (3, "image", "images"), (4, "image", "images"), (6, "template", "images")}


def _where(errors) -> set:
    return {(e["row"], e["stage"], e["column"]) for e in errors}


@pytest.mark.parametrize("num_proc", [None, 2])
def test_length_filter_names_the_rows_it_skipped(broken, num_proc):
    """filter_by_length(on_error="skip") removed failing rows with only a count (``failed``): no row
    index, stage or reason anywhere, not even a log line, so the user could not find or fix them.
    The report now lists them as encode_dataset's report does."""
    proc = processor_for("qwen2_vl")
    kept, report = filters.filter_by_length(broken, proc, max_tokens=4096, on_error="skip", num_proc=num_proc)
    assert (report.failed, report.rows_out, len(kept)) == (4, 4, 4)
    assert _where(report.errors) == FAILED
    assert all(f"row {e['row']}" in e["reason"] and "[stage: " in e["reason"] for e in report.errors)
    lengths = filters.token_lengths(broken, proc, on_error="skip", num_proc=num_proc)
    assert _where(lengths.errors) == FAILED and sorted(int(i) for i in (lengths.total < 0).nonzero()[0]) == [1, 3, 4, 6]
    _, encoded = mmpipe.encode_dataset(broken, proc, on_error="skip", num_proc=num_proc)
    assert _where(encoded.errors) == _where(report.errors)  # the same rows, reported the same way


def _same(x):
    return x


def _stream_rows(good: str) -> list:
    long_text = "x " * 3000  # ~6,000 tokens: over max_length=1000
    rows = [_row(good), _row(good), _row(good, 2), _row(good), _row(good), _row(good)]
    rows[1]["messages"][0]["content"][-1]["text"] = long_text
    rows[4]["messages"][0]["content"][-1]["text"] = long_text
    return [dict(r, id=i) for i, r in enumerate(rows)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_drops_are_counted_and_named_like_failures(tmp_path, num_workers, caplog):
    """encode_stream(truncation="drop") left over-long rows out with only a log line naming the
    position in a worker's stream (no worker, no id) and no count anywhere, while failed rows
    (on_error="skip") are recorded with their worker and kept columns. Drops now reach
    ``dropped=`` (any DataLoader worker) and the log names them as failures are named."""
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    from mmpipe.data.streaming import encode_stream

    (tmp_path / "good.jpg").write_bytes(_jpeg(0))
    ds = datasets.Dataset.from_list(_stream_rows(str(tmp_path / "good.jpg"))).to_iterable_dataset(num_shards=2)
    with mp.Manager() as manager:
        errors, dropped = manager.list(), manager.list()
        stream = encode_stream(ds, processor_for("qwen2_vl"), batch_size=2, keep_columns=["id"], errors=errors,
                               dropped=dropped, on_error="skip", max_length=1000, truncation="drop")
        with caplog.at_level("WARNING", logger="mmpipe"):
            ids = [r["id"] for r in DataLoader(stream, batch_size=None, num_workers=num_workers, collate_fn=_same)]
        errors, dropped = list(errors), list(dropped)
    assert sorted(ids) == [0, 3, 5]
    assert [(e["keep"], e["stage"]) for e in errors] == [({"id": 2}, "template")]
    assert sorted((d["keep"]["id"], d["reason"]) for d in dropped) == [(1, "too_long"), (4, "too_long")]
    assert all(("worker" in d) == (num_workers > 0) for d in dropped + errors)
    if num_workers == 0:  # the log names the dropped row's kept columns too
        assert sorted(m for m in caplog.messages if "dropped row" in m) == [
            "mmpipe.encode_stream dropped row 1 id=1 (too_long: truncation='drop')",
            "mmpipe.encode_stream dropped row 4 id=4 (too_long: truncation='drop')"]
