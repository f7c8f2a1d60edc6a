"""RayBatchEncoder's errors give Ray's advice for an unknown row (error-routes hunt): Ray batches
carry no row index, so without ``index_column`` a failed row's record (``on_error="skip"``) and a
raised error said "row (index unknown: pass with_indices=True to map)", an option Ray's
``map_batches`` does not have. Called directly (no Ray runtime needed)."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest

from mmpipe import testing
from mmpipe.errors import ImageError, PlaceholderError

from conftest import processor_for

pytest.importorskip("ray")
from mmpipe.data.ray_data import RayBatchEncoder  # noqa: E402


def _raw(placeholders: int, image: bytes) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}] * placeholders + [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
            "images": [image]}


def _png() -> bytes:
    buf = io.BytesIO()
    testing.tiny_image(28, 28).save(buf, "PNG")
    return buf.getvalue()


def test_a_row_of_unknown_index_is_told_to_use_index_column():
    proc, png = processor_for("qwen2_vl"), _png()
    table = pa.Table.from_pylist([_raw(1, png), _raw(2, png), _raw(1, b"not an image")])
    out = RayBatchEncoder(proc, on_error="skip", threads=1)(table)
    records = [json.loads(x) for x in out.column("mmpipe_error").to_pylist() if x]
    assert [(r["row"], r["stage"]) for r in records] == [(None, "template"), (None, "image")]
    for r in records:
        assert "pass index_column= to RayBatchEncoder" in r["reason"] and "with_indices" not in r["reason"]
    assert records[1]["reason"].startswith("row (index unknown: pass index_column= to RayBatchEncoder), image 0: ")
    for bad, cls in ((_raw(2, png), PlaceholderError), (_raw(1, b"not an image"), ImageError)):
        with pytest.raises(cls, match=r"^row \(index unknown: pass index_column= to RayBatchEncoder\)") as got:
            RayBatchEncoder(proc, threads=1)(pa.Table.from_pylist([_raw(1, png), bad]))
        assert "with_indices" not in str(got.value)
    with_ids = pa.Table.from_pylist([dict(_raw(2, png), id=41)])
    out = RayBatchEncoder(proc, on_error="skip", threads=1, index_column="id")(with_ids)
    assert json.loads(out.column("mmpipe_error")[0].as_py())["reason"].startswith("row 41: ")
