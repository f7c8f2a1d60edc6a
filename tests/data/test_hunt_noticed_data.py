"""Items noticed in earlier hunts: ``exactly_once`` refuses a flat list of tuple keys (a key, or a
rank's keys?), the generic path probes a processor that fails text-only rows once per Encoder (not
once per failing row), and collate and ``mmpipe.validate_dataset`` judge token values by one rule."""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.batching.checks import check_token_values
from mmpipe.data.streaming import exactly_once
from mmpipe.data.validate_rows import token_value_issues
from mmpipe.errors import ArgumentError, InputError


# ---- exactly_once: tuple keys ---------------------------------------------------------------------
def test_a_flat_list_of_tuple_keys_is_refused_not_read_as_one_rank_per_tuple():
    """Old code: ``exactly_once([(0, "a"), (1, "b")], same)`` read each tuple as one rank's keys:
    "missing 2 ..., unexpected 4 (e.g. [0, 'a', 1, 'b'])", a report of rows that were all read."""
    keys = [(0, "a"), (1, "b")]
    with pytest.raises(ArgumentError, match=r"per_rank_keys\[0\] is the tuple \(0, 'a'\).*\[list\(keys\)\]"):
        exactly_once(keys, keys)
    assert exactly_once([keys], keys).ok  # one rank, its keys as a list
    assert exactly_once([[keys[0]], [keys[1]]], iter(keys)).ok  # two ranks; expected keys from an iterator
    assert exactly_once([tuple(keys)], keys).ok  # a rank's keys as a tuple of tuple keys: not ambiguous
    assert exactly_once([(0, 1), (2,)], [0, 1, 2]).ok  # plain keys: a tuple per rank, as before
    assert exactly_once([(), [(0, "a")]], [(0, "a")]).ok  # a rank that read nothing
    cov = exactly_once([[(0, "a"), (0, "a")]], keys)
    assert cov.missing == [(1, "b")] and cov.duplicated == {(0, "a"): 2}


# ---- the generic path: a processor failing text-only rows is probed once ---------------------------
def _counting_needs_images(proc, calls: list):
    """``proc`` as a processor refusing every call without images (PaliGemma on transformers 4.x);
    each call appended to ``calls``."""
    base = type(proc)

    def __call__(self, *args, images=None, **kwargs):
        calls.append(images is not None)
        if images is None:
            raise ValueError("`images` are expected as arguments to this processor")
        return base.__call__(self, *args, images=images, **kwargs)

    proc.__class__ = type("NeedsImagesProcessor", (base,), {"__call__": __call__})
    return proc


def _raw(n_images: int, k: int) -> dict:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": [testing.tiny_image(40, 36, seed=k) for _ in range(n_images)]}


def test_text_only_rows_probe_the_processor_once_per_encoder():
    """Old code: 10 failing text-only rows -> 20 processor calls (each row's call and a text-only probe
    each); now 11 (the probe once per Encoder), with the same error for every row."""
    calls: list = []
    enc = mmpipe.Encoder(_counting_needs_images(testing.build_processor("llava"), calls), family="generic")
    assert enc.encode_row(_raw(1, 0)).input_ids.size
    state, before = enc.__getstate__(), len(calls)
    errors = []
    for k in range(10):
        with pytest.raises(InputError) as info:
            enc.encode_row(_raw(0, k))
        errors.append(info.value)
    assert len(calls) - before == 11
    assert {(e.column, e.fix) for e in errors} == {(errors[0].column, errors[0].fix)}
    assert errors[0].column == "images" and "a text-only probe too" in str(errors[0])
    assert "filter the text-only rows" in errors[0].fix
    assert set(enc.__getstate__()) == set(state)  # the cache is not the Encoder's pickled state (its fingerprint)
    other = mmpipe.Encoder(enc.processor, family="generic")  # another Encoder probes for itself
    with pytest.raises(InputError, match="a text-only probe too"):
        other.encode_row(_raw(0, 99))


# ---- one token-value rule for collate and validate --------------------------------------------------
_CASES = {"input_ids": [[5, 6, 7], [5, -1, 7], [0], []],
          "labels": [[-100, 6, 7], [-100, -5, 7], [-100, -100], [0, -1]],
          "attention_mask": [[1, 1, 1], [1, 0, 1], [0, 0, 0], [1, 2, 1], [0, 1, 1], [-1, 0, 0]]}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_collate_and_validate_share_the_token_value_rule(name):
    """The rule (`token_value_faults`, `mask_has_holes`) gives the same verdict on numpy (collate, one
    row) and Arrow (validate, a column's flat values; a null value is no fault), and each caller's
    verdict is the rule's: collate raises on a row iff validate lists it as an error. Old code: the
    rule was written twice (no `token_value_faults`)."""
    from mmpipe.batching.checks import mask_has_holes, token_value_faults
    from mmpipe.data.validate_rows import ARROW_OPS

    for values in _CASES[name]:
        a = np.asarray(values, np.int64)
        flat = token_value_faults(name, a)
        assert flat.tolist() == token_value_faults(name, pa.array(values, pa.int64()), ARROW_OPS).to_pylist()
    assert token_value_faults(name, pa.array([None], pa.int64()), ARROW_OPS).to_pylist() == [None]  # null: no row
    table = pa.table({name: pa.array(_CASES[name], pa.list_(pa.int64()))})
    flagged = sorted({r for i in token_value_issues(table) if i.severity == "error" for r in i.rows})
    refused = []
    for k, values in enumerate(_CASES[name]):
        a = np.asarray(values, np.int64)
        fields = {"input_ids": np.zeros(len(a), np.int64), "attention_mask": None, "labels": None, name: a}
        try:
            check_token_values(types.SimpleNamespace(**fields), k)
        except InputError as e:
            assert e.column == name
            refused.append(k)
        faults = token_value_faults(name, a)
        want = (bool(mask_has_holes(np.count_nonzero(a == 1), np.count_nonzero(a == 0), np.count_nonzero(faults)))
                if name == "attention_mask" else bool(faults.any()))
        assert (k in refused) == want, (name, values)
    assert refused == flagged and refused, (name, refused, flagged)
