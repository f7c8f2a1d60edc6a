"""The encode fingerprint carries mmpipe's version and a hash of its encoding code.

datasets names a map's cache after a hash of the map function and its arguments, and hashes
a module-level function by its name only: before this stamp, changing mmpipe's code served
the old cache. Nothing on disk is edited here: the version and the code hash are
monkeypatched, and the hash's sensitivity is checked on a copy of the sources.
"""

from __future__ import annotations

import inspect
import pickle
import shutil
import sys
from pathlib import Path

import datasets
import pytest
from datasets.fingerprint import Hasher

import mmpipe
from mmpipe.encoding import fingerprint

from conftest import processor_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A small file-backed raw dataset (maps of a file-backed dataset are cached next to it)."""
    from helpers import raw_dataset

    return raw_dataset(tmp_path_factory.mktemp("fp"))


def encode_map(raw, **kw):
    fn_kwargs = {"processor": processor_for("qwen2_vl"), **kw.pop("options", {})}
    return raw.map(mmpipe.encode, fn_kwargs=fn_kwargs, load_from_cache_file=True, **kw)


def cache_names(ds):
    return [Path(f["filename"]).name for f in ds.cache_files]


def test_the_same_map_twice_is_a_cache_hit(raw):
    first = encode_map(raw, with_indices=True)
    again = encode_map(raw, with_indices=True)
    assert again._fingerprint == first._fingerprint
    assert again.cache_files == first.cache_files


@pytest.mark.parametrize("change", ["version", "code"])
def test_a_new_version_or_new_code_re_encodes(raw, monkeypatch, change):
    before = encode_map(raw)
    if change == "version":
        monkeypatch.setattr(mmpipe, "__version__", mmpipe.__version__ + ".post1")
    else:
        monkeypatch.setattr(fingerprint, "code_hash", lambda: "0" * 64)
    after = encode_map(raw)
    assert after._fingerprint != before._fingerprint
    assert cache_names(after) != cache_names(before)  # a new cache file: the rows were encoded again
    assert after.data.table.equals(before.data.table)  # same code, so same rows
    monkeypatch.undo()
    assert encode_map(raw)._fingerprint == before._fingerprint  # stays put when nothing changed


@pytest.mark.parametrize("change", ["version", "code"])
def test_an_encoder_object_as_the_map_function_is_stamped_too(raw, monkeypatch, change):
    """``ds.map(Encoder(processor))``: datasets hashes the object's pickled state."""
    enc = mmpipe.Encoder(processor_for("qwen2_vl"))
    before = raw.map(enc, load_from_cache_file=True)
    assert raw.map(enc, load_from_cache_file=True)._fingerprint == before._fingerprint
    if change == "version":
        monkeypatch.setattr(mmpipe, "__version__", mmpipe.__version__ + ".post1")
    else:
        monkeypatch.setattr(fingerprint, "code_hash", lambda: "2" * 64)
    after = raw.map(enc, load_from_cache_file=True)
    assert after._fingerprint != before._fingerprint and cache_names(after) != cache_names(before)
    assert after.data.table.equals(before.data.table)
    again = object.__new__(mmpipe.Encoder)  # unpickling: the stamp is dropped, counters start afresh
    again.__setstate__(enc.__getstate__())
    assert fingerprint.CodeStamped.STAMP_KEY not in vars(again) and again.stats is not enc.stats
    assert mmpipe.MultiModalInputs.from_dict(again(raw[0])) == mmpipe.MultiModalInputs.from_dict(enc(raw[0]))


def test_fn_kwargs_still_move_the_fingerprint(raw):
    a = encode_map(raw, options={"max_length": 4096})
    b = encode_map(raw, options={"max_length": 4000})
    assert a._fingerprint != b._fingerprint


def test_batched_and_num_proc_work_and_hit_the_cache_on_repeat(raw):
    kw = {"batched": True, "batch_size": 4, "num_proc": 2, "with_indices": True,
          "remove_columns": raw.column_names}
    first = encode_map(raw, **kw)
    again = encode_map(raw, **kw)
    assert again._fingerprint == first._fingerprint
    assert again.cache_files == first.cache_files
    per_row = encode_map(raw, remove_columns=raw.column_names)
    assert first.data.table.equals(per_row.data.table)


def test_encode_dataset_fingerprint_carries_the_stamp(raw, monkeypatch):
    proc = processor_for("qwen2_vl")
    first, _ = mmpipe.encode_dataset(raw, proc, batch_size=4)
    again, _ = mmpipe.encode_dataset(raw, proc, batch_size=4)
    monkeypatch.setattr(fingerprint, "code_hash", lambda: "1" * 64)
    moved, _ = mmpipe.encode_dataset(raw, proc, batch_size=4)
    assert again._fingerprint == first._fingerprint
    assert moved._fingerprint != first._fingerprint


def test_the_code_hash_moves_with_any_source_byte(tmp_path):
    src = Path(fingerprint.__file__).resolve().parents[1]
    assert fingerprint.source_hash(src) == fingerprint.code_hash()
    copy = tmp_path / "mmpipe"
    for name in fingerprint.CODE_SOURCES:
        if (src / name).is_dir():
            shutil.copytree(src / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / name, copy / name)
    assert fingerprint.source_hash(copy) == fingerprint.code_hash()
    target = copy / "encoding" / "encoder.py"
    target.write_bytes(target.read_bytes().replace(b"def encode_row", b"def encode_row ", 1))
    assert fingerprint.source_hash(copy) != fingerprint.code_hash()


def test_the_sources_cover_everything_encode_imports():
    """CODE_SOURCES lists every module on the encode path (function-level imports included),
    so new code that shapes encoded rows cannot escape the hash."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import layout_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    graph = layout_check.imports(ROOT)
    seen, todo = set(), ["mmpipe.encoding.dataset"]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo += [t for t, _, _ in graph.get(mod, [])]
    sources = [s[:-3] if s.endswith(".py") else s for s in fingerprint.CODE_SOURCES]  # "data/report"
    covered = {m for m in seen
               if any(f"{'/'.join(m.split('.')[1:])}/".startswith(f"{s}/") for s in sources)}
    assert seen - covered == set()
    assert len(seen) >= 10


def test_encode_keeps_its_name_signature_doc_and_pickles():
    from mmpipe import encode

    assert encode is mmpipe.encode
    assert encode.__name__ == "encode" and "dataset.map" in encode.__doc__
    assert str(inspect.signature(encode)).startswith("(example: 'dict', idx=None, *, processor, **options)")
    back = pickle.loads(pickle.dumps(encode))
    assert back.__name__ == "encode" and back.fn is encode.fn
    assert Hasher.hash(encode) == Hasher.hash(back)


def test_streaming_map_is_unchanged():
    stream = datasets.Dataset.from_dict({"prompt": ["Hi.", "Bye."]}).to_iterable_dataset()
    out = list(stream.map(mmpipe.encode, fn_kwargs={"processor": processor_for("qwen2_vl")}))
    assert [len(r["input_ids"]) > 0 for r in out] == [True, True]


@pytest.mark.parametrize("change", ["version", "code"])
def test_a_user_function_that_reads_mmpipe_is_stamped_too(monkeypatch, change):
    """``ds.map(lambda b: mmpipe.encode(b, processor=p))``: datasets hashes the lambda, which pickles
    the ``mmpipe`` module by reference; the reference carries the code stamp, so an upgrade or a code
    edit re-encodes instead of serving rows an older mmpipe wrote."""
    p = processor_for("qwen2_vl")

    def fn(b):
        return mmpipe.encode(b, processor=p)

    before = Hasher.hash(fn)
    if change == "version":
        monkeypatch.setattr(mmpipe, "__version__", mmpipe.__version__ + ".post1")
    else:
        monkeypatch.setattr(fingerprint, "code_hash", lambda: "0" * 64)
    assert Hasher.hash(fn) != before
    monkeypatch.undo()
    assert Hasher.hash(fn) == before
    assert pickle.loads(pickle.dumps(mmpipe)) is mmpipe
