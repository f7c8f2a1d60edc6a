"""encode: raw rows of every accepted format -> MultiModalInputs equal to transformers'."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import mmpipe
from mmpipe import testing
from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.mapping import prefetch_images as _prefetched
from mmpipe.testing.invariants import assert_roundtrip

from conftest import processor_for
from helpers import assistant_texts, processor_reference, image_chat as _chat
from strategies import raw_rows


def test_matches_processor_on_real_photos(processor, photos):
    msgs = _chat(len(photos), answer="Three pictures.")
    row = mmpipe.encode_row({"messages": msgs, "images": photos}, processor)
    ref = processor_reference(processor, msgs, photos)
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
    np.testing.assert_array_equal(row.mm_token_type_ids, ref["mm_token_type_ids"][0])
    np.testing.assert_array_equal(row.image_grid_thw, ref["image_grid_thw"])
    batch = mmpipe.collate([row], processor=processor)
    # compact uint8 storage -> float32 at collate time, bit-identical to the processor
    np.testing.assert_array_equal(batch.pixel_values.numpy(), ref["pixel_values"])
    assert row.pixel_values_u8.nbytes * 8 == ref["pixel_values"].nbytes


def test_float32_storage_equals_processor(processor, photos):
    msgs = _chat(2)
    row = mmpipe.encode_row({"messages": msgs, "images": photos[:2]}, processor, pixels="float32")
    ref = processor_reference(processor, msgs, photos[:2])
    assert row.pixel_format == "float32"
    np.testing.assert_array_equal(row.pixel_values, ref["pixel_values"])


def test_layout_only_path_matches_full_path(processor, photos, tmp_path):
    # from paths: the layout path reads headers only
    paths = []
    for i, im in enumerate(photos):
        p = tmp_path / f"{i}.png"
        im.save(p)
        paths.append(str(p))
    msgs = _chat(len(paths), answer="ok")
    full = mmpipe.encode_row({"messages": msgs, "images": paths}, processor)
    lay = mmpipe.encode_row({"messages": msgs, "images": paths}, processor, pixels="none")
    assert lay.pixel_format == "none"
    assert lay.pixel_values_u8 is None and lay.pixel_values is None
    for f in ("input_ids", "image_grid_thw", "position_ids", "mm_token_type_ids", "labels"):
        np.testing.assert_array_equal(getattr(lay, f), getattr(full, f))
    assert lay.rope_delta == full.rope_delta


def test_image_value_kinds_give_the_same_row(photos, tmp_path):
    proc = processor_for("qwen2_vl")
    im = photos[1]
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    path = tmp_path / "x.png"
    path.write_bytes(buf.getvalue())
    kinds = [im, np.asarray(im), buf.getvalue(), str(path), {"bytes": buf.getvalue(), "path": None},
             {"bytes": None, "path": str(path)}]
    rows = [mmpipe.encode_row({"messages": _chat(1), "images": [k]}, proc) for k in kinds]
    for r in rows[1:]:
        assert r == rows[0], r.diff(rows[0])


def test_three_row_formats_agree(photos):
    proc = processor_for("qwen2_vl")
    hub = {"messages": _chat(2), "images": photos[:2]}
    inline = {"messages": [{"role": "user", "content": [
        {"type": "image", "image": photos[0]}, {"type": "text", "text": " picture 0."},
        {"type": "image", "image": photos[1]}, {"type": "text", "text": " picture 1."},
        {"type": "text", "text": "Describe them."}]}]}
    verl = {"prompt": "<image> picture 0.<image> picture 1.Describe them.", "images": photos[:2]}
    verl_chat = {"prompt": [{"role": "user", "content": "<image> picture 0.<image> picture 1.Describe them."}],
                 "images": photos[:2]}
    rows = [mmpipe.encode_row(r, proc) for r in (hub, inline, verl, verl_chat)]
    for r in rows[1:]:
        assert r == rows[0], r.diff(rows[0])


def test_zero_images_and_text_family():
    proc = processor_for("qwen3_vl")
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hello there"}]}, proc)
    assert row.num_images == 0 and row.pixel_values_u8.shape == (0, 3 * 16 * 16)
    np.testing.assert_array_equal(row.position_ids, np.tile(np.arange(row.num_tokens), (3, 1)))
    tok = testing.build_tokenizer("qwen2_vl")
    trow = mmpipe.encode_row({"messages": [{"role": "user", "content": "hello"}]}, tok)
    assert trow.family == "text" and trow.rope_delta == 0
    with pytest.raises(ValueError, match="text-only tokenizer"):
        mmpipe.encode_row({"messages": _chat(1), "images": [np.zeros((30, 30, 3), np.uint8)]}, tok)


def test_generation_prompt_on_off():
    proc = processor_for("qwen2_vl")
    msgs = [{"role": "user", "content": "hi"}]
    on = mmpipe.encode_row({"messages": msgs}, proc)
    off = mmpipe.encode_row({"messages": msgs}, proc, add_generation_prompt=False)
    tail = proc.tokenizer.decode(on.input_ids[off.num_tokens:])
    assert tail == "<|im_start|>assistant\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_rows(max_turns=3, max_images=2))
def test_random_rows_match_processor_and_labels_cover_answers(raw):
    proc = processor_for("qwen2_vl")
    row = mmpipe.encode_row(raw, proc)
    ref = processor_reference(proc, raw["messages"], raw["images"])
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
    if raw["images"]:
        np.testing.assert_array_equal(row.image_grid_thw, ref["image_grid_thw"])
    # labels: exactly the assistant answers, each followed by <|im_end|>
    tok = proc.tokenizer
    lab = row.labels
    spans, cur = [], []
    for i, v in enumerate(lab):
        if v != -100:
            cur.append(int(v))
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    assert [tok.decode(s) for s in spans] == [t + "<|im_end|>" for t in assistant_texts(raw["messages"])]
    assert (row.labels[row.mm_token_type_ids > 0] == -100).all()


def test_placeholder_count_mismatch_names_the_row(photos):
    proc = processor_for("qwen2_vl")
    with pytest.raises(ValueError, match=r"row 7: column 'images' holds 2 image\(s\) but the messages hold 1"):
        mmpipe.encode({"messages": _chat(1), "images": photos[:2]}, 7, processor=proc)
    with pytest.raises(ValueError, match="row 3: the messages hold more image placeholders"):
        mmpipe.encode({"messages": _chat(2), "images": photos[:1]}, 3, processor=proc)


class TestTruncation:
    def setup_method(self):
        self.proc = processor_for("qwen2_vl")
        self.imgs = [testing.tiny_image(56, 56, seed=1), testing.tiny_image(56, 84, seed=2)]
        self.raw = {"messages": _chat(2, answer="a fairly long answer " * 5), "images": self.imgs}
        self.full = mmpipe.encode_row(self.raw, self.proc)

    def test_raise(self):
        with pytest.raises(ValueError, match="exceed max_length"):
            mmpipe.encode_row(self.raw, self.proc, max_length=self.full.num_tokens - 1)

    def test_truncate_text_never_cuts_an_image(self):
        cap = self.full.num_tokens - 5
        row = mmpipe.encode_row(self.raw, self.proc, max_length=cap, truncation="truncate_text")
        assert row.num_tokens == cap and row.num_images == 2
        row.validate()  # image tokens == sum(t*h*w)/merge^2
        np.testing.assert_array_equal(row.input_ids, self.full.input_ids[:cap])
        np.testing.assert_array_equal(row.position_ids, self.full.position_ids[:, :cap])
        last_img = int(np.flatnonzero(self.full.mm_token_type_ids)[-1])
        with pytest.raises(ValueError, match="would cut into an image"):
            mmpipe.encode_row(self.raw, self.proc, max_length=last_img, truncation="truncate_text")

    def test_drop_in_batched_map(self):
        import datasets

        short = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "images": []}
        ds = datasets.Dataset.from_list([self.raw, short, self.raw])
        enc = ds.map(mmpipe.encode, fn_kwargs={"processor": self.proc, "max_length": 40, "truncation": "drop"},
                     batched=True)
        assert len(enc) == 1
        assert enc[0]["messages"][0]["content"][0]["text"] == "hi"
        with pytest.raises(ValueError, match="batched=True"):
            mmpipe.encode(self.raw, 0, processor=self.proc, max_length=40, truncation="drop")

    def test_encoder_counts_drops(self):
        enc = Encoder(self.proc, max_length=40, truncation="drop")
        out = enc({"messages": [self.raw["messages"]] * 2, "images": [self.imgs] * 2})
        assert out["input_ids"] == [] and enc.stats.dropped["too_long"] == 2


def test_layout_only_reads_headers_not_pixels(photos, tmp_path, monkeypatch):
    """The layout path reads a whole JPEG's header and last bytes, never its pixels (same
    ids/grids as the full path); a JPEG whose header is intact but whose data is cut off is
    refused as the full path refuses it (a length filter must not keep a row training fails on;
    `tests/images/test_hunt_layout_cuts_images.py` sweeps every format)."""
    from PIL import ImageFile

    proc = processor_for("qwen2_vl")
    good = io.BytesIO()
    photos[1].save(good, format="JPEG", quality=90)
    data = good.getvalue()
    cut = data[: len(data) // 3]
    msgs = _chat(1)
    full = mmpipe.encode_row({"messages": msgs, "images": [data]}, proc)
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(1) or real(self))
    lay = mmpipe.encode_row({"messages": msgs, "images": [{"bytes": data, "path": None}]}, proc, pixels="none")
    assert not loads  # no pixel decoded
    np.testing.assert_array_equal(lay.input_ids, full.input_ids)
    np.testing.assert_array_equal(lay.image_grid_thw, full.image_grid_thw)
    for pixels in ("uint8", "none"):
        with pytest.raises(ValueError, match="row 5, image 0: cannot read the image"):
            mmpipe.encode({"messages": msgs, "images": [cut]}, 5, processor=proc, pixels=pixels)


def test_encode_dataset_counts_drops_across_processes():
    import datasets

    proc = processor_for("qwen2_vl")
    long = {"messages": _chat(2, answer="long " * 30), "images": [testing.tiny_image(56, 56), testing.tiny_image(56, 84)]}
    short = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "images": []}
    ds = datasets.Dataset.from_list([long, short, short, long, long, short])
    enc, report = mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=2, max_length=40, truncation="drop")
    assert report.dropped == {"too_long": 3} and report.rows_in == 6 and report.rows_out == 3 == len(enc)
    assert "mmpipe_drop_reason" not in enc.column_names
    assert str(report) == "encoded 3 of 6 rows; dropped: too_long: 3"
    again, report2 = mmpipe.encode_dataset(ds, proc, max_length=4096)
    assert report2.dropped == {} and len(again) == 6


def test_encode_dataset_keeps_pass_through_columns_row_for_row():
    """keep_columns survive dropped and failed rows (num_proc=2) and collate carries them."""
    import datasets

    proc = processor_for("qwen2_vl")
    long = {"messages": _chat(2, answer="long " * 30), "images": [testing.tiny_image(56, 56), testing.tiny_image(56, 84)]}
    short = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "images": []}
    rows = [dict(r, id=i, data_source="toy", extra_info={"index": i}) for i, r in enumerate([long, short, short, long, short])]
    rows[2]["messages"] = []  # fails to encode: skipped and reported
    ds = datasets.Dataset.from_list(rows)
    enc, report = mmpipe.encode_dataset(ds, proc, num_proc=2, batch_size=2, max_length=40, truncation="drop",
                                        on_error="skip", keep_columns=["id", "extra_info"])
    assert report.rows_out == 2 and len(report.errors) == 1 and report.dropped == {"too_long": 2}
    assert enc["id"] == [1, 4] and enc["extra_info"] == [{"index": 1}, {"index": 4}]
    assert "data_source" not in enc.column_names and "messages" not in enc.column_names
    batch = mmpipe.Collator(proc, keep_columns=["id", "extra_info"])(list(enc))
    assert batch.columns == {"id": [1, 4], "extra_info": [{"index": 1}, {"index": 4}]}
    assert_roundtrip([mmpipe.MultiModalInputs.from_dict(r) for r in enc], batch=batch)
    with pytest.raises(mmpipe.errors.ArgumentError, match="not columns of the dataset"):
        mmpipe.encode_dataset(ds, proc, keep_columns=["uid"])
    with pytest.raises(mmpipe.errors.ArgumentError, match="encoded columns"):
        mmpipe.encode_dataset(ds.rename_column("id", "input_ids"), proc, keep_columns=["input_ids"])


def test_batched_call_prefetches_images_and_equals_rows_one_by_one(photos):
    """A batched call starts the next rows' images on the image threads; rows, errors and
    their order are those of encoding the rows one by one. A corrupt image mid-batch fails
    its own row only (on_error="skip"), and an image object shared by two rows is never
    loaded by two threads at once."""
    from PIL import Image

    proc = processor_for("qwen2_vl")
    shared = Image.open(io.BytesIO(_png_bytes(photos[1])))  # lazily decoded, in two rows
    images = [[photos[0]], [shared], [photos[2], shared], [b"not an image"], [photos[1]], [], [photos[0]]]
    rows = [{"messages": _chat(len(im), answer=f"Answer {i}."), "images": im} for i, im in enumerate(images)]
    batch = {"messages": [r["messages"] for r in rows], "images": [r["images"] for r in rows]}
    idx = list(range(10, 10 + len(rows)))
    enc = Encoder(proc, threads=2, on_error="skip")
    got = enc(batch, idx)
    one = Encoder(proc, threads=1, on_error="skip")
    want = [one(r, i) for r, i in zip(rows, idx)]
    assert len(got["input_ids"]) == len(rows)
    for i, w in enumerate(want):
        g = {k: v[i] for k, v in got.items()}
        assert set(g) == set(w)
        for k in w:
            assert np.array_equal(np.asarray(g[k], dtype=object), np.asarray(w[k], dtype=object)), (i, k)
    assert '"row": 13' in got["mmpipe_error"][3] and got["mmpipe_error"][3] == want[3]["mmpipe_error"]
    assert sum(bool(e) for e in got["mmpipe_error"]) == 1
    # which rows were prefetched: all with images but rows 2 and 6, whose image objects rows 1
    # and 0 started (they encode their images themselves, in order)
    examples = [{k: v[i] for k, v in batch.items()} for i in range(len(rows))]
    started = [f is not None for f in _prefetched(enc, examples, idx)]
    assert started == [True, True, False, True, True, False, False]
    # on_error="raise": the first bad row raises, naming it, as one by one
    with pytest.raises(mmpipe.errors.ImageError, match=r"row 13, image 0"):
        Encoder(proc, threads=2)(batch, idx)


def _png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
