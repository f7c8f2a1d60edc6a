"""Testing stage: the ONE invariant harness every pipeline stage is tested through.

Each function checks one invariant of the data flow and raises a plain ``AssertionError``
naming the row (and the fields) that broke it; no pytest needed. torch is imported lazily.

    rows --collate--> batch --unbatch--> rows            assert_roundtrip
    rows --pack--> packed --unpack--> rows               assert_pack_roundtrip
    Arrow table --rows_from_arrow--> rows                assert_rows_from_arrow
    batch positions == each row's own positions          assert_positions_match_rows
    row positions == the M-RoPE rule on the row          assert_row_positions
    batched / packed logits == each row run alone        assert_batched_logits_match,
                                                         assert_packed_logits_match
    rollout logprobs == teacher-forced logprobs          policy_logprobs, assert_logprobs_match
    ReMA batch -> Arrow -> Python rows -> ReMA batch     assert_rema_roundtrip

Rows are given as :class:`~mmpipe.MultiModalInputs` or as stored dicts (what datasets /
Arrow give back); stored dicts are read with ``MultiModalInputs.from_dict``.

    >>> from mmpipe.testing import invariants                            # doctest: +SKIP
    >>> batch = invariants.assert_roundtrip(rows, processor=proc, padding_side="right")
    >>> invariants.assert_batched_logits_match(model, rows, proc, atol=1e-5)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import numpy as np

from mmpipe.batching.collate import collate
from mmpipe.batching.packing import pack, unpack
from mmpipe.batching.unbatch import unbatch
from mmpipe.errors import ArgumentError
from mmpipe.records.arrow import rows_from_arrow
from mmpipe.records.columns import to_numpy
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.packed import PackedMultiModalInputs

if TYPE_CHECKING:
    import torch

RowLike = Union[MultiModalInputs, Mapping[str, Any]]

__all__ = [
    "as_rows", "assert_rows_equal", "assert_roundtrip", "assert_pack_roundtrip", "assert_rows_from_arrow",
    "assert_unbatched_rows_valid", "assert_row_positions", "assert_positions_match_rows",
    "assert_batched_logits_match", "assert_packed_logits_match", "policy_logprobs", "logprob_gap",
    "assert_logprobs_match", "assert_rema_roundtrip",
]


def _prefix(label: str) -> str:
    return f"{label}: " if label else ""


# ---- rows in, rows out ----------------------------------------------------------------------
def as_rows(rows: Sequence[RowLike]) -> list[MultiModalInputs]:
    """The rows as `MultiModalInputs`, of any family (stored dicts are read with
    ``from_dict(d, row=i)``)."""
    return [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(rows)]


def assert_rows_equal(got: Sequence[RowLike], want: Sequence[RowLike], *, what: str = "the round trip",
                      label: str = "") -> None:
    """``got == want`` row by row (exact, `MultiModalInputs.__eq__`).

    Fails naming the first differing row and its differing fields (`MultiModalInputs.diff`),
    or the two lengths when the row counts differ.
    """
    got, want = as_rows(got), as_rows(want)
    pre = _prefix(label)
    assert len(got) == len(want), f"{pre}{what} gave {len(got)} rows, expected {len(want)}"
    for b, (g, w) in enumerate(zip(got, want)):
        assert not g.diff(w), \
            f"{pre}row {b} changed through {what}: fields {g.diff(w)} differ"


def assert_roundtrip(rows: Sequence[RowLike], batch: Any = None, *, label: str = "",
                     **collate_kwargs: Any) -> Any:
    """``unbatch(collate(rows)) == rows``; returns the batch.

    Args:
        rows: B rows, `MultiModalInputs` or stored dicts; without ``batch`` they go to
            ``collate`` as given (so stored dicts test the stored form).
        batch: a `BatchedMultiModalInputs` already built from ``rows`` (by a Collator, a
            DataLoader, ``trim``, ``to_padded``...), or a sequence of batches whose rows, in
            order, are ``rows`` (a DataLoader's output). Default: ``collate(rows, **collate_kwargs)``.
        label: prefix of the failure message (e.g. the case being run).
        **collate_kwargs: ``processor``, ``padding_side``, ``pad_to_multiple_of``... for collate.
    """
    if batch is None:
        batch = collate(rows, **collate_kwargs)
    elif collate_kwargs:
        raise ArgumentError(f"assert_roundtrip takes collate arguments or a ready batch, not both; "
                            f"got batch= and {sorted(collate_kwargs)}")
    batches = [batch] if isinstance(batch, BatchedMultiModalInputs) else list(batch)
    back = [r for b in batches for r in unbatch(b)]
    assert_rows_equal(back, rows, what="collate/unbatch", label=label)
    return batch


def assert_pack_roundtrip(rows: Sequence[RowLike], packed: Optional[PackedMultiModalInputs] = None, *,
                          label: str = "", **pack_kwargs: Any) -> PackedMultiModalInputs:
    """``unpack(pack(rows)) == rows``; returns the pack (``[1, T]`` tensors, T = total tokens).

    ``packed`` defaults to ``pack(rows, **pack_kwargs)``.
    """
    if packed is None:
        packed = pack(rows, **pack_kwargs)
    assert_rows_equal(unpack(packed), rows, what="pack/unpack", label=label)
    return packed


def assert_rows_from_arrow(table: Any, rows: Sequence[RowLike], *, label: str = "") -> list[MultiModalInputs]:
    """``rows_from_arrow(table) == rows`` (a pyarrow Table / RecordBatch of stored rows); returns them."""
    got = rows_from_arrow(table)
    assert_rows_equal(got, rows, what="rows_from_arrow", label=label)
    return got


def assert_unbatched_rows_valid(batch: BatchedMultiModalInputs) -> list[MultiModalInputs]:
    """Every row ``unbatch(batch)`` gives passes ``MultiModalInputs.validate(b)``; returns them.

    For batches whose source rows are not at hand (or were altered harmlessly).
    """
    rows = unbatch(batch)
    for b, r in enumerate(rows):
        r.validate(b)
    return rows


# ---- positions ------------------------------------------------------------------------------
def _grid_or_none(g: np.ndarray) -> Optional[np.ndarray]:
    return g if g is not None and len(g) else None


def assert_row_positions(row: RowLike, *, model: Any = None, row_index: Optional[int] = None) -> None:
    """A row's stored positions equal the M-RoPE rule recomputed on the row alone.

    ``position_ids`` int64 [3, L] and ``rope_delta`` == ``mmpipe.get_rope_index`` on the
    row's ids, token types and grids; with a transformers Qwen-VL ``model``, also ==
    ``model.model.get_rope_index`` (positions [3, 1, L], deltas [1, 1]).
    """
    import torch

    from mmpipe.compat import hf_get_rope_index
    from mmpipe.rope import get_rope_index  # imports torch

    r = MultiModalInputs.from_dict(row, row=row_index)
    where = f"row {row_index}" if row_index is not None else "row"
    kw = dict(image_grid_thw=_grid_or_none(r.image_grid_thw), video_grid_thw=_grid_or_none(r.video_grid_thw))
    sec = r.second_per_grid_ts if len(r.second_per_grid_ts) else None
    pos, delta = get_rope_index(r.input_ids, r.mm_token_type_ids, second_per_grid_ts=sec, family=r.family, **kw)
    assert np.array_equal(pos[:, 0].numpy(), r.position_ids), f"{where}: position_ids differ from the M-RoPE rule"
    assert int(delta) == r.rope_delta, f"{where}: rope_delta {r.rope_delta}, the rule gives {int(delta)}"
    if model is None:
        return
    t = {k: torch.as_tensor(v) if v is not None else None for k, v in kw.items()}
    takes_sec = r.fam.takes_second_per_grid_ts
    extra = {"second_per_grid_ts": torch.as_tensor(sec)} if sec is not None and takes_sec else {}
    ids = torch.as_tensor(r.input_ids)[None]
    hf_pos, hf_delta = hf_get_rope_index(model, ids, torch.as_tensor(r.mm_token_type_ids)[None], **t,
                                         attention_mask=torch.ones_like(ids), **extra)
    assert np.array_equal(hf_pos[:, 0].numpy(), r.position_ids), f"{where}: position_ids differ from transformers'"
    assert int(hf_delta) == r.rope_delta, f"{where}: rope_delta {r.rope_delta}, transformers gives {int(hf_delta)}"


def _real_slice(batch: BatchedMultiModalInputs, b: int) -> slice:
    """Where row b's real tokens sit in the padded length L."""
    n, L = int(batch.seq_lengths[b]), int(batch.input_ids.shape[1])
    return slice(L - n, L) if batch.padding_side == "left" else slice(0, n)


def assert_positions_match_rows(batch: BatchedMultiModalInputs, rows: Sequence[RowLike], *,
                                model: Any = None) -> None:
    """Batched positions (any padding side) equal each row's own positions.

    For every row b: ``batch.position_ids[:, b]`` (int64 [3, B, L]) at the row's real tokens
    == ``rows[b].position_ids`` [3, n], 0 at its pads; ``batch.rope_deltas[b]`` (int64 [B, 1])
    == ``rows[b].rope_delta``; and the row's positions are the M-RoPE rule on the row alone
    (`assert_row_positions`, also against transformers when ``model`` is given).
    """
    rows = as_rows(rows)
    assert batch.batch_size == len(rows), f"the batch holds {batch.batch_size} rows, expected {len(rows)}"
    for b, r in enumerate(rows):
        sl = _real_slice(batch, b)
        pos = batch.position_ids[:, b].cpu().numpy()
        assert np.array_equal(pos[:, sl], r.position_ids), f"row {b}: batched position_ids differ from the row's own"
        pads = np.ones(pos.shape[1], bool)
        pads[sl] = False
        assert not pos[:, pads].any(), f"row {b}: position_ids are not 0 at the pads"
        got = int(batch.rope_deltas[b].reshape(-1)[0])
        assert got == r.rope_delta, f"row {b}: batched rope_delta {got}, the row's own is {r.rope_delta}"
        assert_row_positions(r, model=model, row_index=b)


# ---- model outputs --------------------------------------------------------------------------
def _alone_logits(model: Any, row: RowLike, processor: Any, reference: Optional[Mapping[str, Any]]) -> "torch.Tensor":
    """float [n, V]: the logits of the row run alone (its own kwargs, or ``collate([row])``)."""
    import torch

    if reference is None:
        kw = collate([row], processor=processor).model_inputs()
    else:
        kw = {k: torch.as_tensor(v) for k, v in reference.items()}
    return model(**kw).logits[0]


def _references(rows: Sequence[Any], references: Optional[Sequence[Optional[Mapping[str, Any]]]]) -> list:
    if references is None:
        return [None] * len(rows)
    assert len(references) == len(rows), f"{len(references)} references for {len(rows)} rows"
    return list(references)


def assert_batched_logits_match(model: Any, rows: Sequence[RowLike], processor: Any = None, *,
                                batch: Optional[BatchedMultiModalInputs] = None,
                                references: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
                                rtol: float = 1e-5, atol: float = 1e-5, padding_side: str = "left") -> "torch.Tensor":
    """The padded batch's logits at each row's real tokens equal the row's logits alone.

    Args:
        model: a transformers causal LM (Qwen-VL or text), in eval mode.
        rows: B rows (`MultiModalInputs` or stored dicts).
        processor: the processor / tokenizer the rows were encoded with (for ``collate``).
        batch: the batch to check; default ``collate(rows, processor=processor, padding_side=...)``.
        references: per row, the kwargs of the row's own forward (e.g. the transformers
            processor's output, or ``{"input_ids": [1, n]}``); ``None`` (or a ``None`` entry):
            ``collate([row]).model_inputs()``.
        rtol, atol: ``torch.testing.assert_close`` tolerances.

    Returns:
        float [B, L, V]: the batch's logits.
    """
    import torch

    if batch is None:
        batch = collate(rows, processor=processor, padding_side=padding_side)
    refs = _references(rows, references)
    with torch.no_grad():
        logits = model(**batch.model_inputs()).logits
        for b, (row, ref_kw) in enumerate(zip(rows, refs)):
            ref = _alone_logits(model, row, processor, ref_kw)
            n = int(batch.seq_lengths[b])
            assert ref.shape[0] == n, f"row {b}: {n} tokens in the batch, {ref.shape[0]} when run alone"
            torch.testing.assert_close(logits[b, _real_slice(batch, b)], ref, rtol=rtol, atol=atol,
                                       msg=lambda m, b=b: f"row {b}: batched logits differ from the row alone: {m}")
    return logits


def assert_packed_logits_match(model: Any, rows: Sequence[RowLike], processor: Any = None, *,
                               packed: Optional[PackedMultiModalInputs] = None,
                               references: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
                               rtol: float = 1e-5, atol: float = 1e-5) -> Any:
    """The pack's logits (``[1, T, V]``, split at ``cu_seqlens``) equal each row's logits alone.

    ``packed`` defaults to ``pack(rows, processor=processor)``; ``references`` as in
    `assert_batched_logits_match`. Returns the model's output on the pack (``.logits``,
    ``.loss`` when the pack carries labels).
    """
    import torch

    if packed is None:
        packed = pack(rows, processor=processor)
    refs = _references(rows, references)
    with torch.no_grad():
        out = model(**packed.model_inputs())
        per_row = packed.split(out.logits)
        for k, (row, ref_kw) in enumerate(zip(rows, refs)):
            ref = _alone_logits(model, row, processor, ref_kw)
            torch.testing.assert_close(per_row[k], ref, rtol=rtol, atol=atol,
                                       msg=lambda m, k=k: f"row {k}: packed logits differ from the row alone: {m}")
    return out


# ---- rollout / training consistency ---------------------------------------------------------
def policy_logprobs(model: Any, batch: BatchedMultiModalInputs) -> list[np.ndarray]:
    """Per row, float32 [n_labelled]: the teacher-forced logprobs at the row's labelled tokens
    (``labels != -100``), i.e. the training side of the rollout consistency check."""
    from mmpipe.rollout.transformers_engine import teacher_forced_logprobs

    lp = teacher_forced_logprobs(model, batch)
    mask = batch.labels != -100
    return [lp[b][mask[b]].cpu().numpy() for b in range(batch.batch_size)]


def _row_gap(g: Any, w: Any, b: int) -> float:
    g, w = to_numpy(g), to_numpy(w)  # torch on any device, bfloat16 read as float32
    assert g.shape == w.shape, f"row {b}: logprobs of shape {g.shape}, expected {w.shape}"
    return float(np.abs(g - w).max()) if g.size else 0.0


def logprob_gap(got: Sequence[Any], want: Sequence[Any]) -> float:
    """max |got - want| over all rows (float32 [n_b] each: numpy, lists or torch tensors on any device,
    bfloat16 ones read as float32); asserts the per-row shapes agree."""
    assert len(got) == len(want), f"{len(got)} rows of logprobs, expected {len(want)}"
    return max([_row_gap(g, w, b) for b, (g, w) in enumerate(zip(got, want))], default=0.0)


def assert_logprobs_match(got: Sequence[Any], want: Sequence[Any], *, atol: float = 1e-4) -> float:
    """Per row, training-side logprobs ``got`` equal rollout-side ``want`` within ``atol``
    (same shapes, max abs gap); fails naming the row and its gap. Returns the overall gap."""
    assert len(got) == len(want), f"{len(got)} rows of logprobs, expected {len(want)}"
    gaps = [_row_gap(g, w, b) for b, (g, w) in enumerate(zip(got, want))]
    for b, gap in enumerate(gaps):
        assert gap <= atol, f"row {b}: logprob gap {gap:.3g} > atol {atol:.3g}"
    return max(gaps, default=0.0)


# ---- ReMA ------------------------------------------------------------------------------------
def assert_rema_roundtrip(batch: Any) -> Any:
    """A `ReMABatch` survives Arrow and Python rows: ``to_arrow`` has the ReMA schema, and
    ``from_arrow(Table.from_pylist(table.to_pylist()))`` has no field differing from ``batch``
    (pixel_values float32 [N, patch_dim] equal). Returns the batch read back."""
    import pyarrow as pa
    import torch

    from mmpipe.records.rema import ReMABatch, rema_arrow_schema

    table = batch.to_arrow()
    want = rema_arrow_schema(batch.agent_roles, family=batch.family, max_num_turns=batch.max_num_turns)
    assert table.schema.equals(want, check_metadata=True), f"ReMA Arrow schema differs:\n{table.schema}\nexpected\n{want}"
    back = ReMABatch.from_arrow(pa.Table.from_pylist(table.to_pylist(), schema=table.schema))
    assert batch.diff(back) == [], f"ReMA batch changed through Arrow: fields {batch.diff(back)} differ"
    if batch.image_grid_thw.shape[0]:
        assert torch.equal(back.pixel_values, batch.pixel_values), "ReMA pixel_values changed through Arrow"
    return back
