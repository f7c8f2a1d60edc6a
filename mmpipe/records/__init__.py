"""Every record type mmpipe passes between stages, and their Arrow codecs.

One position layout, stated once: a row's ``position_ids`` are int64 ``[3, L]`` (t, h, w
M-RoPE; a text-only family has three equal rows) and a batch's are ``[3, B, L]`` (the layout
transformers' Qwen-VL ``forward`` takes; ``model_inputs(positions="verl")`` prepends the plain
text row for verl's ``[4, B, L]``). Batch-first containers (`ReMABatch`, like verl's
DataProto) hold ``[B, 3, L]``, i.e. the model layout with the first two axes swapped.

=================  ===============================================================
module             records
=================  ===============================================================
``columns``        stored-column codecs shared by every record (dtypes, uint8 pixel bytes)
``row``            `MultiModalInputs`: one encoded row
``arrow``          `rows_from_arrow`: stored Arrow rows -> `MultiModalInputs`, zero-copy
``batch``          `BatchedMultiModalInputs`: a padded batch
``packed``         `PackedMultiModalInputs`: a padding-free ``[1, T]`` pack
``generation``     `SamplingParams`, `Completion`, `Generation`, the `RolloutEngine` protocol
``rollout``        `RolloutSample`: prompt + response + logprobs, one per sample
``conversation``   `Conversation`: one multi-turn agent conversation so far
``trajectory``     agent loop: `ToolCall`, `AgentTurn`, `Trajectory` (policy row + per-turn logprobs)
``rema``           ReMA `Episode`, `RoleEncoding`, `ReMABatch`
``generic``        `GenericInputs`, `GenericBatch`: the generic path's rows and batches
``tiled``          `TiledInputs`, `TiledBatch`: the tiled families' rows (uint8 tiles) and batches
``tiled_packed``   `TiledPackedInputs`: tiled-family rows packed into one ``[1, T]`` sequence
``reward``         VLM-judge records (`JudgeResult`, `StepScore`, ...)
``display_hooks``  where `mmpipe.view` registers the records' Jupyter/text renderers
=================  ===============================================================
"""

from mmpipe.records.arrow import list_lengths, rows_from_arrow
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, PIXEL_FORMATS
from mmpipe.records.conversation import Conversation
from mmpipe.records.generation import AsyncRolloutEngine, Completion, Generation, RolloutEngine, SamplingParams
from mmpipe.records.packed import PackedMultiModalInputs
from mmpipe.records.rema import Episode, ReMABatch, RoleEncoding
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.tiled import TiledBatch, TiledInputs
from mmpipe.records.tiled_packed import TiledPackedInputs
from mmpipe.records.trajectory import AgentTurn, ToolCall, Trajectory
from mmpipe.records.row import MultiModalInputs

__all__ = [
    "IGNORE_INDEX", "PIXEL_FORMATS", "BatchedMultiModalInputs", "Completion", "Conversation", "Episode",
    "Generation", "MultiModalInputs", "PackedMultiModalInputs", "ReMABatch", "RoleEncoding", "RolloutEngine",
    "RolloutSample", "SamplingParams", "AsyncRolloutEngine", "list_lengths", "rows_from_arrow", "AgentTurn", "ToolCall", "Trajectory",
    "TiledBatch", "TiledInputs", "TiledPackedInputs",
]
