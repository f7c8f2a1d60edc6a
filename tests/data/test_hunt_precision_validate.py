"""Precision hunt: an encoded dataset whose float pixel column was cast to float16 afterwards (a
user halving a float32 cache, the 75 GB one of FACTS). The cast rounded every value the processor
made: the generic path's rows then reached the model with other pixels than the processor's own
call, and `validate_dataset` said OK; the patch grids' report called it a wrong Arrow type that a
cast back (or ``fix=True``, reported as fixed) repairs, after which collate refused every row as
"not made with this processor's image settings". Both now report a float16 column as an error
whose fix is a re-encode (the rounding cannot be undone)."""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe import testing

from helpers import generic_chat_rows


def _half(f):
    if isinstance(f, datasets.Value) and f.dtype == "float32":
        return datasets.Value("float16")
    return type(f)(_half(f.feature)) if hasattr(f, "feature") else f


@pytest.mark.parametrize("family,options", [("qwen2_vl", {"pixels": "float32"}), ("idefics3", {})])
def test_float16_pixel_column_is_an_error_to_reencode(family, options):
    proc = testing.build_processor(family)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(generic_chat_rows([1, 2])), proc, **options)
    assert mmpipe.validate_dataset(enc, processor=proc).ok
    features = enc.features.copy()
    features["pixel_values"] = _half(features["pixel_values"])
    half = enc.cast(features)
    for fix in (False, True):
        report = mmpipe.validate_dataset(half, processor=proc, fix=fix)
        issues = [i for i in report.issues if i.column == "pixel_values"]
        assert [i.severity for i in issues] == ["error"], (fix, [str(i) for i in issues])
        assert "float16" in issues[0].message and "re-encode" in issues[0].fix, str(issues[0])
