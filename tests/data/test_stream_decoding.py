"""Where a corrupt image in a stream is caught (issue 29).

A plain ``IterableDataset.map(mmpipe.encode)`` over a *decoding* ``datasets.Image()`` column
cannot catch a corrupt image: ``datasets`` decodes the row in its own iterator before the map
function is called, and its generator is dead afterwards (datasets #6470 / #7612 / #8165). These
tests pin that behaviour of ``datasets`` (so the day it changes, they say so), check that
``mmpipe.map_kwargs`` warns about such a stream with the fix, and that the fix holds: the same
stream through `mmpipe.data.undecoded_stream` gives the corrupt row its typed error and every other
row its encode.
"""

from __future__ import annotations

import json
import warnings

import pytest
from bad_inputs import image_stream, jpeg_bytes, photo
from conftest import processor_for
from PIL import UnidentifiedImageError

import mmpipe
from mmpipe.data.streaming import undecoded_stream

FAMILY = "qwen2_vl"
CORRUPT = 1  # the row whose image bytes are not an image


def _stream():
    good = [jpeg_bytes(photo(40 + 8 * i, 36, seed=i)) for i in range(3)]
    good[CORRUPT] = b"\x00not an image" * 10
    return image_stream(good)(None)


def test_datasets_decodes_before_the_map_function_and_its_iterator_dies():
    seen = []

    def record(row, idx):
        seen.append(idx)
        return {"n": idx}

    it = iter(_stream().map(record, with_indices=True))
    assert next(it)["n"] == 0
    with pytest.raises(UnidentifiedImageError):  # raised by datasets' decode, not by the function
        next(it)
    assert seen == [0]  # the function never saw the corrupt row
    with pytest.raises(StopIteration):  # and the stream cannot go on past it
        next(it)


def test_map_kwargs_warns_about_a_decoding_stream_with_the_fix():
    proc = processor_for(FAMILY)
    with pytest.warns(UserWarning, match=r"undecoded_stream") as caught:
        kwargs = mmpipe.map_kwargs(proc, _stream())
    message = str(caught[0].message)
    assert "'images'" in message and "datasets" in message
    assert set(kwargs) == {"batch_size"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the undecoded stream is what it should be: no warning
        assert set(mmpipe.map_kwargs(proc, undecoded_stream(_stream()))) == {"batch_size"}


def test_the_undecoded_stream_types_the_corrupt_row_and_encodes_the_others():
    proc = processor_for(FAMILY)
    rows = list(undecoded_stream(_stream()).map(
        mmpipe.encode, fn_kwargs={"processor": proc, "on_error": "skip"}, with_indices=True))
    assert len(rows) == 3
    errors = {i: json.loads(r["mmpipe_error"]) for i, r in enumerate(rows) if r["mmpipe_error"]}
    assert list(errors) == [CORRUPT]
    assert errors[CORRUPT]["row"] == CORRUPT and errors[CORRUPT]["column"] == "images"
    assert all(len(r["input_ids"]) > 0 for i, r in enumerate(rows) if i != CORRUPT)
