"""datasets' cache and the processor: a map cached on disk is reused only when it would encode
the same rows (hunt: caching, fingerprints and determinism).

datasets names a map's cache file after a hash of the map function and its arguments, the
processor included, so a processor changed in place between two maps moves the fingerprint and
the rows are encoded again. Before, ``ds.map(mmpipe.encode, fn_kwargs={"processor": p})`` then
reused the encoder it had built from ``p`` before the change (keyed on ``id(p)``): the rows were
encoded with the old image size again and cached under the new fingerprint. An `Encoder` object
whose processor changed after it was built now refuses to map (its settings are taken once).
The code stamp in every fingerprint now also carries the library versions and the ``MMPIPE_*``
variables that change rows: ``$MMPIPE_TRANSPARENCY`` changed a transparent image's pixels while
the cache served the other rule's rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

import mmpipe
from mmpipe.encoding.fingerprint import processor_settings
from mmpipe.errors import ArgumentError
from mmpipe.testing import build_processor as build  # a fresh processor each call: these tests change them

from conftest import processor_for

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """14 raw rows of 0-3 images, saved and loaded back (file-backed: maps are cached on disk)."""
    from helpers import raw_dataset

    return raw_dataset(tmp_path_factory.mktemp("hunt_caching"))


def smaller(proc) -> None:
    """Shrink ``proc``'s image size in place (Qwen-VL: longest_edge / 16; Gemma 3: half the tile)."""
    s = proc.image_processor.size
    proc.image_processor.size = (dataclasses.replace(s, longest_edge=s.longest_edge // 16) if s.longest_edge
                                 else dataclasses.replace(s, height=s.height // 2, width=s.width // 2))


def encode_map(raw, proc, **kw):
    return raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, batched=True, batch_size=4,
                   remove_columns=raw.column_names, **kw)


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_a_processor_changed_in_place_re_encodes_with_its_new_settings(raw, family):
    proc = build(family)
    before = encode_map(raw, proc)
    smaller(proc)
    after = encode_map(raw, proc)
    fresh = build(family)  # a freshly built processor with the new size
    smaller(fresh)
    want = encode_map(raw, fresh, load_from_cache_file=False,
                      cache_file_name=str(Path(raw.cache_files[0]["filename"]).parent / f"want_{family}.arrow"))
    assert after._fingerprint != before._fingerprint
    assert not after.data.table.equals(before.data.table)  # the old code encoded the old size again
    assert after.data.table.equals(want.data.table)
    assert encode_map(raw, fresh)._fingerprint == after._fingerprint  # same settings: a cache hit


@pytest.mark.parametrize("family,num_proc", [("qwen2_vl", None), ("gemma3", None), ("qwen2_vl", 2)])
def test_an_encoder_whose_processor_changed_refuses_to_map(raw, family, num_proc):
    proc = build(family)
    enc = mmpipe.Encoder(proc)
    raw.map(enc, batched=True, batch_size=7, remove_columns=raw.column_names, num_proc=num_proc)
    smaller(proc)
    with pytest.raises(ArgumentError, match="image_processor changed after this Encoder was built"):
        raw.map(enc, batched=True, batch_size=7, remove_columns=raw.column_names, num_proc=num_proc)
    assert len(raw.map(mmpipe.Encoder(proc), batched=True, batch_size=7, remove_columns=raw.column_names)) == len(raw)


def test_processor_settings_name_what_changed_and_match_a_fresh_processor():
    def changed(edit) -> list:
        proc = build("qwen2_vl")
        before = processor_settings(proc)
        edit(proc)
        now = processor_settings(proc)
        return sorted(k for k in now if now[k] != before.get(k))

    assert processor_settings(build("qwen2_vl")) == processor_settings(build("qwen2_vl"))
    assert changed(smaller) == ["image_processor"]
    assert changed(lambda p: setattr(p.image_processor, "image_mean", [0.5, 0.5, 0.5])) == ["image_processor"]
    assert changed(lambda p: setattr(p.image_processor, "do_resize", False)) == ["image_processor"]
    assert changed(lambda p: setattr(p, "chat_template", p.chat_template + " ")) == ["chat_template"]
    assert changed(lambda p: p.tokenizer.add_tokens(["<new_token>"])) == ["tokenizer"]
    assert changed(lambda p: setattr(p.tokenizer, "chat_template", "{{ messages }}")) == ["tokenizer"]
    assert changed(lambda p: None) == []


_OTHER_PROCESS = """
import sys, json, datasets
sys.path[:0] = [{tests!r}]
import mmpipe
from conftest import processor_for
raw = datasets.load_from_disk({path!r})
opts = json.loads({opts!r})
proc = processor_for("qwen2_vl")
a = raw.map(mmpipe.encode, fn_kwargs={{"processor": proc, **opts}}, batched=True, batch_size=4,
            remove_columns=raw.column_names)
b = raw.map(mmpipe.Encoder(proc, **opts), batched=True, batch_size=4, remove_columns=raw.column_names)
c, _ = mmpipe.encode_dataset(raw, proc, batch_size=4, **opts)
print("FINGERPRINTS", json.dumps([a._fingerprint, b._fingerprint, c._fingerprint]))
"""


def test_the_same_processor_and_options_hit_the_cache_from_another_interpreter(raw):
    opts = {"max_length": 4096, "video_options": {"fps": 2.0, "max_frames": 8},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}]}
    path = str(Path(raw.cache_files[0]["filename"]).parent)
    proc = processor_for("qwen2_vl")
    here = [raw.map(mmpipe.encode, fn_kwargs={"processor": proc, **opts}, batched=True, batch_size=4,
                    remove_columns=raw.column_names)._fingerprint,
            raw.map(mmpipe.Encoder(proc, **opts), batched=True, batch_size=4,
                    remove_columns=raw.column_names)._fingerprint,
            mmpipe.encode_dataset(raw, proc, batch_size=4, **opts)[0]._fingerprint]
    code = _OTHER_PROCESS.format(tests=str(TESTS), path=path, opts=json.dumps(opts))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    there = json.loads(run.stdout.split("FINGERPRINTS", 1)[1])
    assert there == here


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_encode_dataset_rows_do_not_depend_on_num_proc_or_batch_size(raw, family):
    proc = processor_for(family)
    runs = [mmpipe.encode_dataset(raw, proc, num_proc=n, batch_size=b, max_length=60, truncation="drop")
            for n, b in ((None, None), (2, 5))]
    (one, report_one), (two, report_two) = runs
    assert one.data.table.equals(two.data.table)
    assert report_one.dropped == report_two.dropped and report_one.rows_out == len(one) < len(raw)


def _transparent_rows(path: Path) -> datasets.Dataset:
    """One row whose image fades from opaque to transparent (its RGB depends on the rule)."""
    import numpy as np
    from PIL import Image

    rgba = np.zeros((56, 56, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.linspace(0, 255, 56).astype(np.uint8)[None, :]
    feats = datasets.Features({"messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
                               "images": datasets.Sequence(datasets.Image())})
    row = {"messages": [{"role": "user", "content": "<image>What?"}], "images": [Image.fromarray(rgba, "RGBA")]}
    datasets.Dataset.from_list([row], features=feats).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def test_the_transparency_rule_in_the_environment_moves_the_fingerprint(tmp_path, monkeypatch):
    """$MMPIPE_TRANSPARENCY changes a transparent image's pixels; the old code served the rows of
    the other rule from the cache."""
    raw = _transparent_rows(tmp_path / "raw")
    proc = processor_for("qwen2_vl")
    runs = {}
    for rule in ("drop", "white", "drop"):
        monkeypatch.setenv("MMPIPE_TRANSPARENCY", rule)
        runs.setdefault(rule, []).append(encode_map(raw, proc))
    (drop, again), (white,) = runs["drop"], runs["white"]
    assert white._fingerprint != drop._fingerprint and again._fingerprint == drop._fingerprint
    assert white["pixel_values_u8"] != drop["pixel_values_u8"]


def test_the_stamp_covers_the_libraries_and_the_variables_that_shape_rows(monkeypatch):
    from mmpipe.encoding import fingerprint
    from mmpipe.images.load import MAX_IMAGE_BYTES_ENV
    from mmpipe.images.transparency import TRANSPARENCY_ENV

    assert {TRANSPARENCY_ENV, MAX_IMAGE_BYTES_ENV} <= set(fingerprint.RUNTIME_ENV)
    versions = dict(fingerprint.library_versions())
    assert versions["transformers"] and versions["pillow"] and versions["tokenizers"]
    before = fingerprint.code_stamp()
    monkeypatch.setattr(fingerprint, "library_versions", lambda: (("transformers", "0.0"),))
    assert fingerprint.code_stamp() != before


def test_a_host_patched_processor_is_checked_cheaply_and_not_refused():
    """verl's ``hf_processor`` binds ``get_rope_index`` (a method of the processor) and a
    ``validate_inputs`` lambda on the processor and sets its model ``config``: none is a setting the
    encoder took. The per-call check must not pickle the whole processor through the bound method
    (the old check's state was the processor's full pickle: megabytes, ~1.5 ms a call) nor refuse."""
    import types

    import transformers

    from mmpipe.encoding.fingerprint import quick_state

    p = build("qwen2_vl")
    plain = len(quick_state(p))
    p.config = transformers.Qwen2VLConfig()
    p.get_rope_index = types.MethodType(lambda self, *a: None, p)
    assert len(quick_state(p)) < plain + 20_000  # the config's fields, not the processor again
    p.validate_inputs = lambda *a, **k: None
    assert len(quick_state(p)) < plain + 20_000
    enc = mmpipe.Encoder(p)
    out = enc({"messages": [[{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]]})
    assert len(out["input_ids"]) == 1
    p.get_rope_index = types.MethodType(lambda self, *a: 1, p)  # another patch: still not a setting
    enc({"messages": [[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]]})
