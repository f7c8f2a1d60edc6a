"""mmpipe objects crossing process boundaries, as in training jobs: ``datasets.map(num_proc=2)``
workers, torch DataLoader workers started with ``spawn`` / ``forkserver`` (macOS' default and
Python 3.14's Linux default; both pickle everything with plain pickle) and Ray.

- Every error mmpipe raises pickles with its message and its fields (a worker's error that
  cannot be unpickled hangs a ``datasets.map`` pool forever).
- Typed errors raised in a DataLoader worker reach the caller with their type and location.
- Spawn / forkserver workers give the batches ``num_workers=0`` gives (Collator, ArrowRows,
  TokenBudgetBatchSampler, PackingCollator).
- Records, collators and samplers are equal after a pickle round trip, dtypes included.
- Processors whose class mmpipe.offline builds at run time (what ``load_processor(dir)`` returns
  without torchvision) pickle by name and encode as before, also in spawn workers.
Every process start here is bounded (a DataLoader ``timeout=``, a subprocess timeout)."""

from __future__ import annotations

import functools
import json
import pickle
import subprocess
import sys
import textwrap

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import mmpipe
from mmpipe import errors as E
from mmpipe import rema, testing
from mmpipe.batching.collate import ArrowRows
from mmpipe.processors import load_processor
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.records.row import MultiModalInputs

from conftest import model_for, processor_for

WORKER_TIMEOUT_S = 120  # a hung worker fails the test instead of stalling the suite


# ---- errors --------------------------------------------------------------------------------
def _error_cases() -> dict:
    """One instance of every exception class mmpipe defines, with every field set."""
    from mmpipe.cli.encode import CLIError
    from mmpipe.data.loading import DamagedDatasetError
    from mmpipe.data.object_store import DamagedShardError, ShardReadError
    from mmpipe.data.report import SchemaError
    from mmpipe.encoding.options import RowDropped
    from mmpipe.processors import ProcessorLoadError
    from mmpipe.reward.dataset import JudgeColumnError
    from mmpipe.rollout.support import RolloutRefusal

    kw = dict(row=7, column="images", expected="an image", found="None", fix="pass one", image=1)
    cases = {
        "MMPipeError": E.MMPipeError("m"), "ArgumentError": E.ArgumentError("m"),
        "NotAFamilyError": E.NotAFamilyError("m"),
        "UnsupportedProcessorError": E.UnsupportedProcessorError("processor Foo is not supported", "Foo"),
        "PackingUnsupportedError": E.PackingUnsupportedError("m", layer_type="linear_attention", layers=(1, 2),
                                                             model_type="qwen3_next"),
        "ProcessorLoadError": ProcessorLoadError("m"), "CLIError": CLIError("m"),
        "RolloutRefusal": RolloutRefusal("row 3: m", stage="rollout", family="qwen2_vl", row=3),
        "DamagedDatasetError": DamagedDatasetError("d", file="f.arrow", rows_readable=(0, 5), row=2),
        "ShardReadError": ShardReadError("s3://b/x", ValueError("boom")),
        "DamagedShardError": DamagedShardError("s3://b/x", rows_read=4, row_group=2, start=10),
        "JudgeColumnError": JudgeColumnError("d", **kw), "SchemaError": SchemaError("d", **kw),
        "RowDropped": RowDropped("too_long", "row 3 has 900 tokens"),
    }
    for cls in E.DOCUMENTED_ERRORS:
        cases[cls.__name__] = cls("detail", **kw)
    located = E.InputError("d", column="pixel_values", column_in_location=True, stage="validate")
    cases["InputError(column_in_location)"] = located.locate(row=4)
    return cases


@pytest.mark.parametrize("name", sorted(_error_cases()))
def test_every_error_round_trips_through_pickle(name):
    e = _error_cases()[name]
    got = pickle.loads(pickle.dumps(e))
    assert type(got) is type(e)
    assert str(got) == str(e) and got.args == e.args
    assert vars(got) == vars(e)  # row, column, expected, found, fix, class_name, layer_type, ...


@pytest.mark.parametrize("name", ["ImageError", "SchemaError", "PackingUnsupportedError", "UnsupportedProcessorError"])
def test_notes_and_attributes_set_after_raising_survive_pickling(name):
    """`mmpipe.rollout.agent` adds a note naming the engine row to an InputError it re-raises."""
    e = _error_cases()[name]
    e.add_note("(agent loop: engine row 3 is prompt 1)")
    e.batch_index = 5
    got = pickle.loads(pickle.dumps(e))
    assert got.__notes__ == e.__notes__ and got.batch_index == 5 and str(got) == str(e)


def test_every_error_class_of_mmpipe_errors_is_covered():
    classes = {n for n, v in vars(E).items() if isinstance(v, type) and issubclass(v, BaseException)}
    assert classes <= set(_error_cases())


def test_a_typed_error_from_a_datasets_map_worker_reaches_the_caller():
    """An error that cannot be unpickled killed the pool's result thread: map hung forever."""
    script = textwrap.dedent("""
        import datasets
        from mmpipe.errors import InputError, UnsupportedProcessorError

        def f(row, idx):
            if idx == 3:
                raise UnsupportedProcessorError("processor FooProcessor is not supported", "FooProcessor")
            if idx == 2 and row["a"] == "input":
                raise InputError("bad", row=idx, column="images", stage="image")
            return row

        for value in ("unsupported", "input"):
            try:
                datasets.Dataset.from_dict({"a": [value] * 5}).map(f, with_indices=True, num_proc=2)
            except Exception as e:
                print("CAUGHT", type(e).__name__, getattr(e, "class_name", None), getattr(e, "row", None))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    caught = [line for line in out.stdout.splitlines() if line.startswith("CAUGHT")]
    assert caught == ["CAUGHT UnsupportedProcessorError FooProcessor None", "CAUGHT InputError None 2"], out.stderr[-2000:]


# ---- spawn / forkserver DataLoaders -----------------------------------------------------------
class _Items(torch.utils.data.Dataset):
    """``base``'s rows, then ``extra`` items; a ``partial`` among them is an error, made and raised
    in the worker when fetched (module level: spawn pickles it)."""

    def __init__(self, base, extra):
        self.base, self.extra = base, extra

    def __len__(self):
        return len(self.base) + len(self.extra)

    def __getitem__(self, i):
        item = self.base[i] if i < len(self.base) else self.extra[i - len(self.base)]
        if isinstance(item, functools.partial):
            raise item()
        return item


class _BothCollators:
    """The padded batch and the packed sequence of the same rows (module level: spawn pickles it)."""

    def __init__(self, *collators):
        self.collators = collators

    def __call__(self, rows):
        return [c(rows) for c in self.collators]


def _encoded(n=6, pixels="uint8"):
    raws = []
    for i in range(n):
        k = i % 3  # 0, 1, 2 images
        raws.append({"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"row {i}"}]},
                                  {"role": "assistant", "content": [{"type": "text", "text": "An answer."}]}],
                     "images": [testing.tiny_image(30 + 8 * j, 40 + 8 * i, seed=3 * i + j) for j in range(k)]})
    return [mmpipe.encode_row(r, processor_for("qwen2_vl"), pixels=pixels) for r in raws]


def _plain(x):
    """Tensors as (dtype, shape, values), records as their fields, recursively: comparable with ==."""
    if isinstance(x, torch.Tensor):
        return (str(x.dtype), tuple(x.shape), x.tolist())
    if isinstance(x, np.ndarray):
        return (str(x.dtype), x.shape, x.tolist())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if type(x).__module__.startswith("mmpipe.") and hasattr(x, "__dict__"):
        return (type(x).__name__, _plain(vars(x)))
    return x


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawn_and_forkserver_workers_give_the_batches_and_errors_of_the_main_process(context):
    """Collator, PackingCollator, ArrowRows and TokenBudgetBatchSampler under 2 workers give the
    batches of ``num_workers=0``; typed errors raised in the workers reach the caller typed and
    located. torch re-raises a worker's error as ``type(e)(text)``: the type must take one message
    (else a RuntimeError), and an InputError takes its row, column and stage back from the text."""
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    ds = datasets.Dataset.from_list([r.to_dict() for r in _encoded(6)], features=MultiModalInputs.features("uint8"))
    sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(ds, max_tokens=128, max_images=8, seed=0)
    collate = _BothCollators(mmpipe.Collator(proc), mmpipe.PackingCollator(proc, model=model, max_tokens=128,
                                                                           max_images=8))
    want = [_plain(b) for b in DataLoader(ArrowRows(ds), batch_sampler=sampler, collate_fn=collate)]
    bad = [ds[i] for i in range(4)]
    bad[3] = dict(bad[3], pixel_values_u8=bad[3]["pixel_values_u8"][:-1])  # the end marker lost
    with pytest.raises(E.PixelDataError) as direct:
        collate(bad)
    extra = [functools.partial(E.UnsupportedProcessorError, "processor Foo is not supported", "Foo"),
             functools.partial(E.PackingUnsupportedError, "packing refused", layer_type="linear_attention")] + bad
    n = len(ds)
    loader = DataLoader(_Items(ArrowRows(ds), extra), batch_sampler=list(sampler) + [[n], [n + 1], list(range(n + 2, n + 6))],
                        collate_fn=collate, num_workers=2, multiprocessing_context=context, timeout=WORKER_TIMEOUT_S)
    it = iter(loader)
    assert len(want) > 1 and [_plain(next(it)) for _ in want] == want
    with pytest.raises(E.UnsupportedProcessorError, match="processor Foo is not supported"):
        next(it)
    with pytest.raises(E.PackingUnsupportedError, match="packing refused"):
        next(it)
    with pytest.raises(E.PixelDataError) as got:
        next(it)
    with pytest.raises(StopIteration):  # and the workers shut down
        next(it)
    e, d = got.value, direct.value
    assert (e.row, e.column, e.stage) == (d.row, d.column, d.stage) == (3, "pixel_values_u8", "collate")
    assert str(d) in str(e) and str(e).count("[stage:") == 1  # the original message, tagged once


# ---- pickle round trips ----------------------------------------------------------------------
class _Engine:
    """A rollout engine replying ``text`` to every prompt."""

    def __init__(self, tok, text):
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, rows, params=SamplingParams()):
        return [Generation(prompt_index=k, completions=[Completion(token_ids=list(self.ids), finish_reason="stop")])
                for k in range(len(rows))]


def _round_trip_equal(obj):
    assert _plain(pickle.loads(pickle.dumps(obj))) == _plain(obj)


@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_records_and_collators_round_trip_through_pickle(pixels):
    proc = processor_for("qwen2_vl")
    rows = _encoded(4, pixels)
    collator = mmpipe.Collator(proc)
    packing = mmpipe.PackingCollator(proc, model=model_for("qwen2_vl"), max_tokens=512, max_images=8)
    batch, packed = collator(rows), packing(rows)
    batch.model_inputs()  # anything computed on demand is computed before pickling
    for obj in (rows[2], batch, packed, mmpipe.unpack(packed)):
        _round_trip_equal(obj)
    for col in (collator, packing):  # a collator in a worker collates as the parent's does
        assert _plain(pickle.loads(pickle.dumps(col))(rows)) == _plain(col(rows))


def test_samplers_and_rema_batches_round_trip_through_pickle():
    proc = processor_for("qwen2_vl")
    ds = datasets.Dataset.from_list([r.to_dict() for r in _encoded(6)], features=MultiModalInputs.features("uint8"))
    sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(ds, max_tokens=128, max_images=8, seed=0)
    sampler.set_epoch(1)
    planned = list(sampler)
    copy = pickle.loads(pickle.dumps(sampler))
    assert list(copy) == planned and copy.state_dict() == sampler.state_dict()
    qs = [{"question": f"Q{i}: what?" + " <image>" * k, "images": [testing.tiny_image(40, 52, seed=i)] * k}
          for i, k in enumerate((1, 0))]
    engines = {role: _Engine(proc.tokenizer, role) for role in ("meta", "reasoner")}
    _round_trip_equal(rema.rollout(qs, engines, proc, agent_roles=["meta", "reasoner"], max_num_turns=2,
                                   finish_flag="[FINISH]"))


# ---- processors ------------------------------------------------------------------------------
def _image_row(i=1):
    """Row ``i``: one image when ``i`` is odd, none when even."""
    user = [{"type": "image"}] * (i % 2) + [{"type": "text", "text": f"row {i}"}]
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": [{"type": "text", "text": "An answer."}]}],
            "images": [testing.tiny_image(40, 52, seed=i)] * (i % 2)}


def test_processors_pickle(tmp_path):
    """The offline processors, and what ``load_processor(dir)`` returns without torchvision, are
    image-only subclasses built at run time (``type()``): pickle finds them by name and they
    encode a row as before. A fresh processor: ``save_pretrained`` changes the one it saves (its
    ``datasets`` fingerprint moved for the later tests sharing ``processor_for``'s)."""
    proc = testing.build_processor("qwen2_vl")
    assert type(pickle.loads(pickle.dumps(proc))) is type(proc)
    proc.save_pretrained(tmp_path)
    loaded = load_processor(str(tmp_path))
    assert type(loaded) is type(proc)
    row = _image_row()
    for p in (proc, loaded):
        copy = pickle.loads(pickle.dumps(p))
        assert type(copy) is type(p) and _plain(mmpipe.encode_row(row, copy)) == _plain(mmpipe.encode_row(row, proc))
    encoder = mmpipe.Encoder(loaded)
    want = _plain(encoder(row))  # a used Encoder
    assert _plain(pickle.loads(pickle.dumps(encoder))(row)) == want == _plain(mmpipe.Encoder(proc)(row))


@pytest.mark.parametrize("family", ["glm4v", "glm46v"])
@pytest.mark.parametrize("recorded", ["image-only", "stock"])
def test_a_glm_processor_directory_loads_without_torchvision(tmp_path, family, recorded):
    """A GLM-4.1V / GLM-4.6V directory, saved by ``testing:FAMILY`` or recording the stock class
    (as the checkpoints do), loads where the stock class cannot be built (no torchvision: its video
    processor) as the image-only class of mmpipe.offline; it failed ("AutoProcessor built only the
    tokenizer" / "Can't load video processor"). It encodes a row as the original and pickles."""
    from mmpipe.offline import glm46v

    if family == "glm46v" and not glm46v.available():
        pytest.skip("GLM-4.6V needs transformers 5")
    proc = testing.build_processor(family)  # fresh: save_pretrained changes the processor it saves
    stock = type(proc).__mro__[1]
    proc.save_pretrained(tmp_path)
    if recorded == "stock":
        for name in ("processor_config.json", "tokenizer_config.json"):
            f = tmp_path / name
            f.write_text(json.dumps(dict(json.loads(f.read_text()), processor_class=stock.__name__)))
    loaded = load_processor(str(tmp_path), log=lambda message: None)
    assert isinstance(loaded, stock) and (recorded == "stock" or type(loaded) is type(proc))
    row = _image_row()
    assert _plain(mmpipe.encode_row(row, pickle.loads(pickle.dumps(loaded)))) == _plain(mmpipe.encode_row(row, proc))


def _run_time_classes() -> list:
    """Every processor class mmpipe.offline builds at run time (each builder's cached class)."""
    from mmpipe.offline import glm4v, glm46v, minicpmv, other_vlms, processors, qwen3_omni, qwen_omni

    classes = [processors.image_only_processor_class(f) for f in processors.FAMILY_NAMES]
    classes += [glm4v.image_only_processor_class(), qwen_omni._class(), qwen3_omni._class()]
    classes += [glm46v.image_only_processor_class()] if glm46v.available() else []
    classes += [minicpmv._processor_class(n) for n in minicpmv.MINICPMV_NAMES]
    classes += [other_vlms._processor_class(n) for n in other_vlms.FOREIGN_PROCESSORS + other_vlms.MORE_MODELS]
    return [c for c in classes if c.__module__.startswith("mmpipe.")]


def test_every_run_time_processor_class_is_found_by_name_in_a_fresh_process():
    """What a spawn / forkserver worker does with a pickled processor: look its class up by name in
    a process that has not built it yet."""
    classes = _run_time_classes()
    assert len(classes) >= 8 and all(pickle.loads(pickle.dumps(c)) is c for c in classes)
    script = "import pickle, sys; print([c.__module__ + '.' + c.__name__ for c in pickle.load(sys.stdin.buffer)])"
    out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(classes), capture_output=True,
                         timeout=WORKER_TIMEOUT_S)
    assert out.stdout.decode().strip() == str([c.__module__ + "." + c.__name__ for c in classes]), out.stderr[-2000:]


def test_a_loaded_processor_encodes_in_spawn_workers(tmp_path):
    """``IterableDataset.map(mmpipe.encode, fn_kwargs={"processor": load_processor(dir)})`` under a
    spawn DataLoader gives the rows of ``num_workers=0``."""
    testing.build_processor("qwen2_vl").save_pretrained(tmp_path)  # fresh: saving changes the processor
    raw = datasets.Dataset.from_list([_image_row(i) for i in range(2)])
    stream = raw.to_iterable_dataset().map(
        mmpipe.encode, fn_kwargs={"processor": load_processor(str(tmp_path))}, remove_columns=raw.column_names)

    def rows(**kw):
        return [_plain(r) for r in DataLoader(stream, batch_size=None, **kw)]

    assert rows(num_workers=1, multiprocessing_context="spawn", timeout=WORKER_TIMEOUT_S) == rows()


# ---- errors whose __init__ takes fields before the message, re-raised by DataLoader workers ----
@pytest.mark.parametrize("name, fields", [
    ("ShardReadError", dict(shard="s3://b/x")),
    ("DamagedShardError", dict(shard="s3://b/x", file="s3://b/x", rows_read=4, row_group=2, stage="validate")),
    ("DamagedDatasetError", dict(row=2, stage="validate")),
    ("RolloutRefusal", dict(stage=None, family=None)),
    ("RowDropped", dict(reason="too_long")),  # from its fields note (mmpipe.error_text.note_fields)
])
def test_a_dataloader_worker_re_raises_them_typed(name, fields):
    """torch re-raises a worker's error as ``type(e)(text)`` (a RuntimeError when that call fails):
    the type is kept, with the fields the text names."""
    e = _error_cases()[name]
    loader = DataLoader(_Items([], [functools.partial(pickle.loads, pickle.dumps(e))]), batch_size=None,
                        num_workers=1, timeout=WORKER_TIMEOUT_S)
    with pytest.raises(type(e)) as got:
        next(iter(loader))
    assert {k: getattr(got.value, k) for k in fields} == fields
    assert str(e) in str(got.value) and "DataLoader worker" in str(got.value)
