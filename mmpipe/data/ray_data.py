"""Ray Data: encode raw rows with ``ray.data.Dataset.map_batches`` on a Ray cluster, every family.

`RayBatchEncoder` is a callable class: Ray builds one instance per actor (worker), so the
processor is loaded once per worker, and calls it on each batch. A batch in any Ray batch
format (``"pyarrow"``, ``"numpy"``, ``"pandas"``) goes through the one encode pipeline (the
`mmpipe.Encoder` that ``datasets.map(mmpipe.encode, batched=True)`` calls) and comes out as an
Arrow table with the columns and types ``datasets.map(mmpipe.encode)`` stores, for every family
(patch grids, tiles, the generic path), so the rows equal ``datasets.map``'s and a parquet written
by Ray loads with ``datasets``.

Size the actor pool from the cluster (`cluster_workers`: its CPUs less one for reading and
writing), with ``compute=ray.data.ActorPoolStrategy(size=n)`` (Ray 2.60 deprecates
``concurrency=``; a pool larger than the cluster's CPUs waits forever)::

    import ray
    from mmpipe.data.ray_data import RayBatchEncoder, cluster_workers

    ray.init()                                                # or ray.init(address="auto")
    ds = ray.data.read_parquet("/shared/raw/")                # or ray.data.from_huggingface(hf_ds)
    enc = ds.map_batches(RayBatchEncoder, fn_constructor_args=("/shared/models/Qwen2.5-VL-7B",),
                         fn_constructor_kwargs={"max_length": 4096, "truncation": "drop"},
                         batch_size=16, batch_format="pyarrow", num_cpus=1,
                         compute=ray.data.ActorPoolStrategy(size=cluster_workers()))
    enc.write_parquet("/shared/encoded/")
    train = datasets.load_dataset("parquet", data_files="/shared/encoded/*.parquet")["train"]

(`encode_with_ray(ds, processor, **options)` is that call.) ``ray`` is an optional extra
(``pip install -e ".[ray]"``); this module does not import it at import time.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import ArgumentError, InputError
from mmpipe.encoding.mapping import DROP_REASON_COLUMN, is_batch
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.processors import load_processor
from mmpipe.records.row import MultiModalInputs


def _plain(value: Any) -> Any:
    """Ray's numpy batch values -> what `mmpipe.encode` parses: object arrays (lists, structs)
    become lists, numpy strings/scalars become Python ones; numeric arrays (e.g. uint8
    images) stay arrays."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value] if value.dtype == object else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.str_):
        return str(value)
    if isinstance(value, np.bytes_):
        return bytes(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def batch_rows(batch: Any) -> list[dict]:
    """One Ray batch (``pyarrow.Table``, ``pandas.DataFrame`` or dict of numpy / pyarrow
    columns) -> a list of raw row dicts."""
    if isinstance(batch, (pa.Table, pa.RecordBatch)):
        return batch.to_pylist()
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas, without importing it
        return [_plain(r) for r in batch.to_dict("records")]
    if isinstance(batch, dict):
        cols = {k: (v.to_pylist() if isinstance(v, (pa.Array, pa.ChunkedArray)) else v) for k, v in batch.items()}
        n = len(next(iter(cols.values()))) if cols else 0
        return [{k: _plain(v[i]) for k, v in cols.items()} for i in range(n)]
    raise TypeError(f"expected a Ray batch (pyarrow.Table, pandas.DataFrame or dict of columns), found {type(batch).__name__}")


def _offsets(counts) -> pa.Array:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return pa.array(out.astype(np.int32))


def _column(values: list, typ: pa.DataType) -> pa.Array:
    """Stored-row values of one column (numpy arrays from `MultiModalInputs.to_dict`) -> Arrow."""
    if pa.types.is_list(typ) and pa.types.is_list(typ.value_type):  # 2-D [n, width] per row
        inner_t = typ.value_type.value_type
        arrs = [np.asarray(v) for v in values]
        widths = [a.shape[1] if a.ndim == 2 else 0 for a in arrs]
        inner_counts = [w for a, w in zip(arrs, widths) for _ in range(a.shape[0])]
        flat = np.concatenate([a.reshape(-1) for a in arrs]) if arrs else np.zeros(0)
        inner = pa.ListArray.from_arrays(_offsets(inner_counts), pa.array(flat.astype(inner_t.to_pandas_dtype()), inner_t))
        return pa.ListArray.from_arrays(_offsets([a.shape[0] for a in arrs]), inner)
    if pa.types.is_list(typ):
        arrs = [np.asarray(v).reshape(-1) for v in values]
        flat = np.concatenate(arrs) if arrs else np.zeros(0)
        vals = pa.array(flat.astype(typ.value_type.to_pandas_dtype()), typ.value_type)
        return pa.ListArray.from_arrays(_offsets([len(a) for a in arrs]), vals)
    return pa.array([v.item() if isinstance(v, np.generic) else v for v in values], type=typ)


def rows_to_arrow(rows: Sequence[dict], schema: pa.Schema) -> pa.Table:
    """Stored rows (``MultiModalInputs.to_dict()``) -> an Arrow table with ``schema`` (the
    layout ``datasets.map(mmpipe.encode)`` writes), built from flat buffers."""
    return pa.Table.from_arrays([_column([r[f.name] for r in rows], f.type) for f in schema], schema=schema)


class RayBatchEncoder:
    """``map_batches`` callable class: raw-row batch -> encoded Arrow table (one row per kept row),
    for every family: the batch goes through the `mmpipe.encoding.encoder.Encoder` that
    ``datasets.map(mmpipe.encode, batched=True)`` calls (`mmpipe.encoding.mapping`: image prefetch,
    the batched layout path, drops, ``on_error``), and its columns become Arrow as ``datasets``'
    writer types them, so the rows and types equal ``datasets.map``'s (Qwen-VL, GLM, Gemma 3,
    InternVL, LLaVA-OneVision, the generic path).

    Args:
        processor: a path every worker can read (`mmpipe.processors.load_processor`), a
            zero-argument factory, or a processor object (shipped pickled to each worker).
            Loaded once, in ``__init__``, i.e. once per Ray actor.
        keep_columns: input columns copied to the output (e.g. an id).
        index_column: a column whose value names the row in error messages (Ray batches
            carry no global row index).
        **options: `mmpipe.Encoder` options (``max_length``, ``truncation``, ``pixels``,
            ``on_error``, ``family="generic"`` ...). ``truncation="drop"`` leaves rows out (count
            them with ``ds.count()``); ``on_error="skip"`` keeps a failing row as an empty row with
            its error in ``mmpipe_error``, as ``datasets.map`` does. ``threads`` defaults to the
            CPUs Ray gave the actor.

    ``__call__(batch)`` -> ``pyarrow.Table``: the encoded columns in ``datasets.map``'s order and
    types (its ``datasets.Features`` in the schema metadata, so a parquet Ray writes loads with
    them), plus ``keep_columns``. The first batch an actor encodes fixes its column types, as the
    first batch ``datasets`` writes does.
    """

    def __init__(self, processor: Any, *, keep_columns: Sequence[str] = (), index_column: Optional[str] = None,
                 **options):
        self.processor = load_processor(processor)
        if options.get("threads") is None:
            options["threads"] = actor_cpus()
        self.encoder = Encoder(self.processor, **options)
        self.encoder.mark_dropped = True  # dropped rows stay, marked, so the kept ones are known
        self.keep_columns = column_names(keep_columns)
        self.index_column = index_column
        self.features = None  # the first batch's datasets.Features, as datasets' writer keeps them
        self._names = None
        self._kind_features = None

    def __call__(self, batch: Any) -> pa.Table:
        rows = batch_rows(batch)
        _check_inputs(rows, self.keep_columns, self.index_column)
        if not rows:  # Ray hands over empty blocks too: the same columns and types, no row
            return self._with_inputs(self._empty(), batch, rows, [])
        columns = {k: [r.get(k) for r in rows] for k in rows[0]}
        idx = [r.get(self.index_column) for r in rows] if self.index_column else None
        try:
            if is_batch(columns):
                out = self.encoder(columns, idx)  # the batched path datasets.map(batched=True) takes
            else:  # no messages / prompt column: row by row, each row's own parse error
                out = _columns([self.encoder.encode_one(r, None if idx is None else idx[i])
                                for i, r in enumerate(rows)])
        except InputError as e:
            raise _ray_advice(e) if e.row is None else e
        if ERROR_COLUMN in out and idx is None:
            out[ERROR_COLUMN] = [_ray_advice(x) for x in out[ERROR_COLUMN]]
        kept = [i for i, why in enumerate(out.pop(DROP_REASON_COLUMN)) if not why]
        encoded = self._encoded_names()
        out = {k: v for k, v in out.items() if k in encoded or k not in columns}
        if len(kept) != len(rows):
            out = {k: [v[i] for i in kept] for k, v in out.items()}
        return self._with_inputs(self._to_arrow(out), batch, rows, kept)

    def _with_inputs(self, table: pa.Table, batch: Any, rows: list, kept: list) -> pa.Table:
        """``table`` plus the ``keep_columns`` of the kept input rows."""
        for name in self.keep_columns:
            if name in table.column_names:
                raise ArgumentError(f"keep_columns: {name!r} is an encoded column; keep_columns accepts input "
                                    "columns only: rename the input column")
            table = table.append_column(name, _input_column(batch, rows, name, kept))
        return table

    def _encoded_names(self) -> set:
        if self._names is None:
            self._names = set(self.encoder.empty_row_dict())
        return self._names

    def _to_arrow(self, out: dict) -> pa.Table:
        """Columns -> Arrow exactly as ``datasets``' ``ArrowWriter.write_batch`` types them. A type
        inferred from nothing but empty values (``list<null>``: a batch without images) takes the
        kind's declared type, and is not kept: a later batch's values type it."""
        import datasets
        from datasets.arrow_writer import OptimizedTypedSequence

        fixed = self.features if self.features is not None else datasets.Features()
        arrays, inferred, complete = [], datasets.Features(), True
        for col, values in out.items():
            seq = OptimizedTypedSequence(values, type=fixed.get(col), col=col)
            arr = pa.array(seq)
            typ = fixed.get(col) or seq.get_inferred_type()
            if col not in fixed and _has_null(arr.type):
                typ, complete = self._declared(col, typ), False
                arr = pa.array(OptimizedTypedSequence(values, type=typ, col=col))
            arrays.append(arr)
            inferred[col] = typ
        if self.features is None and arrays and len(arrays[0]) and complete:
            self.features = inferred
        return pa.Table.from_arrays(arrays, schema=inferred.arrow_schema)

    def _declared(self, col: str, inferred):
        """The stored type of ``col`` for this encoder's kind (or ``inferred`` when it has none)."""
        if self._kind_features is None:
            enc = self.encoder
            self._kind_features = MultiModalInputs.features(enc.pixels, enc.labels, enc.family.kind)
        if col in self._kind_features:
            return self._kind_features[col]
        return SOURCES_FEATURE() if col == "image_sources" else inferred

    def _empty(self) -> pa.Table:
        """No row, in the columns and types of this actor's batches (before the first: those of
        an encoded empty row, typed as the first batch will be)."""
        if self.features is not None:
            return self.features.arrow_schema.empty_table()
        row = dict(self.encoder.empty_row_dict())
        if self.encoder.on_error == "skip":
            row[ERROR_COLUMN] = ""
        table = self._to_arrow({k: [v] for k, v in row.items()})
        self.features = None  # a real batch fixes them
        return table.slice(0, 0)


# what an error of a row of unknown index advises (`mmpipe.errors.InputError.location`), and the option
# that names rows here: Ray batches carry no row index and there is no map(with_indices=True)
_MAP_ADVICE, _RAY_ADVICE = "pass with_indices=True to map", "pass index_column= to RayBatchEncoder"


def _ray_advice(x):
    """An error (its location and detail) or a stored error record with the advice for Ray."""
    if isinstance(x, str):
        return x.replace(_MAP_ADVICE, _RAY_ADVICE)
    x.detail, location = _ray_advice(x.detail), x.location()
    if _MAP_ADVICE in location:
        x.where = _ray_advice(location)  # "row (index unknown: ...), image 1" as it was, other advice
    return x.restage(x.stage)  # the message composed again


def SOURCES_FEATURE():
    """``image_sources``: list<binary> (`mmpipe.records.columns.OPTIONAL_ROW_COLUMNS`)."""
    import datasets

    return datasets.List(datasets.Value("binary"))


def _has_null(typ: pa.DataType) -> bool:
    if pa.types.is_null(typ):
        return True
    return any(_has_null(typ.field(i).type) for i in range(typ.num_fields))


def column_names(names: Any) -> list:
    """``keep_columns`` as a list of column names (one name alone as a string)."""
    names = [names] if isinstance(names, str) else names
    if names is None or not all(isinstance(n, str) for n in names):
        raise ArgumentError(f"keep_columns must be column names (a list of str, or one str), got {names!r}")
    return list(names)


def _check_inputs(rows: list, keep_columns: list, index_column: Optional[str]) -> None:
    """Each ``keep_columns`` name and ``index_column`` must be an input column (checked on the batch's
    first row: Ray's rows share the dataset's schema)."""
    if not rows:
        return
    for what, name in [("keep_columns", n) for n in keep_columns] + [("index_column", index_column)]:
        if name is not None and name not in rows[0]:
            raise ArgumentError(f"{what}: {name!r} is not a column of the input rows (columns: "
                                f"{sorted(rows[0])}); pass an input column's name")


def _columns(rows: list) -> dict:
    return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


def _input_column(batch: Any, rows: list, name: str, kept: list) -> pa.Array:
    """Input column ``name`` of the kept rows, in its Arrow type where the batch has one."""
    if isinstance(batch, (pa.Table, pa.RecordBatch)) and name in batch.column_names:
        return batch.column(name).take(pa.array(kept, pa.int64()))
    if isinstance(batch, dict) and isinstance(batch.get(name), np.ndarray) and batch[name].dtype != object:
        return pa.array(batch[name][np.asarray(kept, np.int64)])  # keeps the dtype when no row is left
    if hasattr(batch, "columns") and name in batch.columns and batch[name].dtype != object:  # pandas
        return pa.array(batch[name].to_numpy()[np.asarray(kept, np.int64)])  # the dtype, with no row left too
    return pa.array([rows[i][name] for i in kept])


def actor_cpus() -> Optional[int]:
    """CPUs Ray assigned to the current task or actor (None outside Ray): the encoder's image
    threads there (the process sees every core of the node otherwise)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - the driver, or an older Ray: leave the default
        return None
    return max(1, int(cpus)) if cpus else None


def cluster_workers(*, cpus_per_worker: float = 1.0, reserve_cpus: float = 1.0) -> int:
    """Encoder actors the connected Ray cluster can hold: its CPUs (``ray.cluster_resources()``) less
    ``reserve_cpus`` left for the read and write tasks, over ``cpus_per_worker``; at least 1. Pass it
    as ``compute=ray.data.ActorPoolStrategy(size=n)`` (a pool larger than the CPUs waits forever for
    actors that never start: 32 on a 2-CPU machine)."""
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1))
    return max(1, int((cpus - reserve_cpus) // cpus_per_worker))


def encode_with_ray(ds, processor: Any, *, workers: Optional[int] = None, batch_size: int = 16,
                    keep_columns: Sequence[str] = (), index_column: Optional[str] = None, **options):
    """``ds.map_batches(RayBatchEncoder, ...)`` on an actor pool sized from the cluster
    (`cluster_workers`, or ``workers``), one CPU per actor, pyarrow batches. Returns the lazy
    ``ray.data.Dataset`` of encoded rows (``.write_parquet(url)``, ``.take_all()`` ...)."""
    import ray

    if not hasattr(ds, "map_batches"):
        raise ArgumentError(f"ds must be a ray.data.Dataset, got {type(ds).__name__}: wrap a datasets.Dataset "
                            "with ray.data.from_huggingface(ds), or use mmpipe.encode_dataset")
    for name, value in (("workers", workers), ("batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ArgumentError(f"{name} must be an int >= 1{' or None (sized from the cluster)' if name == 'workers' else ''}, "
                                f"got {value!r}")
    n = workers or cluster_workers()
    return ds.map_batches(RayBatchEncoder, fn_constructor_args=(processor,),
                          fn_constructor_kwargs={"keep_columns": column_names(keep_columns), "index_column": index_column,
                                                 **options},
                          batch_size=batch_size, batch_format="pyarrow", num_cpus=1,
                          compute=ray.data.ActorPoolStrategy(size=n))
