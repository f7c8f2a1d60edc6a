"""Fuzzing encode, collate and unbatch: hostile inputs give a valid row or a documented error.

Targets (hypothesis; strategies in tests/strategies.py):

- ``encode``: random chat structures (roles, content shapes, special-token-looking user
  text such as a typed ``<|image_pad|>``), random image values (valid PNG/JPEG/PIL/arrays of
  1..80 px in many modes, truncated bytes, garbage, wrong types), placeholder/image count
  mismatches and random encoder options. Property: the call returns rows that pass every
  invariant (``validate``, image tokens == grids, positions == ``get_rope_index``, labels
  aligned, budget kept, no image lost), or raises a documented error naming the row.
- ``collate``/``unbatch``: random batches of valid rows (three families, uint8 / float32 /
  layout-only pixels, with and without labels, records / dicts / Arrow) with random padding:
  ``unbatch(collate(rows)) == rows`` and ``model_inputs`` shapes agree.
- corrupted rows: valid stored rows with one mutation (dropped column, wrong shape or dtype,
  grid vs pixel mismatch, damaged bytes, unknown family ...): collate raises a documented
  error naming the row whenever the mutation breaks an invariant.
- corrupted Arrow tables (the same mutations, schema-typed or type-inferred tables):
  ``validate_dataset`` never raises, and reports an error whenever collate refuses the table.

Sizes: the CI run (default) tries 2400 cases (fixed seed) in well under a minute on 2 cores.
``MMPIPE_FUZZ_EXAMPLES=N`` scales every target to about N cases in total (the longer run:
``MMPIPE_FUZZ_EXAMPLES=200000 bash scripts/fuzz.sh``); ``MMPIPE_FUZZ_REPORT=path.json``
writes the outcome counts (ok / dropped / each documented error / crashes) there.
Each crash found became a regression test at the end of this file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe.images.pixels import u8_to_pixel_values
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing.invariants import assert_roundtrip, assert_rows_from_arrow, assert_unbatched_rows_valid

from conftest import processor_for
from strategies import fuzz_encode_options, fuzz_raw_rows, image_pool

from mmpipe.errors import DOCUMENTED_ERRORS, PixelDataError

# Documented: the `mmpipe.errors` hierarchy only (InputError and its subclasses, all
# ValueErrors) - never a bare ValueError/TypeError/KeyError/numpy/PIL error.
DOCUMENTED = DOCUMENTED_ERRORS

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# CI-sized run: share of the total per target; MMPIPE_FUZZ_EXAMPLES scales the total.
CI_TOTAL = 2400
SHARES = {"encode": 0.5, "encode_batched": 0.1, "collate": 0.15, "corrupt": 0.15, "corrupt_arrow": 0.1}
TOTAL = int(os.environ.get("MMPIPE_FUZZ_EXAMPLES", CI_TOTAL))
settings.register_profile(
    "mmpipe-fuzz", deadline=None, derandomize=TOTAL == CI_TOTAL, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def fuzz_settings(target: str):
    # the CI run is derandomized (same cases every run, no flaky CI); longer runs explore
    return settings(settings.get_profile("mmpipe-fuzz"), max_examples=max(10, int(TOTAL * SHARES[target])))


OUTCOMES: dict[str, Counter] = {t: Counter() for t in SHARES}


@pytest.fixture(scope="module", autouse=True)
def _report_outcomes():
    yield
    summary = {t: dict(c) for t, c in OUTCOMES.items()}
    summary["total_cases"] = sum(sum(c.values()) for c in OUTCOMES.values())
    path = os.environ.get("MMPIPE_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    print("\nmmpipe fuzz outcomes:", json.dumps(summary, sort_keys=True))


def _documented(e: BaseException, target: str, *, row_named: bool = True) -> str:
    """Classify an exception: a documented error (counted by class) or re-raise it as a crash."""
    if not isinstance(e, DOCUMENTED):
        OUTCOMES[target]["CRASH " + type(e).__name__] += 1
        raise AssertionError(f"undocumented {type(e).__name__} escaped: {e}") from e
    if row_named:  # a row, or for a whole-column problem (a table's column type) the column
        assert "row" in str(e) or (getattr(e, "row", 0) is None and getattr(e, "column", None)), \
            f"error does not name the row: {e}"
    OUTCOMES[target][type(e).__name__] += 1
    return type(e).__name__


# ---- invariants of one encoded row ------------------------------------------------------
def check_row(row: MultiModalInputs, opts: dict, n_images: int, where=None) -> None:
    row.validate(where)
    fam = row.fam
    L = row.num_tokens
    assert row.pixel_format == (opts.get("pixels", "uint8") if n_images or opts.get("pixels") == "none"
                                else row.pixel_format)
    assert row.num_images == n_images, "an image was lost or invented"
    m2 = fam.merge_size**2
    assert int((row.mm_token_type_ids == 1).sum()) == int(row.image_grid_thw.prod(axis=1).sum()) // m2
    pos, delta = mmpipe.get_rope_index(row.input_ids[None], row.mm_token_type_ids[None],
                                       image_grid_thw=row.image_grid_thw if n_images else None, family=fam)
    assert np.array_equal(pos[:, 0].numpy(), row.position_ids)
    assert int(delta.reshape(-1)[0]) == row.rope_delta
    assert np.array_equal(row.attention_mask, np.ones(L))
    if opts.get("labels", True):
        lab = row.labels
        assert lab is not None and lab.shape == (L,)
        tgt = lab != IGNORE_INDEX
        assert np.array_equal(lab[tgt], row.input_ids[tgt]), "labels not aligned with input_ids"
        assert not tgt[row.mm_token_type_ids > 0].any(), "an image token is a target"
    else:
        assert row.labels is None
    if opts.get("max_length"):
        assert L <= opts["max_length"]
    # a stored row reads back as itself
    assert MultiModalInputs.from_dict(row.to_dict(), row=where) == row


def _n_images(raw) -> int:
    return len(mmpipe.parse_row(raw)[1])


# ---- target (a): encode -----------------------------------------------------------------
@fuzz_settings("encode")
@given(fuzz_raw_rows(), fuzz_encode_options(), st.sampled_from(FAMILIES))
def test_fuzz_encode(case, opts, family):
    raw, expect = case
    proc = processor_for(family)
    try:
        out = mmpipe.encode(raw, 17, processor=proc, **opts)
    except Exception as e:  # noqa: BLE001 - classified: documented or a crash
        name = _documented(e, "encode")
        # a well-formed row only fails for the budget
        if expect == "valid" and not opts.get("max_length"):
            raise AssertionError(f"a well-formed row was refused ({name}): {e}") from e
        return
    if opts["on_error"] == "skip":
        reason = out.pop("mmpipe_error")
        if reason:  # kept as an empty row with the record; a wrapped crash would have stage "encode"
            rec = json.loads(reason)
            assert rec["stage"] != "encode" and rec["row"] == 17, rec
            assert len(out["input_ids"]) == 0
            OUTCOMES["encode"][f"skipped ({rec['stage']})"] += 1
            return
    row = MultiModalInputs.from_dict(out, row=17)
    check_row(row, opts, _n_images(raw), where=17)
    OUTCOMES["encode"]["ok"] += 1


@fuzz_settings("encode_batched")
@given(st.lists(fuzz_raw_rows(max_messages=3), min_size=1, max_size=3), fuzz_encode_options(),
       st.sampled_from(FAMILIES))
def test_fuzz_encode_batched(cases, opts, family):
    """batched=True map: every row is kept (and equals its per-row encoding) or counted as
    dropped under truncation='drop'; or the batch raises a documented error."""
    raws = [r for r, _ in cases]
    keys = sorted({k for r in raws for k in r})
    batch = {k: [r.get(k) for r in raws] for k in keys}
    proc = processor_for(family)
    enc = mmpipe.Encoder(proc, **opts)
    try:
        out = enc(batch, list(range(len(raws))))
    except Exception as e:  # noqa: BLE001
        _documented(e, "encode_batched")
        return
    failed = []
    if opts["on_error"] == "skip":  # failed rows stay (empty) with their record; never a wrapped crash
        failed = [json.loads(x) for x in out.pop("mmpipe_error") if x]
        assert all(f["stage"] != "encode" for f in failed), failed
    n_out = len(out["input_ids"])
    assert n_out + sum(enc.stats.dropped.values()) == len(raws)
    if opts["truncation"] != "drop":
        assert n_out == len(raws)
    if failed:
        OUTCOMES["encode_batched"]["rows skipped"] += 1
        return
    if n_out == len(raws):
        for i, raw in enumerate(raws):
            row = MultiModalInputs.from_dict({k: v[i] for k, v in out.items()}, row=i)
            check_row(row, opts, _n_images(raw), where=i)
            alone = MultiModalInputs.from_dict(mmpipe.Encoder(proc, **opts)(raw, i), row=i)
            assert alone == row, f"batched and per-row encodings differ in {alone.diff(row)}"
    OUTCOMES["encode_batched"]["ok" if n_out == len(raws) else "dropped"] += 1


# ---- target (b): collate / unbatch ------------------------------------------------------
_POOL: dict[str, list[MultiModalInputs]] = {}


def row_pool(family: str) -> list[MultiModalInputs]:
    """A fixed pool of encoded rows per family: 0..3 images, with and without answers."""
    if family not in _POOL:
        imgs = image_pool()
        raws = []
        for k in range(10):
            n = k % 4
            content = []
            for j in range(n):
                content += [{"type": "image"}, {"type": "text", "text": f"see {j}"}]
            content.append({"type": "text", "text": "what is it?" * (k % 3 + 1)})
            msgs = [{"role": "user", "content": content}]
            if k % 2:
                msgs.append({"role": "assistant", "content": [{"type": "text", "text": "a thing " * k}]})
            raws.append({"messages": msgs, "images": [imgs[(k + j) % len(imgs)] for j in range(n)]})
        proc = processor_for(family)
        _POOL[family] = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]
    return _POOL[family]


def as_format(row: MultiModalInputs, fmt: str, labels: bool) -> MultiModalInputs:
    lab = row.labels if labels else None
    if fmt == "uint8":
        return replace(row, labels=lab)
    if fmt == "float32":
        spec = mmpipe.VisionSpec.from_family(row.fam)
        pv = u8_to_pixel_values(row.pixel_values_u8, spec.lut(), spec.temporal_patch_size)
        return replace(row, labels=lab, pixel_values_u8=None, pixel_values=pv)
    return replace(row, labels=lab, pixel_values_u8=None)


def _py(v):
    return v.tolist() if isinstance(v, np.ndarray) else (int(v) if isinstance(v, np.integer) else v)


def arrow_rows(rows, schema: pa.Schema | None = None) -> pa.Table:
    """Rows (records or stored dicts) as the Arrow table a saved dataset holds (default: the
    union schema, nulls where absent); ``schema=False``: types inferred as a hand-written table's."""
    dicts = [r.to_dict() if isinstance(r, MultiModalInputs) else r for r in rows]
    if schema is False:
        return pa.Table.from_pylist([{k: _py(v) for k, v in d.items()} for d in dicts])
    schema = schema or MultiModalInputs.arrow_schema()
    cols = {f.name: pa.array([_py(d.get(f.name)) for d in dicts], type=f.type) for f in schema}
    return pa.table(cols, schema=schema)


@st.composite
def collate_cases(draw):
    family = draw(st.sampled_from(FAMILIES))
    n = draw(st.integers(1, 5))
    idx = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    fmts = draw(st.one_of(
        st.lists(st.sampled_from(["uint8", "float32", "none"]), min_size=n, max_size=n),
        st.sampled_from(["uint8", "float32", "none"]).map(lambda f: [f] * n),
    ))
    labels = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return (family, idx, fmts, labels, draw(st.sampled_from(["left", "right"])),
            draw(st.sampled_from([None, None, 1, 3, 8, 64])), draw(st.sampled_from(["records", "dicts", "arrow"])))


@fuzz_settings("collate")
@given(collate_cases())
def test_fuzz_collate_unbatch(case):
    family, idx, fmts, labels, side, multiple, container = case
    pool = row_pool(family)
    rows = [as_format(pool[i], f, lab) for i, f, lab in zip(idx, fmts, labels)]
    given_rows = {"records": rows, "dicts": [r.to_dict() for r in rows], "arrow": arrow_rows(rows)}[container]
    try:
        batch = mmpipe.collate(given_rows, processor=processor_for(family), padding_side=side,
                               pad_to_multiple_of=multiple)
    except Exception as e:  # noqa: BLE001
        _documented(e, "collate")
        # the only refusal allowed for valid rows: layout-only rows with images (the model would not
        # see them; mixed with rows whose images carry pixels, the batch would drop those pixels)
        with_images = {r.pixel_format for r in rows if r.num_images}
        assert "none" in with_images, e
        return
    assert_roundtrip(rows, batch=batch)
    B, L = batch.input_ids.shape
    assert L == (-(-max(r.num_tokens for r in rows) // multiple) * multiple if multiple
                 else max(r.num_tokens for r in rows))
    mi = batch.model_inputs()
    assert mi["input_ids"].shape == mi["attention_mask"].shape == (B, L)
    assert mi["position_ids"].shape == (3, B, L)
    n_img = sum(r.num_images for r in rows)
    if "pixel_values" in mi:
        assert mi["image_grid_thw"].shape == (n_img, 3)
        assert mi["pixel_values"].shape == (sum(r.num_image_patches for r in rows), rows[0].fam.patch_dim)
        # the model sees exactly the image tokens the grids announce
        assert int((mi["mm_token_type_ids"] == 1).sum()) == int(mi["image_grid_thw"].prod(-1).sum()) // 4
    else:
        assert n_img == 0 or all(r.pixel_format == "none" for r in rows if r.num_images)
    if "labels" in mi:
        assert mi["labels"].shape == (B, L)
    OUTCOMES["collate"]["ok"] += 1


# ---- target (b'): corrupted rows --------------------------------------------------------
MUTATIONS = {
    # name: (mutate(dict row, rng) -> dict row, breaks an invariant for rows with images / all rows)
    "drop_input_ids": (lambda d: d.pop("input_ids"), "all"),
    "drop_position_ids": (lambda d: d.pop("position_ids"), "all"),
    "drop_family": (lambda d: d.pop("family"), "all"),
    "drop_mm_token_type_ids": (lambda d: d.pop("mm_token_type_ids"), "images"),
    "drop_pixels": (lambda d: [d.pop(k) for k in ("pixel_values_u8", "pixel_values") if k in d], "never"),
    "drop_image_grid_thw": (lambda d: d.pop("image_grid_thw"), "images"),
    "short_input_ids": (lambda d: d.__setitem__("input_ids", d["input_ids"][:-1]), "all"),
    "short_labels": (lambda d: d.__setitem__("labels", d["labels"][1:]) if d.get("labels") is not None else None, "labels"),
    "two_position_rows": (lambda d: d.__setitem__("position_ids", d["position_ids"][:2]), "all"),
    "flat_position_ids": (lambda d: d.__setitem__("position_ids", d["position_ids"].reshape(-1)), "all"),
    "grid_bigger": (lambda d: d.__setitem__("image_grid_thw", d["image_grid_thw"] + np.array([0, 2, 0], np.int32)), "images"),
    "grid_negative": (lambda d: d.__setitem__("image_grid_thw", -d["image_grid_thw"]), "images"),
    "grid_flat": (lambda d: d.__setitem__("image_grid_thw", d["image_grid_thw"].reshape(-1)), "images"),
    "grid_two_cols": (lambda d: d.__setitem__("image_grid_thw", d["image_grid_thw"][:, :2]), "images"),
    "extra_grid": (lambda d: d.__setitem__("image_grid_thw", np.concatenate([d["image_grid_thw"], [[1, 2, 2]]]).astype(np.int32)), "all"),
    "pixel_bytes_short": (lambda d: _set_pixels(d, lambda b: b[:-2] + b[-1:], lambda a: a[:-1]), "images"),
    "pixel_bytes_long": (lambda d: _set_pixels(d, lambda b: b[:-1] + bytes(588) + b[-1:],
                                               lambda a: np.concatenate([a, np.zeros((1, a.shape[1]), a.dtype)])), "all"),
    "pixel_no_marker": (lambda d: _set_pixels(d, lambda b: b[:-1]), "all"),
    "pixel_float_rows_short": (lambda d: _set_pixels(d, None, lambda a: a[:-1]), "images"),
    "pixel_float_width": (lambda d: _set_pixels(d, None, lambda a: a[:, :-1]), "images"),
    "unknown_family": (lambda d: d.__setitem__("family", "llava"), "all"),
    "other_family": (lambda d: d.__setitem__("family", "text" if d["family"] != "text" else "qwen2_vl"), "all"),
    "mm_type_7": (lambda d: d.__setitem__("mm_token_type_ids", np.where(d["mm_token_type_ids"] == 0, 7, d["mm_token_type_ids"]).astype(np.int8)), "all"),
    "mm_type_video": (lambda d: d.__setitem__("mm_token_type_ids", d["mm_token_type_ids"] * 2), "images"),
    "ids_as_float": (lambda d: d.__setitem__("input_ids", d["input_ids"].astype(np.float64) + 0.5), "all"),
    "ids_as_str": (lambda d: d.__setitem__("input_ids", [str(x) + "x" for x in d["input_ids"]]), "all"),
    "ids_none": (lambda d: d.__setitem__("input_ids", None), "all"),
    "ids_nested": (lambda d: d.__setitem__("input_ids", d["input_ids"][None]), "all"),
    "ids_int32_ok": (lambda d: d.__setitem__("input_ids", d["input_ids"].astype(np.int64)), "never"),
    "rope_delta_list": (lambda d: d.__setitem__("rope_delta", [int(d["rope_delta"])]), "never"),
    "rope_delta_str": (lambda d: d.__setitem__("rope_delta", "zero"), "all"),
    "attention_zero": (lambda d: d.__setitem__("attention_mask", np.zeros_like(d["attention_mask"])), "never"),
    "labels_float": (lambda d: d.__setitem__("labels", d["labels"].astype(np.float32)) if d.get("labels") is not None else None, "never"),
}


def _set_pixels(d, on_bytes, on_float=None):
    if d.get("pixel_values_u8") is not None and on_bytes is not None:
        d["pixel_values_u8"] = on_bytes(d["pixel_values_u8"])
    elif d.get("pixel_values") is not None and on_float is not None:
        d["pixel_values"] = on_float(d["pixel_values"])
    elif d.get("pixel_values_u8") is not None and on_float is not None:
        d["pixel_values_u8"] = on_float(np.frombuffer(d["pixel_values_u8"][:-1], np.uint8).reshape(
            -1, mmpipe.family_of(d["family"]).patch_dim_u8)).tobytes() + b"\xff"


@fuzz_settings("corrupt")
@given(st.sampled_from(FAMILIES), st.integers(0, 9), st.sampled_from(["uint8", "float32"]),
       st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2), st.booleans())
def test_fuzz_corrupted_rows(family, i, fmt, mutation, position, with_good):
    pool = row_pool(family)
    good = as_format(pool[(i + 1) % 10], fmt, True)
    bad = as_format(pool[i], fmt, True).to_dict()
    mutate, breaks = MUTATIONS[mutation]
    assume(fmt == "uint8" or mutation != "pixel_no_marker")  # float32 rows have no marker
    mutate(bad)
    rows = [good.to_dict(), good.to_dict()] if with_good else []
    where = min(position, len(rows))
    rows.insert(where, bad)
    must_raise = breaks == "all" or (breaks == "images" and pool[i].num_images) or (
        breaks == "labels" and pool[i].labels is not None)
    try:
        batch = mmpipe.collate(rows, processor=processor_for(family))
    except Exception as e:  # noqa: BLE001
        _documented(e, "corrupt")
        assert f"row {where}" in str(e), f"the error names the wrong row (bad row is {where}): {e}"
        return
    assert not must_raise, f"mutation {mutation!r} of row {where} passed collate silently"
    assert_unbatched_rows_valid(batch)
    OUTCOMES["corrupt"]["ok (harmless mutation)"] += 1


@fuzz_settings("corrupt_arrow")
@given(st.sampled_from(FAMILIES), st.integers(0, 9), st.sampled_from(["uint8", "float32"]),
       st.sampled_from(sorted(MUTATIONS)), st.booleans())
def test_fuzz_corrupted_arrow_tables(family, i, fmt, mutation, typed):
    """A damaged stored table (schema types, or types inferred as in a hand-written table):
    `validate_dataset` never raises, and whenever collate refuses the table (a documented
    error), the validation report holds an error too."""
    from mmpipe.data.validate import validate_dataset

    pool = row_pool(family)
    bad = as_format(pool[i], fmt, True).to_dict()
    MUTATIONS[mutation][0](bad)
    rows = [as_format(pool[(i + 1) % 10], fmt, True).to_dict(), bad]
    try:
        table = arrow_rows(rows, MultiModalInputs.arrow_schema(fmt) if typed else False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        assume(False)  # the damage cannot be written as this Arrow table at all
    report = validate_dataset(table)
    try:
        mmpipe.collate(table, processor=processor_for(family))
    except Exception as e:  # noqa: BLE001
        _documented(e, "corrupt_arrow")
        assert not report.ok, f"collate refused the table ({e}) but validation passed it:\n{report}"
        return
    OUTCOMES["corrupt_arrow"]["ok" if report.ok else "collate ok, validation error (strict schema)"] += 1


# ---- regression tests: each crash the fuzzing found ------------------------------------


def _stored_row(family="qwen2_vl", k=1):
    return row_pool(family)[k].to_dict()  # k=1: one image, an assistant answer


@pytest.mark.parametrize("mutate, column", [
    (lambda d: d.pop("input_ids"), "input_ids"),                    # was KeyError
    (lambda d: d.pop("position_ids"), "position_ids"),              # was KeyError
    (lambda d: d.__setitem__("family", "llava"), "family"),         # did not name the row
    (lambda d: d.__setitem__("rope_delta", "zero"), "rope_delta"),  # numpy "invalid literal for int()"
    (lambda d: d.__setitem__("input_ids", [f"{x}x" for x in d["input_ids"]]), "input_ids"),  # numpy error
    (lambda d: d.__setitem__("input_ids", d["input_ids"] + 0.5), "input_ids"),  # silently truncated to ints
    (lambda d: d.__setitem__("position_ids", d["position_ids"].reshape(-1)), "position_ids"),  # no row named
    (lambda d: d.__setitem__("image_grid_thw", np.array([[1, 4, 6, 1, 4, 6]], np.int32)), "image_grid_thw"),
    (lambda d: d.__setitem__("mm_token_type_ids", np.where(d["mm_token_type_ids"] == 0, 7, 1).astype(np.int8)),
     "mm_token_type_ids"),                                          # token type 7 passed silently
], ids=["no_input_ids", "no_position_ids", "unknown_family", "rope_delta_str", "ids_str", "ids_fractional",
        "flat_positions", "grid_width_6", "mm_type_7"])
def test_regression_damaged_stored_row_names_row_and_column(mutate, column):
    """Crashes the corrupted-row fuzzing found in MultiModalInputs.from_dict / validate:
    each is now an InputError (a ValueError) naming the row and the column."""
    good = _stored_row()
    bad = _stored_row()
    mutate(bad)
    with pytest.raises(ValueError) as info:
        mmpipe.collate([good, bad], processor=processor_for("qwen2_vl"))
    assert isinstance(info.value, DOCUMENTED), type(info.value)
    assert "row 1" in str(info.value) and column in str(info.value), str(info.value)


def test_regression_grid_width_two_is_not_reshaped():
    """A [2, 3] grid stored as [3, 2] was silently reshaped to [2, 3] (other numbers)."""
    d = row_pool("qwen2_vl")[2].to_dict()  # two images
    d["image_grid_thw"] = d["image_grid_thw"].reshape(3, 2)
    with pytest.raises(ValueError, match=r"row 4.*image_grid_thw.*rows of 3"):
        MultiModalInputs.from_dict(d, row=4)


def test_regression_layout_only_rows_do_not_drop_other_rows_pixels():
    """collate of [uint8 row with an image, layout-only row with an image] made a text-only
    batch: the first row's pixels were dropped (unbatch lost them, the model saw none)."""
    pool = row_pool("qwen2_vl")
    rows = [pool[1], as_format(pool[1], "none", True)]
    with pytest.raises(ValueError, match=r"rows \[1\] hold images but no pixel data.*rows \[0\] carry pixels"):
        mmpipe.collate(rows, processor=processor_for("qwen2_vl"))
    # all layout-only: refused (the model would not see its images), allowed when asked for
    with pytest.raises(PixelDataError, match="pixels"):
        mmpipe.collate([rows[1], rows[1]], processor=processor_for("qwen2_vl"))
    batch = mmpipe.collate([rows[1], rows[1]], processor=processor_for("qwen2_vl"), allow_layout_only=True)
    assert batch.pixel_values is None
    assert_roundtrip([rows[1], rows[1]], batch=batch)


def test_regression_images_column_not_a_list():
    """{"images": <PIL image>} (no list) raised TypeError: 'Image' object is not iterable."""
    img = image_pool()[0]
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}], "images": img}
    with pytest.raises(ValueError, match=r"row 3: column 'images' must hold a list of images"):
        mmpipe.encode_row(raw, processor_for("qwen2_vl"), idx=3)
    assert mmpipe.encode_row({**raw, "images": [img]}, processor_for("qwen2_vl"), idx=3).num_images == 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("text", ["<|image_pad|>", "see <|vision_start|><|image_pad|><|vision_end|> here"])
def test_typed_image_pad_never_makes_a_phantom_image(family, text):
    """User text containing the literal pad token is refused (never expanded into an image
    block without pixels), with or without real images in the row."""
    proc = processor_for(family)
    img = image_pool()[0]
    for raw in ({"messages": [{"role": "user", "content": text}]},
                {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
                 "images": [img]}):
        with pytest.raises(ValueError, match=r"row 5: .*<\|image_pad\|>") as info:
            mmpipe.encode_row(raw, proc, idx=5)
        assert isinstance(info.value, DOCUMENTED_ERRORS)
    # the placeholder convention "<image>" stays plain text when the row has no images
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "an <image> tag"}]}, proc, idx=5)
    assert row.num_images == 0 and not (row.mm_token_type_ids != 0).any()


def test_regression_hand_written_table_with_untyped_empty_columns():
    """pa.Table.from_pylist of stored rows types all-empty columns (video_grid_thw,
    second_per_grid_ts with no videos) as list<null>: rows_from_arrow raised AttributeError
    ('NullArray' object has no attribute 'offsets'). They read as empty now."""
    rows = row_pool("qwen2_5_vl")[:4]
    table = arrow_rows(rows, False)
    assert pa.types.is_null(table.schema.field("video_grid_thw").type.value_type)
    assert_rows_from_arrow(table, rows)
    assert_roundtrip(rows, batch=mmpipe.collate(table, processor=processor_for("qwen2_5_vl")))


def test_regression_arrow_table_damage_is_documented():
    """Damage only an Arrow table can hold: a null input_ids (was AttributeError on None), an
    older list<uint8> pixel column (was read as garbage offsets), a non-list grid column."""
    rows = [r.to_dict() for r in row_pool("qwen2_vl")[:3]]
    t = arrow_rows(rows, MultiModalInputs.arrow_schema("uint8"))
    ids = t.column("input_ids").to_pylist()
    ids[2] = None
    cases = {
        "null ids": (t.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int32()))), r"row 2: column 'input_ids' is null"),
        "u8 list": (t.set_column(t.column_names.index("pixel_values_u8"), "pixel_values_u8",
                                 pa.array([list(b[:-1]) for b in t.column("pixel_values_u8").to_pylist()],
                                          pa.list_(pa.uint8()))), "expected binary"),
        "flat grid": (t.set_column(t.column_names.index("image_grid_thw"), "image_grid_thw",
                                   pa.array([1, 2, 3], pa.int64())), "image_grid_thw.*expected a 2-level list"),
    }
    for name, (table, msg) in cases.items():
        with pytest.raises(ValueError, match=msg) as info:
            mmpipe.collate(table, processor=processor_for("qwen2_vl"))
        assert isinstance(info.value, DOCUMENTED_ERRORS), name
