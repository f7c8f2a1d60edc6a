"""Every record type mmpipe passes between stages, and their Arrow codecs.

One record per stage for every family (Qwen-VL, GLM-4.1V, Gemma 3, InternVL, LLaVA-OneVision,
text, the generic path): `MultiModalInputs` (a row), `BatchedMultiModalInputs` (a padded batch),
`PackedMultiModalInputs` (a padding-free pack). What differs per kind of family is answered by
the family's media strategy (`mmpipe.media`).

One position layout, stated once: a row's ``position_ids`` are int64 ``[P, L]``: P = 3 for the
patch-grid families (t, h, w M-RoPE; the text family has three equal rows), P = 1 for the others
(``0..L-1``); a batch's are ``[P, B, L]`` (the layout transformers' Qwen-VL ``forward`` takes; ``model_inputs(positions="verl")`` prepends the plain
text row for verl's ``[4, B, L]``). Batch-first containers (`ReMABatch`, like verl's
DataProto) hold ``[B, 3, L]``, i.e. the model layout with the first two axes swapped.

=================  ===============================================================
module             records
=================  ===============================================================
``columns``        stored-column codecs shared by every record (dtypes, uint8 pixel bytes)
``row``            `MultiModalInputs`: one encoded row of any family (its media: `mmpipe.media`)
``arrow``          `rows_from_arrow`: stored Arrow rows -> `MultiModalInputs`, zero-copy
``batch``          `BatchedMultiModalInputs`: a padded batch
``media_layout``   `MediaLayout`: a row's (a batch's) per-item layout in one typed form for every kind
``packed``         `PackedMultiModalInputs`: a padding-free ``[1, T]`` pack
``generation``     `SamplingParams`, `Completion`, `Generation`, the `RolloutEngine` protocol
``rollout``        `RolloutSample`: prompt + response + logprobs, one per sample
``conversation``   `Conversation`: one multi-turn agent conversation so far
``trajectory``     agent loop: `ToolCall`, `AgentTurn`, `Trajectory` (policy row + per-turn logprobs)
``rema``           ReMA `Episode`, `RoleEncoding`, `ReMABatch`
``reward``         VLM-judge records (`JudgeResult`, `StepScore`, ...)
``display_hooks``  where `mmpipe.view` registers the records' Jupyter/text renderers
=================  ===============================================================
"""

from mmpipe.records.arrow import list_lengths, rows_from_arrow
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, PIXEL_FORMATS
from mmpipe.records.conversation import Conversation
from mmpipe.records.media_layout import MediaLayout
from mmpipe.records.generation import AsyncRolloutEngine, Completion, Generation, RolloutEngine, SamplingParams
from mmpipe.records.packed import PackedMultiModalInputs
from mmpipe.records.rema import Episode, ReMABatch, RoleEncoding
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.trajectory import AgentTurn, ToolCall, Trajectory
from mmpipe.records.row import MultiModalInputs

__all__ = [
    "IGNORE_INDEX", "PIXEL_FORMATS", "BatchedMultiModalInputs", "Completion", "Conversation", "Episode",
    "Generation", "MediaLayout", "MultiModalInputs", "PackedMultiModalInputs", "ReMABatch", "RoleEncoding", "RolloutEngine",
    "RolloutSample", "SamplingParams", "AsyncRolloutEngine", "list_lengths", "rows_from_arrow", "AgentTurn", "ToolCall", "Trajectory",
]
