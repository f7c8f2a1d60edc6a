"""The dataset stage: ``ds.map(judge.score, batched=True)`` over rows with frames.

    rows {image, task?, primitive?, prev_progress?} --score_batch--> + {prefix}reward, ... columns

A batch's frames are judged concurrently on the judge's threads (``max_concurrency`` at
once; choose ``batch_size`` several times that, as the last frames of a batch run with
fewer in flight), and each row gets exactly one result, in order.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from mmpipe.records.reward import RESULT_KEYS, JudgeResult


class FrameScorer(Protocol):
    """What `score_batch` needs of a judge (`mmpipe.reward.judge.VLMJudge` is one); typed here so
    this module never imports the judge (the judge imports this module)."""

    columns: dict[str, str]  # {"image", "task", "primitive", "prev_progress"} -> column name
    output_prefix: str

    def judge_many(self, images: Sequence[Any], primitives: Sequence[Optional[str]],
                   tasks: Optional[Sequence[Optional[str]]] = None,
                   prev_progress: Optional[Sequence[Optional[float]]] = None) -> list[JudgeResult]: ...


def score_batch(judge: FrameScorer, batch: dict[str, list]) -> dict[str, list]:
    """Score one ``datasets`` batch (what `VLMJudge.score` does); ``judge`` is any `FrameScorer`.

    Reads the judge's ``image_column`` (required; any image value, e.g. a
    ``datasets.Image()`` column), ``task_column``, ``primitive_column`` and
    ``prev_progress_column`` (each optional; a missing or None task uses ``judge.task``).
    Writes one value per row in each of ``{prefix}reward, valid, action_valid,
    progress_valid, reasonable, confidence, reason, p_true, progress, stage, next_step,
    part_binary, part_progress_term, part_vlm_reward, part_reward, part_confidence,
    part_baseline, action_raw, progress_raw, error, latency_s, cache_hit``
    (`JudgeResult.to_row`). No value is None: Arrow fixes a column's type from the first
    batch, so a first batch of failures must not write all-None columns; values of invalid
    answers are NaN / "" / False, and ``action_valid`` / ``progress_valid`` say which are real.

    ``num_proc``: keep 1 (the default); concurrency comes from the threads. With
    ``num_proc > 1`` the judge is pickled into each worker process (settings only), which
    gets its own connections, cache and counters (``judge.stats`` in the parent then stays
    0), and up to ``num_proc * max_concurrency`` requests are in flight. With a dataset
    stored on disk, datasets may reuse a cached result of the same map with the same judge
    settings; pass ``load_from_cache_file=False`` to ask the server again.

    Raises:
        KeyError: the batch has no image column (names the columns found and the fix).
    """
    col = judge.columns
    if col["image"] not in batch:
        raise KeyError(f"VLMJudge.score: the batch has no image column {col['image']!r}; found columns "
                       f"{sorted(batch)}; pass VLMJudge(image_column=...)")
    images = list(batch[col["image"]])
    n = len(images)

    def column(name: str) -> list:
        values = batch.get(col[name])
        return list(values) if values is not None else [None] * n

    results = judge.judge_many(images, column("primitive"), column("task"), column("prev_progress"))
    out: dict[str, list] = {judge.output_prefix + k: [] for k in RESULT_KEYS}
    for r in results:
        for k, v in r.to_row().items():
            out[judge.output_prefix + k].append(v)
    return out
