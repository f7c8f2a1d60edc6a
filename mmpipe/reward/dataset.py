"""The dataset stage: ``ds.map(judge.score, batched=True)`` over rows with frames.

    rows {image, task?, primitive?, prev_progress?} --score_batch--> + {prefix}reward, ... columns

A batch's frames are judged concurrently on the judge's threads (``max_concurrency`` at
once; choose ``batch_size`` several times that, as the last frames of a batch run with
fewer in flight), and each row gets exactly one result, in order.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from mmpipe.errors import ParseError
from mmpipe.records.reward import RESULT_KEYS, JudgeResult


class JudgeColumnError(ParseError, KeyError):
    """The batch lacks the judge's image column (also a ``KeyError``, what `score` raised
    before it named the columns)."""

    __str__ = ParseError.__str__


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

    One image per row: a column holding a list of images per row (e.g. Hub data's
    ``images``) is refused, not scored (pick one frame per row first, e.g. the last).

    Raises:
        JudgeColumnError (a ParseError and a KeyError): the batch has no image column (names
            the columns the judge reads, the columns found and the fix).
        mmpipe.errors.ParseError: a row's image value is a list of images.
    """
    col = judge.columns
    images = _frames(col, batch)
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


def _frames(col: dict[str, str], batch: dict[str, list]) -> list:
    """The batch's image column (``col["image"]``, the judge's ``columns``) as a list of one
    image per row; raises `JudgeColumnError` / `ParseError` as `score_batch` says."""
    if col["image"] not in batch:
        found = sorted(batch)
        hint = [c for c in found if "image" in c.lower() or "frame" in c.lower()]
        raise JudgeColumnError(
            f"VLMJudge.score: the batch has no image column {col['image']!r}; found columns {found}",
            column=col["image"], where="",
            expected=(f"column {col['image']!r} with one image per row (optional: {col['task']!r}, "
                      f"{col['primitive']!r}, {col['prev_progress']!r})"),
            fix=("pass VLMJudge(image_column=...) naming the column that holds one image per row"
                 + (f" (candidates: {hint})" if hint else "")))
    images = list(batch[col["image"]])
    for i, value in enumerate(images):
        if _is_image_list(value):
            raise ParseError(
                f"VLMJudge.score scores one image per row, but column {col['image']!r} holds a list",
                column=col["image"], where=f"row {i} of the batch", expected="one image per row",
                found=f"a list of {len(value)} values",
                fix=(f"pick one image per row first, e.g. ds.map(lambda r: {{'frame': r[{col['image']!r}][-1]}}) "
                     "and VLMJudge(image_column='frame'), or give each image its own row"))
    return images


def _is_image_list(value: Any) -> bool:
    """A list of images (``Sequence(Image())`` data), not one image as nested pixel lists."""
    if not isinstance(value, (list, tuple)):
        return False
    if not value:
        return True
    first = value[0]
    if isinstance(first, (list, tuple, int, float)):  # [H][W][C] numbers: one image
        return False
    return getattr(first, "ndim", 2) >= 2  # PIL images, dicts, paths, bytes, [H, W, C] arrays
