"""Which rollout stages take which family's rows: ONE check every rollout stage makes.

The answer is the family's media strategy's (``fam.media.rollout_refusal(fam, stage)``,
`mmpipe.media`): the patch grids take every stage; the tiled families (Gemma 3, InternVL,
LLaVA-OneVision) take vLLM prompts, the engines and rollout samples, not multi-turn appends
nor verl rows; the generic path takes none. A refused stage raises `ArgumentError` naming the
stage, the family and what to use instead::

    check_rollout(resolve_family(processor), "multiturn")
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError, is_integer, worker_original
from mmpipe.families import ModelFamily, get_family, resolve_family

# stage -> what the error message calls it
ROLLOUT_STAGES = {
    "vllm_prompts": "vLLM prompts (to_vllm_prompts)",
    "generate": "rollout engines (TransformersEngine, VLLMEngine)",
    "vllm_engine": "vLLM engines (VLLMEngine)",
    "samples": "rollout samples (unbatch_rollout, rollout_rows)",
    "multiturn": "multi-turn conversations (start / append_observation)",
    "verl": "verl rows (verl_rows, verl_batch)",
}


class RolloutRefusal(ArgumentError):
    """A rollout stage refusing a family's rows (`check_rollout`): an `ArgumentError` that
    carries the ``stage``, the ``family`` and, when a row was refused, its index ``row`` (the
    message then starts ``"row N: "``). A torch DataLoader re-raises a worker's error as
    ``type(e)(text)``: the three are then taken back from the original message (None where it
    does not say them)."""

    def __init__(self, message: str, *, stage: Optional[str] = None, family: Optional[str] = None,
                 row: Optional[int] = None):
        super().__init__(message)
        self.stage, self.family, self.row = stage, family, row
        original = worker_original(message, type(self)) if (stage, family, row) == (None, None, None) else None
        if original:
            loc = re.match(r"row (\d+): ", original)
            self.row = int(loc.group(1)) if loc else None
            said = _REFUSED.search(original)
            if said:
                self.stage = next((k for k, v in ROLLOUT_STAGES.items() if v == said.group(1)), None)
                self.family = said.group(2)


# what `check_rollout` says: "<ROLLOUT_STAGES value> are not available for <family> rows: "
_REFUSED = re.compile("(" + "|".join(re.escape(v) for v in ROLLOUT_STAGES.values()) + r") are not available for (\w+) rows: ")


def check_rollout(fam: ModelFamily, stage: str, *, row: Optional[int] = None) -> ModelFamily:
    """``fam`` if rollout ``stage`` (a key of `ROLLOUT_STAGES`) takes its rows, else
    `RolloutRefusal` (an `ArgumentError`) saying why and what to use (naming ``row`` when given)."""
    if stage not in ROLLOUT_STAGES:
        raise ArgumentError(f"stage must be one of {sorted(ROLLOUT_STAGES)}, got {stage!r}")
    why = fam.media.rollout_refusal(fam, stage)
    if why is not None:
        where = "" if row is None else f"row {row}: "
        raise RolloutRefusal(f"{where}{ROLLOUT_STAGES[stage]} are not available for {fam.name} rows: {why}",
                             stage=stage, family=fam.name, row=row)
    return fam


def check_processor(processor: Any, stage: str) -> ModelFamily:
    """`check_rollout` for the family of ``processor`` (a processor, tokenizer or family name;
    a processor without a family table is the generic path's)."""
    return check_rollout(resolve_family(processor), stage)


def check_rows(rows: Iterable, stage: str) -> None:
    """`check_rollout` for every family the records ``rows`` hold (each family once, naming
    the first row of a refused family)."""
    first: dict = {}
    for i, r in enumerate(rows):
        first.setdefault(r.family, i)
    for name, i in first.items():
        check_rollout(get_family(name), stage, row=i)


def expected_family(processor: Any, argument: str = "processor") -> Optional[ModelFamily]:
    """The family a processor (an object with an ``image_processor``), a family name or a
    `ModelFamily` stands for; None for what names no family (None, a `VisionSpec`, a
    tokenizer). Anything else: `ArgumentError` naming ``argument``."""
    if processor is None or isinstance(processor, ModelFamily):
        return processor
    if isinstance(processor, str):
        return get_family(processor)
    if hasattr(processor, "image_processor"):
        return resolve_family(processor)
    from mmpipe.images.spec import VisionSpec

    if isinstance(processor, VisionSpec) or hasattr(processor, "convert_tokens_to_ids"):
        return None
    raise ArgumentError(f"{argument} must be the processor the rows were encoded with, its VisionSpec, a family "
                        f"name or None, got {type(processor).__name__}")


def check_row_families(rows: Sequence, stage: str, processor: Any = None, *, argument: str = "processor") -> None:
    """Each row against its own family, in order, for a rollout stage that makes one output per
    row for ONE engine (vLLM prompts): the first row that fails is named.

    - a row whose family the stage refuses (the generic path): `RolloutRefusal` naming the row;
    - a row of another family than ``processor``'s (`expected_family`), or, when ``processor``
      names none, than row 0's: `FamilyMismatchError` naming the row, expected and found (one
      engine serves one model: prompt each family's rows with its own processor)."""
    want = expected_family(processor, argument)
    source = None if want is None else (f"the processor ({type(processor).__name__})"
                                         if hasattr(processor, "image_processor") else f"{argument}={want.name!r}")
    for i, r in enumerate(rows):
        fam = r.fam
        check_rollout(fam, stage, row=i)
        if want is None:
            want, source = fam, "row 0"
            continue
        if not want.accepts(fam.name):
            raise FamilyMismatchError(
                f"encoded for {fam.name!r}, but {source} is for {want.name!r}: {ROLLOUT_STAGES[stage]} serve "
                "one model", row=i, column="family", stage="rollout", expected=f"{want.name} rows",
                found=f"a {fam.name} row",
                fix=f"make the {ROLLOUT_STAGES[stage].split(' (')[0]} of each family's rows with that family's "
                    "own processor, one call per family",
            )


def token_ids(raw: Any, *, where: str, row: Optional[int], error: type = InputError,
              fix: str = "return the sampled ids as ints (the engine's token ids, not text or scores)") -> "np.ndarray":
    """Sampled token ids as an engine gives them (a list, an array, a torch tensor) -> int64 [n].
    Refused (``error``, stage "rollout", column "token_ids", naming ``where``): anything but a 1-D
    sequence of integers >= 0 (a string, None, floats that int64 would floor, a -1 fill that the
    embedding would read out of range). Ids above the tokenizer's vocabulary are kept (the
    model's embedding may be larger)."""
    if isinstance(raw, (str, bytes)):
        arr = np.asarray([raw])
    else:
        try:
            seq = raw.cpu() if hasattr(raw, "cpu") else raw
            arr = np.asarray(list(seq) if hasattr(seq, "__iter__") and not hasattr(seq, "__len__") else seq)
        except (TypeError, ValueError):  # ragged
            arr = np.asarray([object()], dtype=object)
    if not (arr.ndim == 1 or arr.size == 0) or (arr.size and arr.dtype.kind not in "iu"):
        raise error("sampled token ids", where=where, row=row, column="token_ids", stage="rollout",
                    expected="a 1-D sequence of integer token ids",
                    found=f"{type(raw).__name__} of dtype {arr.dtype}, shape {arr.shape}: {str(raw)[:80]}", fix=fix)
    ids = arr.astype(np.int64).reshape(-1)
    if ids.size and ids.min() < 0:
        k = int(np.flatnonzero(ids < 0)[0])
        raise error("sampled token ids", where=where, row=row, column="token_ids", stage="rollout",
                    expected="token ids >= 0", found=f"id {int(ids[k])} at response position {k}",
                    fix="drop padding / sentinel ids (e.g. -1 fill) from the engine's output")
    return ids



def stop_ids(tokenizer: Any, family: Optional[ModelFamily] = None) -> frozenset:
    """The ids that end every sampled response: the family's end-of-turn token (``<|im_end|>``,
    ``<end_of_turn>``), the other tokens its checkpoints' generation config stops at
    (``ModelFamily.turn_stops``: GLM-4.1V's next-turn headers ``<|user|>``, ``<|observation|>``)
    and the tokenizer's eos (a processor's tokenizer is used). Engines stop at the first of them
    (`mmpipe.rollout.sampling.sample`), so none sits before a response's last token. The pad id
    is not one: where it is no eos, a model may sample it mid-response."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    out = {getattr(tok, "eos_token_id", None)}
    if family is not None and hasattr(tok, "convert_tokens_to_ids"):
        for token in ((family.stop_token,) if family.stop_token else ()) + family.turn_stops:
            sid = tok.convert_tokens_to_ids(token)
            out.add(sid if sid != getattr(tok, "unk_token_id", None) else None)
    return frozenset(int(t) for t in out if is_integer(t))


def check_no_early_stop(ids: "np.ndarray", stops, *, where: str, row: Optional[int],
                        error: type = InputError) -> None:
    """Refuse (``error``, stage "rollout", column "token_ids") a response int64 [R] holding a
    stop id (`stop_ids`) before its last token: padding after the end (a padded engine output,
    ``[..., <|im_end|>, pad, pad]``) or text sampled past the end of turn would be trained on
    as the model's reply, and a multi-turn row would hold a turn that ends twice."""
    if len(ids) < 2 or not stops:
        return
    hits = np.flatnonzero(np.isin(ids[:-1], np.fromiter(stops, np.int64)))
    if len(hits):
        k = int(hits[0])
        raise error("a sampled response", where=where, row=row, column="token_ids", stage="rollout",
                    expected="a response ending at its first stop token (eos / end of turn)",
                    found=f"stop id {int(ids[k])} at response position {k} of {len(ids)}, then "
                          f"{len(ids) - k - 1} more token(s)",
                    fix=f"cut the ids after the first stop token (keep ids[:{k + 1}]) and drop the padding, "
                        "as engines return them; its logprobs likewise")
