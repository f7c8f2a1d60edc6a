"""transformers ``Trainer`` and TRL ``SFTTrainer``: encoded rows -> the Mapping their loop feeds
to ``model(**inputs)``.

::

    args = TrainingArguments("out", per_device_train_batch_size=4, **trainer_settings())
    trainer = Trainer(model=model, args=args, train_dataset=enc, data_collator=TrainerCollator(processor))
    trainer.train()

Why the settings (`trainer_settings`, `sft_settings`):

- ``remove_unused_columns=False``: by default the Trainer keeps only the dataset columns the
  model's ``forward`` names (TRL's SFTTrainer only ``input_ids``/``labels``/``seq_lengths``),
  so ``family``, ``pixel_values_u8``, ``rope_delta`` ... are gone before collate. The collator
  refuses such rows with an error naming this setting.
- ``accelerator_config={"dispatch_batches": False}``: with an ``IterableDataset`` (streaming),
  accelerate by default builds each batch on rank 0 and slices every tensor along dim 0 for the
  ranks. ``pixel_values`` ``[N, D]`` (patches of all rows) and ``position_ids`` ``[3, B, L]`` are
  not batch-first, so the slices lose patches / positions and the vision tower fails
  (`TrainerCollator` refuses such a batch by name, `check_not_dispatched`). Without
  dispatch, each rank iterates its own loader.
- ``ddp_find_unused_parameters=True``: on several ranks, a step where one rank's batch holds no
  image leaves the vision tower without gradients there. With ``gradient_checkpointing=True`` the
  Trainer builds DDP with ``find_unused_parameters=False``, and the ranks then wait on different
  collectives forever (a hang, no error). With it DDP skips the unused parameters; without
  checkpointing it is the Trainer's own default. It needs non-reentrant checkpointing (DDP fails at
  the first step with "Expected to mark a variable ready only once" otherwise): recent
  transformers checkpoint so by default, for older ones (4.x) the settings add
  ``gradient_checkpointing_kwargs={"use_reentrant": False}``.
- TRL only: ``dataset_kwargs={"skip_prepare_dataset": True}``: the dataset is already encoded
  (ids, labels, images); SFTTrainer must not tokenize, truncate or add EOS to it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any, Sequence

from mmpipe.batching.collate import Collator
from mmpipe.errors import ArgumentError
from mmpipe.records.batch import BatchedMultiModalInputs

__all__ = ["TrainerCollator", "trainer_settings", "sft_settings"]


def trainer_settings(**yours: Any) -> dict[str, Any]:
    """``TrainingArguments`` keywords an encoded dataset needs (see the module docstring):
    ``remove_unused_columns=False``, ``accelerator_config={"dispatch_batches": False}``,
    ``ddp_find_unused_parameters=True``, and ``gradient_checkpointing_kwargs={"use_reentrant": False}``
    where ``TrainingArguments`` has no ``activation_checkpointing_kwargs`` yet (4.x and earlier 5.x,
    whose ``gradient_checkpointing_enable`` defaults to reentrant checkpointing; 5.25's
    ``activation_checkpointing_enable`` defaults to ``use_reentrant=False``).

    ``yours``: your own keywords, merged in (``TrainingArguments(**trainer_settings(bf16=True,
    gradient_checkpointing_kwargs={...}))`` instead of a duplicate-keyword ``TypeError``); the dict
    settings (``accelerator_config``, ``gradient_checkpointing_kwargs``) merge key by key. A value
    that undoes a setting the rows need (``remove_unused_columns=True``, ``dispatch_batches=True``)
    is an `ArgumentError`."""
    from transformers import TrainingArguments

    settings = {"remove_unused_columns": False, "accelerator_config": {"dispatch_batches": False},
                "ddp_find_unused_parameters": True}
    if "activation_checkpointing_kwargs" not in TrainingArguments.__dataclass_fields__:
        settings["gradient_checkpointing_kwargs"] = {"use_reentrant": False}  # DDP refuses reentrant with the above
    return merge_settings(settings, yours, "trainer_settings")


def merge_settings(settings: dict[str, Any], yours: Mapping[str, Any], who: str) -> dict[str, Any]:
    """``settings`` with the user's keywords ``yours`` merged in (dict values key by key); refuses
    ``remove_unused_columns=True`` and ``accelerator_config`` ``dispatch_batches=True`` (the rows'
    columns stripped / their batches cut along dim 0) with an `ArgumentError` naming ``who``."""
    out = dict(settings)
    for key, value in yours.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. transformers' AcceleratorConfig:
            value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}  # its set fields
        mine = settings.get(key)
        out[key] = {**mine, **value} if isinstance(mine, dict) and isinstance(value, Mapping) else value
    if out.get("remove_unused_columns") is not False:
        raise ArgumentError(f"{who}(remove_unused_columns={out.get('remove_unused_columns')!r}): the Trainer would "
                            "strip every encoded column the model's forward does not name (pixel_values_u8, family, "
                            "rope_delta ...) before collate; leave it out (the settings set it False)")
    accel = out.get("accelerator_config")
    if accel is not None and (not isinstance(accel, Mapping) or accel.get("dispatch_batches") is not False):
        raise ArgumentError(f"{who}(accelerator_config={accel!r}): pass it as a dict without dispatch_batches=True "
                            "(accelerate would cut pixel_values [N, D] and position_ids [3, B, L] along dim 0); "
                            "the settings add dispatch_batches=False to the dict you pass")
    return out


def sft_settings(**yours: Any) -> dict[str, Any]:
    """``trl.SFTConfig`` keywords for an encoded dataset: `trainer_settings` plus
    ``dataset_kwargs={"skip_prepare_dataset": True}``; ``yours`` merged in as there."""
    settings = {**trainer_settings(), "dataset_kwargs": {"skip_prepare_dataset": True}}
    return merge_settings(settings, yours, "sft_settings")


class TrainerCollator:
    """``data_collator`` for ``transformers.Trainer`` / ``trl.SFTTrainer``: encoded rows -> a dict.

    Returns the forward kwargs of `mmpipe.BatchedMultiModalInputs.model_inputs` plus ``labels``:
    ``input_ids`` / ``attention_mask`` / ``mm_token_type_ids`` / ``labels`` int64 [B, L],
    ``position_ids`` int64 [3, B, L] (``positions="verl"``: [4, B, L]), and when the batch holds
    images ``pixel_values`` float32 [N, 3*T*p*p] + ``image_grid_thw`` int64 [I, 3] (videos
    likewise). The Trainer moves them to the device and calls ``model(**batch)``.

    ``collator_options`` go to `mmpipe.Collator` (``pad_to_multiple_of``, ``family``,
    ``pad_token_id``, ``verify_pixels``); ``padding_side`` defaults to ``"right"`` here (training).
    A 1-D family's processor (Gemma 3, InternVL, LLaVA-OneVision, the generic path) gives its
    batch's inputs as they are: ``position_ids`` int64 [B, L], ``pixel_values`` float32
    [N, 3, S, S], Gemma 3's ``token_type_ids``, LLaVA-OneVision's ``image_sizes``.
    Picklable (``dataloader_num_workers > 0``). ``pixels_on_device=True`` is an `ArgumentError`: the
    Trainer never calls ``model_inputs(device)``, so the pixels would be expanded on the CPU here. Rows stripped by ``remove_unused_columns=True``
    or rows without labels raise `ArgumentError` saying what to change. The first batch of a loader
    checks the loader's whole dataset for rows that failed to encode under ``on_error="skip"``
    (`check_loader_dataset`): an `InputError` naming the dataset row before the first step, not
    when the failed row's batch comes up, possibly hours in.
    """

    def __init__(self, processor=None, *, padding_side: str = "right", positions: str = "mrope", **collator_options):
        if positions not in ("mrope", "verl"):
            raise ArgumentError(f"positions must be 'mrope' or 'verl', got {positions!r}")
        if collator_options.get("pixels_on_device"):
            raise ArgumentError(
                "TrainerCollator(pixels_on_device=True): the Trainer moves the collator's dict to the device "
                "itself and never calls batch.model_inputs(device), so the uint8 pixels would be expanded to "
                "float32 on the CPU inside the collator (the model gets the same float32 pixel_values: nothing "
                "saved). Leave it out (the expansion then runs in the DataLoader workers with "
                "dataloader_num_workers > 0), or, in a training loop of your own, use "
                "mmpipe.Collator(processor, pixels_on_device=True) and batch.model_inputs(device)")
        self.collator = Collator(processor, padding_side=padding_side, **collator_options)
        self.positions = positions
        self._checked: list = []  # the loader datasets checked for failed rows (this process)

    def __getstate__(self) -> dict:  # a DataLoader worker (spawn) checks the datasets again
        return {**vars(self), "_checked": []}

    def __call__(self, rows: Sequence[Any]) -> dict[str, Any]:
        check_loader_dataset(self._checked)
        check_not_stripped(rows)
        check_not_truncated(rows)
        batch = self.collator(rows)
        if batch.labels is None:
            raise ArgumentError(
                "the rows carry no labels (encoded with labels=False, e.g. RL prompts): the Trainer's loss "
                "needs them; re-encode with labels=True (the default) for SFT")
        # the 1-D families (tiles, generic path) take their own positions [B, L]
        positions = self.positions if batch.position_ids.ndim == 3 else None
        out = batch.model_inputs(positions=positions, labels=False)
        out["labels"] = batch.as_torch().labels  # the 1-D kinds' batches hold numpy fields
        check_not_dispatched(out)
        return out


def _live_loader():
    """The dataloader accelerate is iterating now (the Trainer's, wrapped by accelerate), or None
    (accelerate not imported, or no loader of its being iterated: a loop of your own)."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.GradientState._shared_state:
        return None
    refs = getattr(state.GradientState(), "dataloader_references", None)
    return refs[-1] if refs else None


def check_loader_dataset(checked: list) -> None:
    """`check_dataset_not_failed` on the dataset of the loader being iterated (`_live_loader`), once per
    dataset (``checked``: those seen). Why here: the Trainer hands the collator rows, never the dataset,
    so a row that failed to encode under ``on_error="skip"`` was refused only when its batch came up
    (possibly hours in) and named by its place in that batch; the collator's first call of a loader
    comes before the first step, and the error names the row in the dataset."""
    from mmpipe.batching.checks import check_dataset_not_failed

    dataset = getattr(_live_loader(), "dataset", None)
    if dataset is None or any(d is dataset for d in checked):
        return
    check_dataset_not_failed(dataset, "TrainerCollator (the Trainer's train / eval dataset)")
    checked.append(dataset)


def check_not_dispatched(out: Mapping[str, Any]) -> None:
    """Refuse a batch that accelerate is about to dispatch (``dispatch_batches=True``, its default for
    an ``IterableDataset``): it concatenates the batches rank 0 collated along dim 0 and cuts every
    tensor into ``num_processes`` equal slices of it (one slice with ``split_batches=True``), which
    mixes up the tensors that are not ``[B, L, ...]`` (``pixel_values`` [N, D], ``image_grid_thw``
    [I, 3], ``position_ids`` [3, B, L]): rows got other rows' patches, and the model failed with a bare
    size mismatch (measured on 1 and 2 ranks). Read from accelerate's live dataloader."""
    loader = _live_loader()
    if loader is None:
        return
    from accelerate.data_loader import DataLoaderDispatcher

    if not isinstance(loader, DataLoaderDispatcher):  # the loader being iterated now (a wrapped collator too)
        return
    rows = tuple(out["input_ids"].shape)
    mixed = sorted(k for k, v in out.items() if hasattr(v, "shape") and tuple(v.shape[:2]) != rows)
    if mixed:
        raise ArgumentError(
            f"accelerate dispatches this loader's batches (dispatch_batches=True, its default for an IterableDataset): "
            f"it would slice every tensor along dim 0 for the ranks, but {mixed} are not [B, L, ...] (input_ids "
            f"{list(rows)}), so the ranks would get other rows' patches and positions. Pass accelerator_config="
            "{'dispatch_batches': False} in TrainingArguments / SFTConfig (each rank then reads its own batches), "
            "e.g. TrainingArguments(..., **mmpipe.hosts.trainer_settings())")


def check_not_truncated(rows: Sequence[Any]) -> None:
    """Refuse dict rows whose ``input_ids`` and ``labels`` were cut after encoding while the other
    per-token columns kept their length: ``trl.SFTTrainer`` prepares a dataset it is not told to
    skip (``dataset_kwargs={"skip_prepare_dataset": True}``) by truncating only ``input_ids`` and
    ``labels`` to its ``max_length`` (1024 by default) and dropping the rows left without a target
    token. The collator would otherwise blame the row's encoding."""
    if not isinstance(rows, (list, tuple)):
        return
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "family" not in row or row.get("input_ids") is None:
            continue
        n = len(row["input_ids"])
        mask = row.get("attention_mask")
        if mask is None or len(mask) == n or (row.get("labels") is not None and len(row["labels"]) != n):
            continue
        raise ArgumentError(
            f"row {i}: input_ids and labels hold {n} tokens but attention_mask {len(mask)}: they were cut after "
            "encoding, with the image tokens and positions out of step. trl.SFTTrainer does this when it prepares "
            "an encoded dataset (it truncates input_ids/labels to max_length and silently drops the rows left "
            "without a target token): pass dataset_kwargs={'skip_prepare_dataset': True} in SFTConfig "
            "(SFTConfig(..., **mmpipe.hosts.sft_settings())), and bound lengths when encoding "
            "(mmpipe.encode_dataset(..., max_length=N))")


def check_not_stripped(rows: Sequence[Any]) -> None:
    """Refuse dict rows without the ``family`` column that every encoded row has: the Trainer's
    ``remove_unused_columns=True`` dropped it (and ``pixel_values_u8`` ...) before collate."""
    first = rows[0] if isinstance(rows, (list, tuple)) and rows else None
    if not isinstance(first, Mapping) or "family" in first:
        return
    have = sorted(first)
    if "input_ids" in first:
        raise ArgumentError(
            f"the rows reaching the collator hold only the columns {have}: 'family', 'pixel_values_u8' and the "
            "other encoded columns were removed before collate. transformers.Trainer (and trl.SFTTrainer) drop "
            "every column the model's forward does not name while remove_unused_columns=True (the default): "
            "pass remove_unused_columns=False in TrainingArguments / SFTConfig, e.g. "
            "TrainingArguments(..., **mmpipe.hosts.trainer_settings())")
    raise ArgumentError(
        f"the rows reaching the collator are not encoded rows (columns {have}); encode the dataset first "
        "(mmpipe.encode_dataset) and pass remove_unused_columns=False (mmpipe.hosts.trainer_settings())")
