"""Every case of the bad-input corpus (tests/bad_inputs.py) has its documented outcome, on
the pixel and the layout-only route; the on_error policy keeps every failed row accounted
for; EXIF orientation gives the same upright image on every route; huge images stay within
bounded memory."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import datasets
import numpy as np
import pytest
from bad_inputs import (BAD, CASES, ROW, exif_jpeg, jpeg_bytes, outcome_counts, photo, png_bytes,
                        smooth_gray, user_row, write)
from conftest import processor_for
from helpers import bounded
from PIL import Image

import mmpipe
from mmpipe.encoding.mapping import ERROR_COLUMN, as_input_error
from mmpipe.errors import DOCUMENTED_ERRORS, STAGES, ArgumentError, ImageError, InputError, ParseError, VideoError


def _proc(c):
    return c.processor() if c.processor is not None else processor_for(c.family)


def _stream(c, data, proc):
    """A stream case's rows, iterated to the end (bounded), and the errors encode_stream counted."""
    from mmpipe.data.streaming import encode_stream, undecoded_stream

    opts = dict(c.options)
    if opts.pop("route", None) == "map":  # the plain map route, the Image() column read undecoded
        mapped = undecoded_stream(data).map(mmpipe.encode, fn_kwargs={"processor": proc, **opts}, with_indices=True)
        return bounded(lambda: list(mapped))
    errors: list = []
    stream = encode_stream(data, proc, errors=errors, **opts)
    return bounded(lambda: list(stream)), errors


def _run(c, tmp_path, pixels="float32"):
    proc = _proc(c)
    data = c.build(tmp_path)
    if c.stage == "encode":  # bounded: a case that blocks (a FIFO, a device) fails instead of hanging
        # the default route (float32) takes the case's own pixel format, if any; the others are forced
        opts = {"pixels": pixels, **c.options} if pixels == "float32" else {**c.options, "pixels": pixels}
        return data, lambda: bounded(lambda: mmpipe.encode_row(data, proc, idx=ROW, **opts))
    if c.stage == "setup":
        return data, lambda: mmpipe.Encoder(proc, **c.options).encode_row(data, ROW)
    if c.stage == "validate":
        return data, lambda: mmpipe.validate_dataset(datasets.Dataset.from_list(data))
    if c.stage == "stream":
        return data, lambda: _stream(c, data, proc)
    if c.stage == "dataset":
        return data, lambda: bounded(lambda: mmpipe.encode_dataset(data, proc, **c.options))
    assert c.stage == "collate", c.stage
    return data, lambda: mmpipe.Collator(proc)(data)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_corpus_case(c, tmp_path, monkeypatch):
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)
    proc = _proc(c)
    data, run = _run(c, tmp_path)
    if c.raises is None:
        result = run()
        if c.check is not None:
            assert c.check(result, data, proc) is not False
    elif issubclass(c.raises, ArgumentError):  # a processor or options no row can be encoded with: at once
        with pytest.raises(c.raises) as info:
            run()
        assert type(info.value) is c.raises and c.stage == "setup" and c.err_stage == "argument"
        for s in c.contains:
            assert s in str(info.value), f"{s!r} not in {str(info.value)!r}"
        return
    else:
        with pytest.raises(c.raises) as info:
            run()
        e = info.value
        assert type(e) is c.raises and isinstance(e, ValueError) and isinstance(e, DOCUMENTED_ERRORS)
        msg = str(e)
        for s in c.contains:
            assert s in msg, f"{s!r} not in {msg!r}"
        assert e.stage == c.err_stage and e.stage in STAGES
        if c.column is not None:
            assert e.column == c.column and f"column: {c.column!r}" in msg
        if c.stage == "encode":
            assert e.row == ROW and msg.startswith(f"row {ROW}")
            assert e.record() == {"row": ROW, "stage": c.err_stage, "column": e.column, "reason": msg}
            if isinstance(e, VideoError):  # which video of the row
                assert msg.startswith(f"row {ROW}, video ")
            elif c.err_stage == "image":  # which image of the row
                assert isinstance(e.image, int) and msg.startswith(f"row {ROW}, image {e.image}: ")
        elif "row" in " ".join(c.contains):
            named = [int(w.split()[1]) for w in c.contains if w.startswith("row ") and w.split()[1].isdigit()]
            assert e.row in (named[:1] or (None, 0, BAD))  # the row the case names: the one that differs
        assert " - " in msg or c.stage == "collate"  # says what to do (records' own texts end in it)
    if c.stage != "encode" or c.layout == "skip":
        return
    # the layout-only route (pixels="none", header reads only) agrees
    _, layout = _run(c, tmp_path, pixels="none")
    if c.raises is None or c.layout == "ok":
        lay = layout()
        if c.raises is None:
            np.testing.assert_array_equal(lay.image_grid_thw, result.image_grid_thw)
            np.testing.assert_array_equal(lay.input_ids, result.input_ids)
            np.testing.assert_array_equal(lay.position_ids, result.position_ids)
    else:
        with pytest.raises(c.raises) as info:
            layout()
        assert info.value.stage == c.err_stage and info.value.row == ROW
    if c.raises is not None and issubclass(c.raises, ImageError) and not issubclass(c.raises, VideoError):
        # the source route (pixels="source": the files stored, decoded at collate) refuses the image at
        # encode too, where on_error="skip" records it, not in the DataLoader worker that collates
        _, source = _run(c, tmp_path, pixels="source")
        with pytest.raises(ImageError) as info:
            source()
        assert info.value.stage == c.err_stage and info.value.row == ROW
        assert str(info.value).startswith(f"row {ROW}, image {info.value.image}: "), str(info.value)


def test_corpus_is_broad():
    names = {c.name for c in CASES}
    assert len(CASES) >= 60 and len(names) == len(CASES)
    assert {c.raises for c in CASES} == {None, ArgumentError, *DOCUMENTED_ERRORS}
    assert {c.stage for c in CASES} == {"encode", "collate", "setup", "validate", "stream", "dataset"}


def test_corpus_outcome_counts():
    """At least 120 kinds, each with a stated outcome; the table is printed (``-s``) for the report."""
    counts = outcome_counts()
    print("\nbad-input corpus:", json.dumps(counts))
    assert counts["kinds"] >= 120 and counts["undocumented"] == []
    assert sum(counts["clear_error"].values()) + counts["handled"] == counts["kinds"]
    assert (counts["silent"], counts["crash"], counts["hang"]) == (0, 0, 0)
    assert outcome_counts([CASES[0]])["kinds"] == 1 and outcome_counts([CASES[0]])["clear_error"]


# ---- EXIF: one upright image on every route --------------------------------------------
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_same_on_every_route(orientation, tmp_path):
    proc = processor_for("qwen2_vl")
    data = exif_jpeg(orientation)
    path = write(tmp_path, "photo.jpg", data)
    decoded = datasets.Dataset.from_dict({"im": [{"bytes": data, "path": None}]}).cast_column("im", datasets.Image())
    undecoded = decoded.cast_column("im", datasets.Image(decode=False))
    routes = {
        "bytes": data, "dict": {"bytes": data, "path": None}, "path": path, "pil": Image.open(path),
        "datasets_decoded": decoded[0]["im"], "datasets_undecoded": undecoded[0]["im"],
    }
    outs = {k: mmpipe.encode_row(user_row([v]), proc, idx=0, pixels="float32") for k, v in routes.items()}
    ref = outs["bytes"]
    h, w = (40, 64) if orientation < 5 else (64, 40)  # upright size
    spec = mmpipe.VisionSpec.from_processor(proc)
    th, tw = mmpipe.images.smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels)
    assert ref.image_grid_thw.tolist() == [[1, th // 14, tw // 14]]
    for k, r in outs.items():
        np.testing.assert_array_equal(r.image_grid_thw, ref.image_grid_thw, err_msg=k)
        np.testing.assert_array_equal(r.pixel_values, ref.pixel_values, err_msg=k)
    for k, v in routes.items():
        lay = mmpipe.encode_row(user_row([v]), proc, idx=0, pixels="none")
        np.testing.assert_array_equal(lay.image_grid_thw, ref.image_grid_thw, err_msg=f"layout {k}")
        np.testing.assert_array_equal(lay.position_ids, ref.position_ids, err_msg=f"layout {k}")


# ---- the error policy ------------------------------------------------------------------
def _mixed_dataset(tmp_path) -> tuple[datasets.Dataset, dict]:
    """Rows an Arrow table can hold, with their expected fate: None (encoded) or the stage."""
    good = png_bytes(photo())
    img = lambda b: {"bytes": b, "path": None}  # noqa: E731
    rows = [
        (user_row([img(good)]), None),
        (user_row([img(b"not an image")]), "image"),
        (user_row([img(jpeg_bytes(photo(50, 30)))]), None),
        (user_row([{"bytes": None, "path": str(tmp_path / "missing.png")}]), "image"),
        (user_row([img(good)], placeholders=2), "template"),
        ({"messages": [], "images": []}, "parse"),
        (user_row([img(png_bytes(photo(1, 300)))]), "image"),
        (user_row([img(good)], text="long " * 120), "too_long"),
        (user_row([img(good), img(good)]), None),
        (user_row([img(exif_jpeg(8))]), None),
    ]
    feats = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image(decode=False)),
    })
    for r, _ in rows:
        for m in r["messages"]:
            m["content"] = [{"type": i["type"], "text": i.get("text")} for i in m["content"]]
    ds = datasets.Dataset.from_list([r for r, _ in rows], features=feats)
    return ds, {i: fate for i, (_, fate) in enumerate(rows)}


OPTS = {"on_error": "skip", "max_length": 200, "truncation": "drop"}


def test_encode_dataset_records_every_failed_row(tmp_path):
    proc = processor_for("qwen2_vl")
    ds, fate = _mixed_dataset(tmp_path)
    enc, report = mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=3, **OPTS)
    failed = {i: s for i, s in fate.items() if s not in (None, "too_long")}
    assert {e["row"]: e["stage"] for e in report.errors} == failed
    assert report.dropped == {"too_long": 1}
    assert report.rows_in == report.rows_out + len(report.errors) + sum(report.dropped.values()) == len(ds)
    assert report.failed == {"image": 3, "template": 1, "parse": 1}
    assert str(report) == "encoded 4 of 10 rows; dropped: too_long: 1; failed: image: 3, parse: 1, template: 1"
    for e in report.errors:
        assert e["reason"].startswith(f"row {e['row']}") and e["column"] in ("images", "messages")
    assert ERROR_COLUMN not in enc.column_names and len(enc) == 4
    # the survivors are exactly the good rows, encoded as alone
    ok = [i for i, s in fate.items() if s is None]
    for j, i in enumerate(ok):
        alone = mmpipe.encode_row(ds[i], proc, idx=i)
        assert enc[j]["input_ids"] == alone.input_ids.tolist()
    batch = mmpipe.Collator(proc)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
    assert batch.image_grid_thw.shape[0] == 5


@pytest.mark.parametrize("batched", [True, False])
def test_plain_map_keeps_failed_rows_visible(batched, tmp_path):
    proc = processor_for("qwen2_vl")
    ds, fate = _mixed_dataset(tmp_path)
    opts = {"on_error": "skip"}
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, **opts}, batched=batched, with_indices=True,
                 remove_columns=ds.column_names)
    assert len(out) == len(ds)  # nothing vanished
    errs = [json.loads(x) if x else None for x in out[ERROR_COLUMN]]
    want = {i: s for i, s in fate.items() if s not in (None, "too_long")}
    assert {i: e["stage"] for i, e in enumerate(errs) if e} == want
    assert all(e["row"] == i for i, e in enumerate(errs) if e)
    with pytest.raises(InputError, match="failed to encode.*mmpipe.drop_failed"):
        mmpipe.Collator(proc)([out[i] for i in range(len(out))])
    with pytest.raises(InputError, match="failed to encode"):  # the Arrow route checks too
        mmpipe.Collator(proc)(mmpipe.ArrowRows(out).__getitems__(range(len(out))))
    clean, errors = mmpipe.drop_failed(out)
    assert [e["row"] for e in errors] == sorted(want) and len(clean) == len(ds) - len(want)
    assert ERROR_COLUMN not in clean.column_names
    mmpipe.Collator(proc)(mmpipe.ArrowRows(clean).__getitems__(range(len(clean))))


def test_on_error_raise_is_the_default(tmp_path):
    proc = processor_for("qwen2_vl")
    ds, _ = _mixed_dataset(tmp_path)
    with pytest.raises(ImageError, match=r"row 1, image 0: cannot read the image"):
        ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, with_indices=True)
    with pytest.raises(ValueError, match="on_error must be one of"):
        mmpipe.Encoder(proc, on_error="ignore")


def test_error_records_survive_pickling_and_unexpected_errors_are_wrapped():
    e = ImageError("cannot read", row=3, column="images", image=1, expected="PNG", found="junk", fix="re-export")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is ImageError and str(e2) == str(e) and e2.record() == e.record()
    assert str(e).startswith("row 3, image 1: cannot read; expected PNG; found junk - re-export")
    w = as_input_error(RuntimeError("boom"), 5)
    assert w.stage == "encode" and w.row == 5 and "RuntimeError while encoding: boom" in str(w)
    p = ParseError("x", where="row (index unknown: pass with_indices=True to map)").locate(row=9)
    assert str(p).startswith("row 9: x")


def test_stats_count_failures_in_process():
    proc = processor_for("qwen2_vl")
    enc = mmpipe.Encoder(proc, on_error="skip")
    batch = {"messages": [[], [{"role": "user", "content": "hi"}]], "images": [[], []]}
    out = enc(batch, [0, 1])
    assert enc.stats.failed == {"parse": 1} and enc.stats.encoded == 1 and enc.stats.rows == 2
    assert out[ERROR_COLUMN][1] == "" and json.loads(out[ERROR_COLUMN][0])["stage"] == "parse"
    assert len(out["input_ids"][0]) == 0 and len(out["input_ids"][1]) > 0


# ---- memory: far above max_pixels, bounded by the decoded image ------------------------
MEMORY_PROBE = """
import resource, sys
import mmpipe
from mmpipe.testing import build_processor
proc = build_processor("qwen2_vl")
row = lambda p: {"messages": [{"role": "user", "content": [{"type": "image"}]}], "images": [p]}
mmpipe.encode_row(row(sys.argv[1]), proc, idx=0)  # imports and tables first, on a small image
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = mmpipe.encode_row(row(sys.argv[2]), proc, idx=0)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024, r.image_grid_thw.tolist())
"""


def test_huge_images_memory_is_bounded(tmp_path):
    """Peak RSS while encoding a 30 MP grayscale and a 12 MP RGB PNG (far above max_pixels:
    64 tokens come out) stays within the decoded image (PIL holds L in 1 byte per pixel, RGB
    in 4) plus a margin: measured 1.04 and 4.25 B/px; the transformers processor takes about
    9-10 B/px on the same files."""
    cases = {"L": (6000, 5000, 1.6), "RGB": (4000, 3000, 5.5)}  # mode: h, w, bytes per pixel allowed
    small = write(tmp_path, "small.png", png_bytes(smooth_gray(60, 50)))
    procs = {}
    for mode, (h, w, _) in cases.items():
        path = write(tmp_path, f"huge_{mode}.png", png_bytes(smooth_gray(h, w).convert(mode), compress_level=1))
        procs[mode] = subprocess.Popen([sys.executable, "-c", MEMORY_PROBE, small, path], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    spec = mmpipe.VisionSpec.from_processor(processor_for("qwen2_vl"))
    for mode, p in procs.items():
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        grown, grid = out.split(maxsplit=1)
        h, w, per_px = cases[mode]
        assert int(grown) < per_px * h * w, f"{mode}: peak RSS grew by {int(grown) / 2**20:.0f} MiB"
        t, gh, gw = json.loads(grid)[0]
        assert gh * gw * 14 * 14 <= spec.max_pixels


def test_family_mismatch_on_the_arrow_route(tmp_path):
    """An encoded dataset (qwen2_vl) collated with another family's processor, as the
    DataLoader does it (ArrowRows), fails with the row and both families named."""
    ds = datasets.Dataset.from_list([user_row([png_bytes(photo(30 + i, 40, seed=i))]) for i in range(3)])
    enc, _ = mmpipe.encode_dataset(ds, processor_for("qwen2_vl"))
    for other in ("qwen2_5_vl", "qwen3_vl"):
        with pytest.raises(mmpipe.errors.FamilyMismatchError, match=f"row 0: encoded for model family 'qwen2_vl' "
                                                                  f"but this batch is for '{other}'"):
            mmpipe.Collator(processor_for(other))(mmpipe.ArrowRows(enc).__getitems__([0, 1, 2]))


@pytest.mark.parametrize("orientation", [None, 6])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_layout_route_reads_headers_only(fmt, orientation):
    """pixels='none' never decodes pixel data, EXIF orientation included (a PNG's getexif()
    would decode the whole image to look for a late eXIf chunk)."""
    import io

    proc = processor_for("qwen2_vl")
    buf = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    photo(40, 64).save(buf, fmt, **({"exif": exif.tobytes()} if orientation else {}))
    img = Image.open(io.BytesIO(buf.getvalue()))
    row = mmpipe.encode_row(user_row([img]), proc, idx=0, pixels="none")
    assert getattr(img, "_im", None) is None  # PIL's decoded core image: never created
    full = mmpipe.encode_row(user_row([buf.getvalue()]), proc, idx=0)
    np.testing.assert_array_equal(row.image_grid_thw, full.image_grid_thw)
    upright_tall = full.image_grid_thw[0, 1] > full.image_grid_thw[0, 2]
    assert upright_tall == (orientation == 6)


def test_encode_dataset_reads_image_columns_undecoded(tmp_path):
    """A corrupt image in a ``Sequence(Image())`` column would crash inside ``datasets``
    (it decodes before mmpipe sees the row); encode_dataset reads the bytes undecoded, so
    the row is recorded, the others equal the decoded route, and selections/num_proc hold."""
    proc = processor_for("qwen2_vl")
    ds, fate = _mixed_dataset(tmp_path)
    ds = ds.cast_column("images", datasets.Sequence(datasets.Image()))  # decode=True, as on the Hub
    assert ds.features["images"].feature.decode
    sub = ds.select([9, 1, 0, 8])  # an indices mapping: rows 9 (EXIF), 1 (corrupt), 0, 8
    enc, report = mmpipe.encode_dataset(sub, proc, num_proc=2, batch_size=2, **OPTS)
    assert [(e["row"], e["stage"]) for e in report.errors] == [(1, "image")]  # index within `sub`
    assert len(enc) == 3 and ds.features["images"].feature.decode  # the caller's dataset is untouched
    for j, i in enumerate([9, 0, 8]):
        decoded = {**ds[i], "images": ds[i]["images"]}  # PIL images decoded by datasets (EXIF applied)
        ref = mmpipe.encode_row(decoded, proc, idx=i)
        assert enc[j]["input_ids"] == ref.input_ids.tolist()
        assert enc[j]["pixel_values_u8"] == ref.to_dict()["pixel_values_u8"]
