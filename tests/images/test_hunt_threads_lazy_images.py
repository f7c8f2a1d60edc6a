"""Thread concurrency (hunt): a lazily decoded PIL image (``Image.open``: PIL reads the file on first
use, through one file object) shared by rows that threads encode at once - an async rollout server
encoding a prompt's row per request, n trajectories of one prompt, a judge asked twice about one
frame. The threads interleaved their seeks and reads of that one file: wrong pixels without an
error, or truncated / closed-file errors (AssertionError, SyntaxError, AttributeError from inside
PIL). Each image's file is now read by one thread at a time (`mmpipe.images.read_pixels`).
Counted, not timed: threads released together by a barrier, the switch interval shortened."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.images.load import read_pixels
from mmpipe.reward.frames import encode_frame
from mmpipe.testing import sample_photos

from conftest import processor_for
from helpers import run_threads


def _file(fmt: str) -> bytes:
    photo = next(im for _, im in sample_photos())
    buf = io.BytesIO()
    photo.convert("RGB").resize((224, 168)).save(buf, fmt)
    return buf.getvalue()


def _shared_by_threads(data: bytes, call, want, threads: int = 4, trials: int = 30) -> list:
    """Per trial, ONE lazily opened image handed to ``threads`` threads at once; what went wrong."""
    wrong = []
    for trial in range(trials):
        img = Image.open(io.BytesIO(data))

        def work(t: int) -> None:
            try:
                if not want(call(img)):
                    wrong.append((trial, "different output"))
            except Exception as e:  # noqa: BLE001 - what the race raised
                wrong.append((trial, f"{type(e).__name__}: {e}"[:120]))

        run_threads(work, threads)
    return wrong


def _row(img) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
            "images": [img]}


def _equal(a: dict, b: dict) -> bool:
    def arr(v):
        return np.asarray(v, dtype=object) if isinstance(v, list) else np.asarray(v)
    return a.keys() == b.keys() and all(np.array_equal(arr(a[k]), arr(b[k])) for k in a)


# old code, 240 calls per case (60 trials x 4 threads): 14 to 131 failed calls per case
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("family, options", [("qwen2_vl", {}), ("qwen2_vl", {"pixels": "source"}),
                                             ("gemma3", {}), ("idefics3", {})],
                         ids=["patches-uint8", "patches-source", "tiles", "generic"])
def test_one_lazy_image_encoded_on_threads(family, options, fmt):
    data = _file(fmt)
    enc = mmpipe.Encoder(processor_for(family), threads=1, **options)
    ref = enc.encode_row(_row(Image.open(io.BytesIO(data)))).to_dict()
    wrong = _shared_by_threads(data, lambda img: enc.encode_row(_row(img)).to_dict(), lambda out: _equal(out, ref))
    assert wrong == []


def test_one_lazy_frame_judged_on_threads():
    """The judge encodes a frame on its worker threads (old code: 24 of 240 frames wrong, 20 OSErrors, TIFF)."""
    data = _file("TIFF")
    ref = encode_frame(Image.open(io.BytesIO(data)))
    assert _shared_by_threads(data, encode_frame, lambda f: f == ref) == []


def test_layout_only_rows_still_read_headers_only():
    """Guard: pixels='none' reads the header of a lazy image and decodes nothing (passes before and after)."""
    data = _file("JPEG")
    enc = mmpipe.Encoder(processor_for("qwen2_vl"), pixels="none")
    img = Image.open(io.BytesIO(data))
    enc.encode_row(_row(img))
    assert img.tile  # still not decoded
    assert read_pixels(img) is img and not img.tile
