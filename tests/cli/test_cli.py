"""``mmpipe encode`` / ``inspect`` / ``demo`` on sample data written to a temporary directory.

The encoded datasets are compared row by row with ``dataset.map(mmpipe.encode)`` over the
same rows built in memory (PIL images, Hub convention), and ``inspect``'s numbers with
counts computed here from the typed records. Commands run both as ``python -m mmpipe.cli.main``
(a real process: exit status, stdout, stderr) and in-process through ``main([...])``.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.cli import demo
from mmpipe.cli.main import main
from mmpipe.cli.encode import REPORT_FILE, load_processor
from mmpipe.testing import build_processor, tiny_image
from mmpipe.testing.invariants import assert_rows_equal

FAMILY = "qwen2_vl"
# (height, width) of the images written to disk; the tiny processor resizes them to 4-64 tokens
SIZES = [(40, 60), (90, 70), (64, 64), (200, 120)]


def _text(t):
    return {"type": "text", "text": t}


IMAGE = {"type": "image", "text": None}


def _png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """Raw rows in three files, plus the same rows in memory with PIL images."""
    root = tmp_path_factory.mktemp("cli")
    (root / "imgs").mkdir()
    imgs = []
    for i, (h, w) in enumerate(SIZES):
        imgs.append(tiny_image(h, w, seed=i))
        imgs[-1].save(root / "imgs" / f"{i}.png")
    inline = tiny_image(50, 50, seed=9)
    uri = "data:image/png;base64," + base64.b64encode(_png_bytes(inline)).decode()
    # jsonl: column images by relative path, inline items (relative path / data URI), text-only
    json_rows = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, _text("Describe it.")]},
                      {"role": "assistant", "content": [_text("A gradient.")]}],
         "images": ["imgs/0.png"]},
        {"messages": [{"role": "user", "content": [_text("Name a prime number.")]},
                      {"role": "assistant", "content": [_text("Seven.")]}],
         "images": []},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "imgs/1.png"}, {"type": "image"},
                                                   _text("Compare them.")]}],
         "images": [str(root / "imgs" / "2.png")]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": uri}, _text("Inline.")]},
                      {"role": "assistant", "content": [_text("Noise and colour.")]}],
         "images": []},
        {"messages": [{"role": "user", "content": [_text("Two turns:"), {"type": "image"}]},
                      {"role": "assistant", "content": [_text("A tall picture.")]},
                      {"role": "user", "content": [_text("And again?"), {"type": "image"}]}],
         "images": ["imgs/3.png", "imgs/0.png"]},
    ]
    jsonl = root / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in json_rows))
    # the same rows in the Hub convention with the decoded images, for the reference encode
    images = [[imgs[0]], [], [imgs[1], imgs[2]], [inline], [imgs[3], imgs[0]]]
    messages = [[{"role": m["role"], "content": [IMAGE if c.get("type") == "image" else c for c in m["content"]]}
                 for m in r["messages"]] for r in json_rows]
    features = datasets.Features({
        "messages": datasets.List({"role": datasets.Value("string"),
                                   "content": datasets.List({"type": datasets.Value("string"),
                                                             "text": datasets.Value("string")})}),
        "images": datasets.List(datasets.Image()),
    })
    raw = datasets.Dataset.from_dict({"messages": messages, "images": images}, features=features)
    parquet = root / "rows.parquet"
    raw.to_parquet(str(parquet))  # images embedded as PNG bytes
    saved = root / "saved"
    raw.save_to_disk(str(saved))
    processor = build_processor(FAMILY)
    reference = raw.map(mmpipe.encode, fn_kwargs={"processor": processor}, with_indices=True,
                        remove_columns=raw.column_names)
    return {"root": root, "jsonl": jsonl, "parquet": parquet, "saved": saved, "raw": raw,
            "reference": reference, "processor": processor}


def _rows(ds) -> list:
    return [mmpipe.MultiModalInputs.from_dict(ds[i], row=i) for i in range(len(ds))]


def _assert_same_rows(out_dir: Path, reference) -> None:
    got = datasets.load_from_disk(str(out_dir))
    assert sorted(got.column_names) == sorted(reference.column_names)
    want = _rows(reference)
    rows = _rows(got)
    assert_rows_equal(rows, want, what="the CLI's encode")


def _cli(*args, timeout=300):  # a hang guard: one call ~10-13 s on 2 cores (imports, a processor)
    return subprocess.run([sys.executable, "-m", "mmpipe.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


# ---- encode ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoded_jsonl(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("enc") / "jsonl"
    run = _cli("encode", sample["jsonl"], "--processor", f"testing:{FAMILY}", "--out", out)
    assert run.returncode == 0, run.stderr
    return out, run


def test_encode_jsonl_as_a_process_equals_dataset_map(sample, encoded_jsonl):
    out, run = encoded_jsonl
    _assert_same_rows(out, sample["reference"])
    assert "encoded 5 of 5 rows; dropped: none" in run.stdout
    assert f"mmpipe inspect {out}" in run.stdout
    assert "mmpipe.encode" in run.stderr and "100%" in run.stderr  # the datasets progress bar
    record = json.loads((out / REPORT_FILE).read_text())
    assert record["rows_in"] == record["rows_out"] == 5 and record["dropped"] == {}
    assert record["family"] == FAMILY and record["input_format"] == "json"
    assert record["input"] == str(sample["jsonl"].resolve())
    assert record["options"]["pixels"] == "uint8"


@pytest.mark.parametrize("source, extra", [("parquet", ["--num-proc", "2"]), ("saved", [])])
def test_encode_parquet_and_saved_dataset_in_process(sample, tmp_path, source, extra, capsys):
    out = tmp_path / "enc"
    rc = main(["encode", str(sample[source]), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet", *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    _assert_same_rows(out, sample["reference"])
    assert json.loads((out / REPORT_FILE).read_text())["input_format"] == source
    assert not list(Path(sample[source]).parent.glob("**/cache-*.arrow")), "intermediate files next to the input"


def test_encode_with_a_saved_processor_directory(sample, tmp_path, capsys):
    proc_dir = tmp_path / "processor"
    sample["processor"].save_pretrained(str(proc_dir))
    loaded = load_processor(str(proc_dir))
    assert mmpipe.family_of(loaded).name == FAMILY
    out = tmp_path / "enc"
    rc = main(["encode", str(sample["jsonl"]), "--processor", str(proc_dir), "--out", str(out), "--quiet",
               "--pixels", "float32", "--no-labels"])
    assert rc == 0, capsys.readouterr().err
    want = sample["raw"].map(mmpipe.encode, fn_kwargs={"processor": sample["processor"], "pixels": "float32",
                                                      "labels": False},
                             with_indices=True, remove_columns=sample["raw"].column_names)
    _assert_same_rows(out, want)
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    patches = sum(r.num_image_patches for r in _rows(want))
    assert stats["pixel_format"] == "float32" and stats["target_tokens"] is None
    assert stats["pixel_bytes"] == stats["float32_pixel_bytes"] == patches * mmpipe.family_of(FAMILY).patch_dim * 4


def test_stock_processor_class_loads_without_a_video_processor(sample, tmp_path, capsys):
    # a checkpoint's files name the stock class; transformers 5 would also build a video
    # processor (torchvision, video_preprocessor_config.json): load it images-only instead
    proc_dir = tmp_path / "stock"
    sample["processor"].save_pretrained(str(proc_dir))
    cfg = json.loads((proc_dir / "processor_config.json").read_text())
    cfg["processor_class"] = "Qwen2VLProcessor"
    (proc_dir / "processor_config.json").write_text(json.dumps(cfg))
    (proc_dir / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    proc = load_processor(str(proc_dir), log=lambda msg: None)
    assert mmpipe.family_of(proc).name == FAMILY
    row = sample["raw"][0]
    assert mmpipe.encode_row(row, proc, idx=0) == mmpipe.encode_row(row, sample["processor"], idx=0)


def test_truncation_drop_is_counted_in_the_report(sample, tmp_path, capsys):
    lengths = sorted(r.num_tokens for r in _rows(sample["reference"]))
    cap = lengths[2]  # the two longest rows (strictly longer) are dropped
    n_drop = sum(n > cap for n in lengths)
    out = tmp_path / "enc"
    rc = main(["encode", str(sample["jsonl"]), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet",
               "--max-length", str(cap), "--truncation", "drop"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert f"encoded {5 - n_drop} of 5 rows; dropped: too_long: {n_drop}" in printed
    got = _rows(datasets.load_from_disk(str(out)))
    assert len(got) == 5 - n_drop and max(r.num_tokens for r in got) <= cap
    rc = main(["inspect", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and f"{5 - n_drop} of 5 rows encoded" in text and f"dropped: too_long: {n_drop}" in text
    # --overwrite replaces a saved dataset
    assert main(["encode", str(sample["jsonl"]), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet",
                 "--overwrite"]) == 0
    _assert_same_rows(out, sample["reference"])


def test_keep_columns_are_saved_next_to_the_encoded_rows(sample, tmp_path, capsys):
    """--keep-columns a,b: the columns verl's reward managers read survive encode, row for row."""
    rows = [dict(json.loads(line), id=f"q{i}", data_source="toy", reward_model={"ground_truth": str(i)})
            for i, line in enumerate(sample["jsonl"].read_text().splitlines())]
    src = sample["root"] / "with_ids.jsonl"  # next to imgs/: the relative image paths resolve
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "enc"
    rc = main(["encode", str(src), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet",
               "--keep-columns", "id, reward_model"])
    assert rc == 0, capsys.readouterr().err
    got = datasets.load_from_disk(str(out))
    assert got["id"] == [f"q{i}" for i in range(5)] and "data_source" not in got.column_names
    assert got["reward_model"] == [{"ground_truth": str(i)} for i in range(5)]
    assert_rows_equal(_rows(got), _rows(sample["reference"]), what="encode with --keep-columns")
    assert json.loads((out / REPORT_FILE).read_text())["keep_columns"] == ["id", "reward_model"]
    rc = main(["encode", str(src), "--processor", f"testing:{FAMILY}", "--out", str(tmp_path / "x"), "--quiet",
               "--keep-columns", "uid"])
    assert rc == 2 and "--keep-columns: keep_columns ['uid'] are not columns" in capsys.readouterr().err


# ---- inspect -----------------------------------------------------------------------------
def _expected_stats(rows: list) -> dict:
    fam = rows[0].fam
    tokens = [r.num_tokens for r in rows]
    per_image = [int(np.prod(g)) // fam.merge_size**2 for r in rows for g in r.image_grid_thw]
    return {
        "rows": len(rows),
        "tokens": sum(tokens),
        "image_tokens": sum(int((r.mm_token_type_ids == 1).sum()) for r in rows),
        "text_tokens": sum(int((r.mm_token_type_ids == 0).sum()) for r in rows),
        "target_tokens": sum(int((r.labels != -100).sum()) for r in rows),
        "images": sum(r.num_images for r in rows),
        "rows_without_images": sum(r.num_images == 0 for r in rows),
        "image_patches": sum(r.num_image_patches for r in rows),
        "pixel_bytes": sum(r.pixel_values_u8.nbytes for r in rows),
        "float32_pixel_bytes": sum(r.num_image_patches * fam.patch_dim * 4 for r in rows),
        "tokens_per_row": tokens,
        "images_per_row": [r.num_images for r in rows],
        "tokens_per_image": per_image,
    }


def test_inspect_json_numbers_match_the_rows(sample, encoded_jsonl):
    out, _ = encoded_jsonl
    run = _cli("inspect", out, "--json")
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout)
    want = _expected_stats(_rows(datasets.load_from_disk(str(out))))
    assert want["images"] == 6 and want["rows_without_images"] == 1 and want["pixel_bytes"] > 0
    assert sum(want["tokens_per_image"]) == want["image_tokens"]
    for key in ("rows", "tokens", "image_tokens", "text_tokens", "target_tokens", "images", "rows_without_images",
                "image_patches", "pixel_bytes", "float32_pixel_bytes"):
        assert stats[key] == want[key], key
    assert stats["families"] == {FAMILY: 5} and stats["pixel_format"] == "uint8"
    assert stats["float32_pixel_bytes"] == 8 * stats["pixel_bytes"]
    for key in ("tokens_per_row", "images_per_row", "tokens_per_image"):
        values = np.asarray(want[key])
        d = stats[key]
        assert (d["count"], d["total"], d["min"], d["max"]) == (len(values), values.sum(), values.min(), values.max())
        assert d["median"] == float(np.median(values)) and d["mean"] == round(float(values.mean()), 3)
        hist = d["histogram"]
        assert sum(b["count"] for b in hist) == len(values)
        for b in hist:  # every bin counts exactly the values inside it
            assert b["count"] == int(((values >= b["lo"]) & (values <= b["hi"])).sum())
    assert stats["images_per_row"]["histogram"] == [{"lo": k, "hi": k, "count": int((np.asarray(want["images_per_row"]) == k).sum())}
                                                    for k in range(3)]
    assert stats["encode_report"]["rows_in"] == 5 and stats["disk_bytes"] > stats["pixel_bytes"]


def test_inspect_text_output(encoded_jsonl, capsys):
    out, _ = encoded_jsonl
    assert main(["inspect", str(out), "--quiet", "--bins", "4"]) == 0
    text = capsys.readouterr().out
    stats = _expected_stats(_rows(datasets.load_from_disk(str(out))))
    assert "rows         5  (1 without images)" in text
    assert f"tokens       {stats['tokens']} = text {stats['text_tokens']} + image {stats['image_tokens']}" in text
    assert f"images       6  ({stats['image_patches']} patches)" in text
    assert f"family       {FAMILY} (5 rows)" in text and "8.0x smaller than float32" in text
    assert "5 of 5 rows encoded" in text and "dropped: none" in text
    for title in ("tokens per row (n=5,", "images per row (n=5,", "tokens per image (n=6,"):
        assert title in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("images per row"))
    bars = {line.split("|")[0].strip(): int(line.split()[-1]) for line in lines[start + 1:start + 4]}
    assert bars == {"0": 1, "1": 2, "2": 2} and "#" in lines[start + 2]
    tok_start = next(i for i, line in enumerate(lines) if line.startswith("tokens per row"))
    assert len([line for line in lines[tok_start + 1:start] if "|" in line]) <= 4  # --bins 4


def test_inspect_without_a_run_record(sample, capsys):
    # a dataset encoded by dataset.map directly: the counts, and no dropped-row claim
    out = sample["root"] / "plain_map"
    sample["reference"].save_to_disk(str(out))
    assert main(["inspect", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "rows         5" in text and "dropped rows unknown" in text


def test_inspect_lists_failed_rows_left_by_a_plain_map(sample, tmp_path, capsys):
    raw = sample["raw"]
    broken = raw.map(lambda r, i: {"images": r["images"][:0] if i == 2 else r["images"]}, with_indices=True)
    out = tmp_path / "skipped"
    broken.map(mmpipe.encode, fn_kwargs={"processor": sample["processor"], "on_error": "skip"}, with_indices=True,
               remove_columns=raw.column_names).save_to_disk(str(out))
    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [e["row"] for e in stats["failed_rows"]] == [2] and stats["rows"] == 5
    assert main(["inspect", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "failed rows  1 row(s) failed to encode and are still in the dataset" in text and "  row 2 (" in text


# ---- failures ----------------------------------------------------------------------------
def test_bad_inputs_fail_with_a_clear_message(sample, tmp_path, capsys):
    cases = [
        (["encode", str(tmp_path / "nope.jsonl"), "--processor", "testing:qwen2_vl", "--out", str(tmp_path / "o")],
         "does not exist"),
        (["encode", str(sample["root"] / "imgs" / "0.png"), "--processor", "testing:qwen2_vl", "--out",
          str(tmp_path / "o")], "unknown file type '.png'"),
        (["encode", str(sample["jsonl"]), "--processor", "testing:llama", "--out", str(tmp_path / "o")],
         "unknown offline processor 'llama'"),
        (["encode", str(sample["jsonl"]), "--processor", str(tmp_path / "no_processor"), "--out", str(tmp_path / "o")],
         "is not a directory"),
        (["encode", str(sample["jsonl"]), "--processor", "testing:qwen2_vl", "--out", str(sample["root"])],
         "exists and is not empty"),
        (["encode", str(sample["jsonl"]), "--processor", "testing:qwen2_vl", "--out", str(sample["root"] / "imgs"),
          "--overwrite"], "refusing to delete another directory"),
        (["inspect", str(sample["saved"])], "is not an mmpipe-encoded dataset"),
        (["inspect", str(tmp_path / "missing")], "is not a directory"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"mmpipe {argv[0]}: ") and message in err, (argv, err)


def test_missing_image_fails_naming_the_row_and_file(sample, tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = sample["jsonl"].read_text().splitlines()
    rows.append(json.dumps({"messages": [{"role": "user", "content": [{"type": "image"}, _text("x")]}],
                            "images": ["imgs/missing.png"]}))
    bad.write_text("\n".join(rows) + "\n")
    for name in ("imgs",):  # relative paths resolve against the file's directory
        (tmp_path / name).symlink_to(sample["root"] / name)
    run = _cli("encode", bad, "--processor", f"testing:{FAMILY}", "--out", tmp_path / "out", "--quiet")
    assert run.returncode == 1
    assert "row 5, image 0" in run.stderr and "imgs/missing.png" in run.stderr
    assert str(tmp_path) in run.stderr  # says where it looked
    assert not (tmp_path / "out").exists()


def test_on_error_skip_records_failed_rows(sample, tmp_path, capsys):
    bad = sample["root"] / "bad_skip.jsonl"
    rows = sample["jsonl"].read_text().splitlines()
    rows.insert(1, json.dumps({"messages": [{"role": "user", "content": [{"type": "image"}, _text("x")]}],
                               "images": ["imgs/missing.png"]}))
    bad.write_text("\n".join(rows) + "\n")
    out = tmp_path / "enc"
    rc = main(["encode", str(bad), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet",
               "--on-error", "skip"])
    printed = capsys.readouterr().out
    assert rc == 0 and "encoded 5 of 6 rows" in printed and "failed: image: 1" in printed
    _assert_same_rows(out, sample["reference"])  # the five good rows, in order
    errors = json.loads((out / REPORT_FILE).read_text())["errors"]
    assert [e["row"] for e in errors] == [1] and errors[0]["stage"] == "image"
    assert main(["inspect", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "1 row(s) failed to encode" in text and "row 1 (image" in text and "missing.png" in text


# ---- demo and the existing command ---------------------------------------------------------
def test_demo_subcommand_passes_its_arguments(capsys):
    rc = main(["demo", "--rows", "3", "--num-proc", "1", "--workers", "0", "--batch-size", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().splitlines()[-1].startswith("rows 3, batches 1,") and demo.SUMMARY_OK in out


def test_help_lists_every_command():
    run = _cli("--help")
    assert run.returncode == 0
    for command in ("encode", "inspect", "demo", "judge"):
        assert command in run.stdout


def test_encode_pixels_source_stores_the_files_and_collates_to_the_uint8_pixels(sample, tmp_path, capsys):
    out = tmp_path / "src"
    rc = main(["encode", str(sample["jsonl"]), "--processor", f"testing:{FAMILY}", "--out", str(out), "--quiet",
               "--pixels", "source"])
    assert rc == 0, capsys.readouterr().err
    got = datasets.load_from_disk(str(out))
    assert "image_sources" in got.column_names and "pixel_values_u8" not in got.column_names
    collate = mmpipe.Collator(sample["processor"])
    idx = list(range(len(got)))
    want = collate([sample["reference"][i] for i in idx])
    assert want.pixel_values is not None and want.pixel_values.shape[0] > 0
    assert torch.equal(collate([got[i] for i in idx]).pixel_values, want.pixel_values)


def test_end_of_turn_reaches_the_encoder():
    """``--end-of-turn stop_token`` is the Encoder's ``end_of_turn`` (recorded in the options the
    report keeps); the default leaves it to the encoder."""
    import argparse

    from mmpipe.cli.encode import add_encode_parser, encode_options

    parser = argparse.ArgumentParser()
    add_encode_parser(parser.add_subparsers(dest="cmd"))
    base = ["encode", "in.jsonl", "--processor", "testing:glm4v", "--out", "o"]
    assert "end_of_turn" not in encode_options(parser.parse_args(base))
    assert encode_options(parser.parse_args(base + ["--end-of-turn", "stop_token"]))["end_of_turn"] == "stop_token"
    with pytest.raises(SystemExit):
        parser.parse_args(base + ["--end-of-turn", "eos"])
