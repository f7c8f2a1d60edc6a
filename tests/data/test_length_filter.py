"""Length filtering from image headers: counts equal the full encode's, num_proc, report."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.data import filters
from mmpipe import testing

from conftest import FAMILIES, processor_for
from helpers import raw_dataset


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    ds = raw_dataset(tmp_path_factory.mktemp("lengths"))  # 14 rows, 0..3 photos/generated images
    return ds.add_column("id", list(range(len(ds))))


def _full_lengths(raw, proc, **options):
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, **options}, remove_columns=raw.column_names)
    rows = mmpipe.rows_from_arrow(enc.data.table)
    return (np.array([r.num_tokens for r in rows]),
            np.array([int((r.mm_token_type_ids == 1).sum()) for r in rows]))


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_only_counts_equal_the_full_encode(raw, family):
    proc = processor_for(family)
    got = filters.token_lengths(raw, proc)
    total, image = _full_lengths(raw, proc)
    np.testing.assert_array_equal(got.total, total)
    np.testing.assert_array_equal(got.image, image)
    np.testing.assert_array_equal(got.text, total - image)
    assert got.image.max() > 0 and (got.image == 0).any()


def test_encode_options_are_honoured_and_num_proc_agrees(raw):
    proc = processor_for("qwen3_vl")
    opts = {"max_pixels": 16 * 32 * 32, "add_generation_prompt": True}  # <= 16 tokens per image
    small = filters.token_lengths(raw, proc, num_proc=2, **opts)
    total, _ = _full_lengths(raw, proc, **opts)
    np.testing.assert_array_equal(small.total, total)
    default = filters.token_lengths(raw, proc)
    assert (small.image <= default.image).all() and (small.image < default.image).any()
    assert small.image.max() <= 3 * 16
    assert (small.text >= default.text).all() and (small.text > default.text).any()  # generation prompt added


def test_filter_by_length_keeps_rows_in_bounds_with_a_report(raw):
    proc = processor_for("qwen2_vl")
    lengths = filters.token_lengths(raw, proc).total
    lo, hi = int(np.percentile(lengths, 20)), int(np.percentile(lengths, 70))
    kept, report = filters.filter_by_length(raw, proc, min_tokens=lo, max_tokens=hi, num_proc=2,
                                            lengths_column="num_tokens")
    want = [i for i, n in enumerate(lengths) if lo <= n <= hi]
    assert kept["id"] == want
    assert kept["num_tokens"] == [int(lengths[i]) for i in want]
    assert kept[0]["messages"] == raw[want[0]]["messages"]
    assert report.rows_in == 14 and report.rows_out == len(want)
    assert report.too_long == int((lengths > hi).sum()) > 0
    assert report.too_short == int((lengths < lo).sum()) > 0
    assert report.removed == report.too_long + report.too_short
    assert report.tokens_out == int(lengths[want].sum())
    assert f"kept {len(want)} of 14 rows" in str(report)
    # the kept rows encode within the budget: what truncation="raise" needs later
    enc = kept.map(mmpipe.encode, fn_kwargs={"processor": proc, "max_length": hi})
    assert [len(x) for x in enc["input_ids"]] == kept["num_tokens"]


def test_only_image_headers_are_read():
    """A whole image's header gives its length; a PNG cut in half keeps its header, but the
    length filter refuses it as the full encode does (it counted it before: the row passed the
    filter and failed in training), and ``on_error="skip"`` drops it with its record."""
    proc = processor_for("qwen2_vl")
    buf = io.BytesIO()
    testing.tiny_image(300, 400).save(buf, format="PNG")
    whole = buf.getvalue()
    msgs = [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "What is it?"}]}]
    feats = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image()),
    })
    ds = datasets.Dataset.from_dict(
        {"messages": [msgs, msgs], "images": [[{"bytes": whole, "path": None}], [{"bytes": whole[: len(whole) // 2], "path": None}]]},
        features=feats)
    full = mmpipe.encode_row({"messages": msgs, "images": [testing.tiny_image(300, 400)]}, proc)
    assert filters.token_lengths(ds.select([0]), proc).total.tolist() == [full.num_tokens]
    with pytest.raises(mmpipe.errors.ImageError, match="truncated"):
        filters.token_lengths(ds, proc)
    skipped = filters.token_lengths(ds, proc, on_error="skip")
    assert skipped.total.tolist() == [full.num_tokens, -1] and skipped.errors[0]["row"] == 1
    with pytest.raises(mmpipe.errors.ImageError, match="truncated"):  # named since issue 15 (was a bare OSError)
        ds.map(mmpipe.encode, fn_kwargs={"processor": proc})


def test_bad_rows_and_arguments_are_named(raw):
    proc = processor_for("qwen2_vl")
    with pytest.raises(ValueError, match="max_tokens and/or min_tokens"):
        filters.filter_by_length(raw, proc)
    with pytest.raises(ValueError, match="above max_tokens"):
        filters.filter_by_length(raw, proc, min_tokens=10, max_tokens=5)
    with pytest.raises(TypeError, match="encode_stream"):
        filters.token_lengths(raw.to_iterable_dataset(), proc)
    broken = datasets.Dataset.from_dict({"prompt": ["fine", "two <image> <image>"], "images": [[], [None]]})
    with pytest.raises(ValueError, match="row 1"):
        filters.token_lengths(broken, proc)


def test_on_error_skip_counts_failing_rows_as_removed():
    proc = processor_for("qwen2_vl")
    img = {"bytes": _png(testing.tiny_image(60, 80)), "path": None}
    ds = datasets.Dataset.from_dict(
        {"prompt": ["ok <image>", "two <image> <image>", "plain text"], "images": [[img], [img], []]},
        features=datasets.Features({"prompt": datasets.Value("string"), "images": datasets.Sequence(datasets.Image())}))
    lengths = filters.token_lengths(ds, proc, on_error="skip")
    assert lengths.total[1] == -1 and (lengths.total[[0, 2]] > 0).all()
    kept, report = filters.filter_by_length(ds, proc, min_tokens=1, on_error="skip")
    assert kept["prompt"] == ["ok <image>", "plain text"]
    assert (report.failed, report.too_short, report.too_long, report.removed) == (1, 0, 0, 1)
    assert "1 failed to encode" in str(report)
    with pytest.raises(ValueError, match="row 1"):
        filters.token_lengths(ds, proc)


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()
