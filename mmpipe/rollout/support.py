"""Which rollout stages take which family's rows: ONE check every rollout stage makes.

The answer is the family's media strategy's (``fam.media.rollout_refusal(fam, stage)``,
`mmpipe.media`): the patch grids take every stage; the tiled families (Gemma 3, InternVL,
LLaVA-OneVision) take vLLM prompts, the engines and rollout samples, not multi-turn appends
nor verl rows; the generic path takes none. A refused stage raises `ArgumentError` naming the
stage, the family and what to use instead::

    check_rollout(resolve_family(processor), "multiturn")
"""

from __future__ import annotations

from typing import Any, Iterable

from mmpipe.errors import ArgumentError
from mmpipe.families import ModelFamily, get_family, resolve_family

# stage -> what the error message calls it
ROLLOUT_STAGES = {
    "vllm_prompts": "vLLM prompts (to_vllm_prompts)",
    "generate": "rollout engines (TransformersEngine, VLLMEngine)",
    "samples": "rollout samples (unbatch_rollout, rollout_rows)",
    "multiturn": "multi-turn conversations (start / append_observation)",
    "verl": "verl rows (verl_rows, verl_batch)",
}


def check_rollout(fam: ModelFamily, stage: str) -> ModelFamily:
    """``fam`` if rollout ``stage`` (a key of `ROLLOUT_STAGES`) takes its rows, else
    `ArgumentError` saying why and what to use."""
    if stage not in ROLLOUT_STAGES:
        raise ArgumentError(f"stage must be one of {sorted(ROLLOUT_STAGES)}, got {stage!r}")
    why = fam.media.rollout_refusal(fam, stage)
    if why is not None:
        raise ArgumentError(f"{ROLLOUT_STAGES[stage]} are not available for {fam.name} rows: {why}")
    return fam


def check_processor(processor: Any, stage: str) -> ModelFamily:
    """`check_rollout` for the family of ``processor`` (a processor, tokenizer or family name;
    a processor without a family table is the generic path's)."""
    return check_rollout(resolve_family(processor), stage)


def check_rows(rows: Iterable, stage: str) -> None:
    """`check_rollout` for every family the records ``rows`` hold (each family once)."""
    for name in dict.fromkeys(r.family for r in rows):
        check_rollout(get_family(name), stage)
