"""The generic path wired in (issue 20.1): mmpipe.encode / encode_row / encode_dataset / collate /
Collator take a processor of a family mmpipe has no table for through its own chat template and
call, store its outputs with their Arrow types, and collate the stored rows (dicts and Arrow)
back to the rows encode gave."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.batching.collate import collate
from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding import call_labels as labels_module
from mmpipe.media import processor_encode as generic_module
from mmpipe.media.processor_encode import generic_log_line
from mmpipe.errors import ArgumentError, InputError
from mmpipe.offline import tiny_image
from mmpipe.offline.other_vlms import FOREIGN_PROCESSORS, build_foreign_model, build_foreign_processor
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.testing import invariants

from helpers import generic_chat_rows as chat_rows


def collate_generic(rows, **kw):  # the one collate; the generic path's old default: right padding
    return collate(rows, **{"padding_side": "right", **kw})


# the offline processors mmpipe.encode takes through the generic path (native and tiled families excluded)
GENERIC_NAMES = [n for n in FOREIGN_PROCESSORS if mmpipe.families.takes_generic_path(build_foreign_processor(n))]


@pytest.fixture(scope="module")
def idefics3():
    return build_foreign_processor("idefics3")


@pytest.fixture(scope="module")
def mapped(idefics3):
    """Rows without images first, one row per writer batch: the Arrow schema must come from
    the layout, not from the first row's values."""
    raw = chat_rows([0, 0, 2, 1, 3])
    ds = datasets.Dataset.from_list(raw)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": idefics3}, remove_columns=["messages", "images"],
                 writer_batch_size=1)
    return raw, enc


def test_one_log_line_per_processor_class(monkeypatch, caplog, idefics3):
    monkeypatch.setattr(generic_module, "LOGGED_CLASSES", set())
    with caplog.at_level(logging.INFO, logger="mmpipe"):
        for _ in range(3):
            mmpipe.encode_row(chat_rows([1])[0], idefics3)
        mmpipe.Collator(idefics3)
    lines = [r.getMessage() for r in caplog.records if "generic path" in r.getMessage()]
    assert lines == [generic_log_line("Idefics3Processor")]
    for lacks in ("compact uint8 storage", "layout-only encoding", "packing", "1-D"):
        assert lacks in lines[0]


def test_encode_row_is_the_generic_encoder(idefics3):
    raw = chat_rows([2])[0]
    row = mmpipe.encode_row(raw, idefics3, idx=7)
    assert isinstance(row, MultiModalInputs) and row.processor_class == "Idefics3Processor"
    assert row.equals(Encoder(idefics3, family="generic", log=lambda _: None).encode_row(raw, 7))
    text = idefics3.apply_chat_template(raw["messages"], tokenize=False)
    direct = idefics3(text=[text], images=raw["images"], return_tensors="np")
    assert np.array_equal(row.input_ids, direct["input_ids"][0])
    for key in ("pixel_values", "pixel_attention_mask"):
        assert row.vision[key].dtype == direct[key].dtype and np.array_equal(row.vision[key], direct[key])


def test_labels_are_the_assistant_replies():
    """Multi-turn, images in both user turns (Gemma 3 expands each into 4 soft tokens plus
    markers and newlines): exactly the replies and their end-of-turn token are labelled."""
    proc = build_foreign_processor("gemma3")  # a tiled family: the generic path taken explicitly
    a, b = tiny_image(40, 56), tiny_image(70, 30)
    raw = {"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "first?"}]},
        {"role": "assistant", "content": "one dog"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image"}]},
        {"role": "assistant", "content": "two cats"}], "images": [a, b]}
    row = Encoder(proc, family="generic", log=lambda _: None).encode_row(raw)
    tok = proc.tokenizer
    labelled = row.labels != -100
    assert np.array_equal(row.labels[labelled], row.input_ids[labelled])
    assert tok.decode(row.input_ids[labelled]) == "one dog<|im_end|>two cats<|im_end|>"
    assert "token_type_ids" in row.sequence and int(row.sequence["token_type_ids"].sum()) == 8  # 2 images x 4
    assert Encoder(proc, family="generic", log=lambda _: None, labels=False).encode_row(raw).labels is None


@pytest.mark.parametrize("name", ["gemma3", "llava", "idefics3"])
def test_labels_without_processor_calls_equal_the_processor_prefixes(monkeypatch, name):
    """The shortcut (the text after a reply tokenized alone) labels what running the processor
    on each conversation prefix labels."""
    proc = build_foreign_processor(name)
    raw = chat_rows([1, 0, 2])
    raw.append({"messages": raw[2]["messages"] + [{"role": "user", "content": [{"type": "text", "text": "more"}]},
                                                  {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
                "images": raw[2]["images"]})
    fast = [Encoder(proc, family="generic", log=lambda _: None).encode_row(r).labels for r in raw]
    monkeypatch.setattr(labels_module, "suffix_cut", lambda *a: None)
    slow = [Encoder(proc, family="generic", log=lambda _: None).encode_row(r).labels for r in raw]
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    assert all((a != -100).sum() > 2 for a in fast)


def test_stored_arrow_types(mapped):
    _, enc = mapped
    f = enc.features
    assert f["input_ids"].feature.dtype == "int32" and f["labels"].feature.dtype == "int32"
    assert f["attention_mask"].feature.dtype == "int8"
    assert f["pixel_values"].feature.dtype == "float32"  # flat, the processor's float32
    assert f["pixel_attention_mask"].feature.dtype == "int64"  # the processor's own dtype
    assert f["generic_shapes"].feature.feature.dtype == "int64"
    tiles = [s[0][1] if s[0][0] else 0 for s in enc["generic_shapes"]]  # pixel_attention_mask [1, tiles, H, W]
    assert tiles[:2] == [0, 0] and len(set(tiles[2:])) > 1  # ragged tiles, rows without images first
    assert set(enc["family"]) == {"generic"} and len(set(enc["generic_layout"])) == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_stored_rows_collate_back(mapped, idefics3, side):
    """Collator(p) on datasets rows, on ArrowRows' Arrow table and collate(processor=) all give
    collate_generic of the rows encode_row gives; unbatch gives those rows back."""
    raw, enc = mapped
    want = [mmpipe.encode_row(r, idefics3, idx=i) for i, r in enumerate(raw)]
    idx = [0, 2, 1, 4, 3]
    collator = mmpipe.Collator(idefics3, padding_side=side, keep_columns=["id"])
    for batch in (collator(enc.__getitems__(idx)), collator(mmpipe.ArrowRows(enc).__getitems__(idx)),
                  mmpipe.collate([enc[i] for i in idx], processor=idefics3, padding_side=side)):
        assert isinstance(batch, BatchedMultiModalInputs)
        expect = collate_generic([want[i] for i in idx], pad_token_id=idefics3.tokenizer.pad_token_id,
                                 padding_side=side)
        for name in ("input_ids", "attention_mask", "position_ids", "labels"):
            assert np.array_equal(getattr(batch, name), getattr(expect, name)), name
        assert batch.vision.keys() == expect.vision.keys()
        assert all(np.array_equal(batch.vision[k], expect.vision[k]) for k in batch.vision)
        invariants.assert_roundtrip([want[i] for i in idx], batch)
    for fmt in ("numpy", "torch"):  # formatted datasets rows
        invariants.assert_roundtrip([want[i] for i in idx], collator([enc.with_format(fmt)[i] for i in idx]))
    assert collator(enc.__getitems__(idx)).columns == {"id": [f"r{i}" for i in idx]}
    invariants.assert_roundtrip([enc[i] for i in idx], padding_side=side)


def test_batched_map_and_encode_dataset_report(idefics3):
    raw = chat_rows([1, 0, 2, 1])
    raw[2]["images"] = raw[2]["images"][:1]  # one image item too many: fails to parse
    ds = datasets.Dataset.from_list(raw)
    out, report = mmpipe.encode_dataset(ds, idefics3, on_error="skip", max_length=60, truncation="drop",
                                        keep_columns=["id"])
    lengths = [len(mmpipe.encode_row(r, idefics3)) for i, r in enumerate(raw) if i != 2]
    kept = [i for i, n in zip([0, 1, 3], lengths) if n <= 60]
    assert report.rows_in == 4 and [e["row"] for e in report.errors] == [2]
    assert report.rows_out == len(kept) == len(out) and report.dropped.get("too_long", 0) == 3 - len(kept)
    assert out["id"] == [f"r{i}" for i in kept]
    batched = ds.select([0, 1, 3]).map(mmpipe.encode, fn_kwargs={"processor": idefics3}, batched=True,
                                        batch_size=2, remove_columns=ds.column_names)
    per_row = ds.select([0, 1, 3]).map(mmpipe.encode, fn_kwargs={"processor": idefics3},
                                        remove_columns=ds.column_names)
    invariants.assert_rows_equal(list(batched), list(per_row))
    kw = mmpipe.map_kwargs(idefics3, ds)
    assert 1 <= kw["writer_batch_size"] <= 1000


@pytest.mark.parametrize("option, value", [("pixels", "uint8"), ("pixels", "none"), ("truncation", "truncate_text"),
                                           ("max_pixels", 1 << 20)])
def test_options_without_meaning_are_refused(idefics3, option, value):
    with pytest.raises(ArgumentError, match="Idefics3Processor.*generic path"):
        mmpipe.encode_row(chat_rows([1])[0], idefics3, **{option: value})


def test_packing_is_refused(idefics3, mapped):
    _, enc = mapped
    with pytest.raises(ArgumentError, match="packing is not available for Idefics3Processor"):
        mmpipe.PackingCollator(idefics3)
    with pytest.raises(ArgumentError, match="packing is not available for Idefics3Processor"):
        mmpipe.pack([enc[0], enc[2]])


def test_mixed_and_failed_rows_are_refused(idefics3, mapped):
    _, enc = mapped
    native = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]},
                               mmpipe.testing.build_processor("qwen2_vl")).to_dict()
    with pytest.raises(InputError, match="natively encoded row"):
        mmpipe.collate([enc[0], native])
    with pytest.raises(InputError, match="encoded by Idefics3Processor"):
        mmpipe.collate([enc[0]], processor=build_foreign_processor("gemma3"))
    with pytest.raises(InputError, match="failed to encode"):
        mmpipe.collate([enc[0], dict(enc[1], mmpipe_error='{"row": 1}')])


@pytest.mark.parametrize("name", ["idefics3", "gemma3", "llava"])
def test_model_inputs_are_what_forward_takes(name):
    proc = build_foreign_processor(name)
    batch = mmpipe.Collator(proc)([mmpipe.encode_row(r, proc) for r in chat_rows([1, 2])])
    params = inspect.signature(build_foreign_model(name).forward).parameters
    kw = batch.model_inputs()
    assert set(kw) <= set(params) and {"input_ids", "attention_mask", "position_ids", "pixel_values", "labels"} <= set(kw)
    assert "position_ids" not in batch.model_inputs(positions="none")


@pytest.mark.parametrize("name", GENERIC_NAMES)
def test_every_offline_processor_stores_and_collates_back(name):
    """Stored rows of each unlisted processor (image_sizes, token_type_ids, mm_token_type_ids,
    image_grid_thw, ragged patches) come back from Arrow through Collator and unbatch equal."""
    proc = build_foreign_processor(name)
    raw = chat_rows([1, 0, 2])
    ds = datasets.Dataset.from_list(raw)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    want = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raw)]
    batch = mmpipe.Collator(proc, padding_side="right")(mmpipe.ArrowRows(enc).__getitems__([0, 1, 2]))
    invariants.assert_roundtrip(want, batch)
    assert invariants.as_rows(list(enc))[2].vision.keys() == want[2].vision.keys()


def test_readme_model_families_block_runs_as_written(caplog, monkeypatch):
    """The README's "Model families" block runs as written on a raw dataset (the batch's logits
    equal each row's own) and its log line is the one the encoder logs."""
    from helpers import readme_block

    monkeypatch.setattr(generic_module, "LOGGED_CLASSES", set())
    ds = datasets.Dataset.from_list(chat_rows([1, 0, 2]))
    ns = {"ds": ds}
    with caplog.at_level(logging.INFO, logger="mmpipe"):
        exec(compile(readme_block("**The generic path.**"), "README.md", "exec"), ns)
    readme = Path(__file__).resolve().parents[2].joinpath("docs", "concepts", "families.md").read_text()
    assert generic_log_line("LlavaProcessor") in readme
    assert [r.getMessage() for r in caplog.records if "generic path" in r.getMessage()] == \
        [generic_log_line("LlavaProcessor")]
    batch, out, rows = ns["batch"], ns["out"], ns["rows"]
    assert set(batch.model_inputs()) == {"input_ids", "attention_mask", "position_ids", "pixel_values", "labels"}
    assert out.logits.shape[:2] == tuple(batch.input_ids.shape)
    invariants.assert_rows_equal(rows, [mmpipe.encode_row(r, ns["processor"]) for r in ns["ds"]])
