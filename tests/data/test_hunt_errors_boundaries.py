"""Every exception class mmpipe defines keeps its fields across process boundaries.

Enumerated from the package's source (a class added later without a sample here fails
`test_every_exception_class_has_a_sample`), each built with all its fields set:

- ``type(e)(*e.args)`` builds (a worker's error that cannot be rebuilt hangs a ``datasets``
  ``map(num_proc=...)`` pool, measured) and ``pickle`` round-trips it with every field;
- a torch DataLoader worker's re-raise (`torch._utils.ExceptionWrapper`: the type and the traceback's
  text only, ``type(e)(text)``) gives back the same type and every public field (``where``, a text
  override of the location, comes back inside the location it composes; ``worker_text`` then holds the
  worker's text);
- a ``multiprocessing`` pool worker's error arrives with its fields.

Before the fix the re-raise lost ``InputError.expected`` / ``found`` / ``fix``,
``UnsupportedProcessorError.class_name``, ``PackingUnsupportedError.layer_type`` / ``layers`` /
``model_type``, ``DamagedDatasetError.file`` / ``rows_readable`` and ``RowDropped.reason`` (None).
"""

from __future__ import annotations

import ast
import importlib
import json
import multiprocessing
import pathlib
import pickle

import pytest

import mmpipe
from mmpipe import errors as E

PACKAGE = pathlib.Path(mmpipe.__file__).parent
WORKER = "in DataLoader worker process 0"
LOC = dict(row=3, column="images", stage="image", expected="an RGB image", found="CMYK - 4 bands",
           fix="convert it - or drop the row", image=1)


def _classes() -> dict:
    """{qualified name: class} of every exception class defined at module level in the package."""
    found = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        names = [n.name for n in ast.parse(f.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]
        if not names:
            continue
        module = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        defined = vars(importlib.import_module(module))
        for n in names:
            c = defined.get(n)
            if isinstance(c, type) and issubclass(c, BaseException) and c.__module__ == module:
                found[f"{module}.{n}"] = c
    return found


def _samples() -> dict:
    """{qualified name: an instance with every field set}."""
    from mmpipe.cli.encode import CLIError
    from mmpipe.data.loading import DamagedDatasetError
    from mmpipe.data.object_store import DamagedShardError, ShardReadError
    from mmpipe.data.report import SchemaError
    from mmpipe.encoding.options import RowDropped
    from mmpipe.processors import ProcessorLoadError
    from mmpipe.cli.stops import Terminated
    from mmpipe.reward.client import _Aborted, _DeadlinePassed
    from mmpipe.reward.dataset import JudgeColumnError
    from mmpipe.rollout.support import RolloutRefusal

    out = {
        "mmpipe.cli.encode.CLIError": CLIError("--max-length must be >= 1, got 0"),
        "mmpipe.cli.stops.Terminated": Terminated(),
        "mmpipe.data.loading.DamagedDatasetError": DamagedDatasetError(
            "file '/d/data-00000.arrow' is cut short", file="/d/data-00000.arrow", rows_readable=(0, 40), row=None),
        "mmpipe.data.object_store.ShardReadError": ShardReadError("s3://b/part-1.parquet", OSError("reset")),
        "mmpipe.data.object_store.DamagedShardError": DamagedShardError(
            "s3://b/part-2.parquet", rows_read=7, row_group=1, cause=OSError("bad page"), start=10),
        "mmpipe.data.report.SchemaError": SchemaError("wrong type", column="input_ids", expected="int32",
                                                      found="float64", fix="re-encode"),
        "mmpipe.encoding.options.RowDropped": RowDropped("too_long", "row 4 is 9000 tokens"),
        "mmpipe.errors.MMPipeError": E.MMPipeError("something"),
        "mmpipe.errors.ArgumentError": E.ArgumentError("truncation must be one of ('raise',), got 'cut'"),
        "mmpipe.errors.NotAFamilyError": E.NotAFamilyError("cannot tell the model family of int"),
        "mmpipe.errors.UnsupportedProcessorError": E.UnsupportedProcessorError("processor Foo is not a family",
                                                                              "FooProcessor"),
        "mmpipe.errors.PackingUnsupportedError": E.PackingUnsupportedError(
            "packing is not available", layer_type="linear_attention", layers=(0, 2), model_type="qwen3_next"),
        "mmpipe.processors.ProcessorLoadError": ProcessorLoadError("processor 'x': no files"),
        "mmpipe.reward.client._DeadlinePassed": _DeadlinePassed(),
        "mmpipe.reward.client._Aborted": _Aborted(),
        "mmpipe.reward.dataset.JudgeColumnError": JudgeColumnError("no image column", column="frame",
                                                                   expected="a column 'frame'", found="['a']"),
        "mmpipe.rollout.support.RolloutRefusal": RolloutRefusal(
            "row 2: multi-turn conversations (start / append_observation) are not available for gemma3 rows: "
            "tiles", stage="multiturn", family="gemma3", row=2),
        "column_in_location": E.PixelDataError("bytes changed", row=5, column="pixel_values_u8",
                                                column_in_location=True, fix="re-encode the row"),
        "no location": E.InputError("", expected="a list", found="None"),
    }
    for name in ("InputError", "ParseError", "PlaceholderError", "ImageError", "VideoError", "AudioError",
                 "TruncationError", "PixelDataError", "FamilyMismatchError"):
        out[f"mmpipe.errors.{name}"] = getattr(E, name)("cannot read it (truncated; 3 bytes)", **LOC)
    return out


SAMPLES = _samples()


def _fields(e: BaseException) -> dict:
    return {k: v for k, v in vars(e).items() if not k.startswith("_") and k not in ("where", "worker_text")}


def _reraised(e: BaseException) -> BaseException:
    from torch._utils import ExceptionWrapper

    try:
        raise e
    except BaseException:  # noqa: BLE001 - what torch's worker loop wraps
        wrapped = pickle.loads(pickle.dumps(ExceptionWrapper(where=WORKER)))
    with pytest.raises(BaseException) as got:
        wrapped.reraise()
    return got.value


def test_every_exception_class_has_a_sample():
    classes = _classes()
    assert len(classes) >= 20
    missing = sorted(set(classes) - set(SAMPLES))
    assert not missing, f"add a sample (every field set) to SAMPLES for {missing}"
    assert all(type(SAMPLES[name]) is cls for name, cls in classes.items())


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_rebuilds_from_args_and_pickles_with_every_field(name):
    e = SAMPLES[name]
    type(e)(*e.args)  # what pickle's default and a datasets pool do: never raises
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and str(back) == str(e) and vars(back) == vars(e)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_dataloader_reraise_keeps_every_field(name):
    e = SAMPLES[name]
    got = _reraised(e)
    assert type(got) is type(e) and f"Caught {type(e).__name__} {WORKER}" in str(got)
    assert _fields(got) == _fields(e)
    if isinstance(e, E.InputError):
        assert got.location() == e.location() and got.message_body() == e.message_body()
        assert got.record() == {**e.record(), "reason": str(got)}


def _raise_sample(name: str) -> None:
    raise SAMPLES[name]


def test_pool_worker_errors_keep_every_field():
    # a pool worker catches Exception only: a KeyboardInterrupt kind (mmpipe.cli.stops.Terminated,
    # raised in the CLI's own process) ends the worker and leaves apply() waiting for good
    errors = {name: e for name, e in SAMPLES.items() if isinstance(e, Exception)}
    assert len(errors) == len(SAMPLES) - 1
    with multiprocessing.get_context("fork").Pool(1) as pool:
        for name, e in errors.items():
            with pytest.raises(type(e)) as got:
                pool.apply(_raise_sample, (name,))
            assert _fields(got.value) == _fields(e) and str(got.value) == str(e), name


class _Raising:
    def __init__(self, e):
        self.e = e

    def __len__(self):
        return 2

    def __getitem__(self, i):
        raise self.e


@pytest.mark.parametrize("name", ["mmpipe.errors.ImageError", "mmpipe.errors.PackingUnsupportedError",
                                  "mmpipe.data.loading.DamagedDatasetError", "mmpipe.encoding.options.RowDropped"])
def test_real_dataloader_worker_reraise(name):
    import torch.utils.data

    e = SAMPLES[name]
    loader = torch.utils.data.DataLoader(_Raising(e), batch_size=None, num_workers=1,
                                         multiprocessing_context="fork")
    with pytest.raises(type(e)) as got:
        next(iter(loader))
    assert _fields(got.value) == _fields(e)


def test_datasets_map_num_proc_delivers_the_typed_error():
    """An mmpipe error raised in a ``datasets`` ``map(num_proc=2)`` worker reaches the caller with its
    type and fields, never hanging the pool (the child runs in its own process group, killed on timeout)."""
    from helpers import run_child_group

    script = f"""
import json
import datasets
from mmpipe.errors import ImageError

def encode(row, idx):
    if idx == 3:
        raise ImageError("cannot read the image", row=idx, column="images", expected="JPEG bytes", found="3 bytes",
                         fix="re-export the image", image=0)
    return {{"n": len(row["t"])}}

ds = datasets.Dataset.from_dict({{"t": ["a", "bb", "ccc", "dddd"]}})
try:
    ds.map(encode, with_indices=True, num_proc=2, load_from_cache_file=False)
except ImageError as e:
    print(json.dumps({{k: e.__dict__[k] for k in ("row", "column", "stage", "expected", "found", "fix", "image")}}))
"""
    out = run_child_group(script, timeout=120, hang="datasets' map(num_proc=2) pool hung on an mmpipe error")
    fields = json.loads(out.strip().splitlines()[-1])
    assert fields == {"row": 3, "column": "images", "stage": "image", "expected": "JPEG bytes", "found": "3 bytes",
                      "fix": "re-export the image", "image": 0}


def test_an_ambiguous_damaged_file_keeps_both_notes():  # guard: two notes (ambiguous texts, own fields)
    from mmpipe.data.loading import DamagedDatasetError

    e = DamagedDatasetError("file 'a - b.arrow' is cut short", file="a - b.arrow", rows_readable=(0, 3),
                            found="12 bytes - of 40")
    got = _reraised(e)
    assert _fields(got) == _fields(e)


def test_a_message_of_many_splits_keeps_its_fields():  # guard: past the parse's tries, the note says them
    many = "; ".join(["a - b"] * 40)
    e = E.ParseError(many, row=1, column="messages", expected=many, found=many, fix=many)
    assert _fields(_reraised(e)) == _fields(e)
