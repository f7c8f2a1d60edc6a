"""The batch-level multi-turn loop (rollout stage): B `Conversation` s driven together, each
under its original index, with the rows still running handed to the rollout engine.

Appends themselves are `mmpipe.rollout.multiturn` (start / append_response /
append_observation); this module only keeps the batch's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from mmpipe.errors import ArgumentError
from mmpipe.records.conversation import Conversation
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.multiturn import append_observation, append_response, conversation_encoder, finish, start

__all__ = ["MultiTurnBatch"]


@dataclass
class MultiTurnBatch:
    """B conversations in an agent loop; every row keeps its original index.

        # a sketch: engine, params, wants_tool and search stand in for your engine, sampling params,
        # tool-call check and tool (docs/how-to/agent-loops.md runs a whole loop)
        batch = MultiTurnBatch.start(raw_rows, processor)
        while batch.active_indices:
            idx = batch.active_indices
            gens = engine.generate(batch.active_rows(), params)     # one Generation per active row
            for i, g in zip(idx, gens):
                c = g.completions[0]
                batch.append_response(i, c, done=not wants_tool(c))
            for i, conv in batch.active():                          # still running: tool turn
                content, images = search(conv)
                batch.append_observation(i, content, images)
        rows = batch.rows()                                         # B rows, original order

    Finished conversations are never touched again: their rows stay as they were.
    """

    conversations: list = field(default_factory=list)

    @classmethod
    def start(cls, raw_rows: Sequence[dict], processor, **encode_options) -> "MultiTurnBatch":
        """Encode every raw row as a first prompt (one shared `Encoder`)."""
        if isinstance(raw_rows, (str, bytes, dict)) or not hasattr(raw_rows, "__iter__"):  # a Dataset iterates
            raise ArgumentError(f"MultiTurnBatch.start takes a list of raw rows (dicts with 'messages' and "
                                f"'images'), got {type(raw_rows).__name__}; for one row pass [row]")
        enc = conversation_encoder(processor, encode_options)
        return cls([start(r, enc, index=i) for i, r in enumerate(raw_rows)])

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, i: int) -> Conversation:
        return self.conversations[i]

    @property
    def active_indices(self) -> list[int]:
        """Original indices of the conversations still running, ascending."""
        return [i for i, c in enumerate(self.conversations) if not c.done]

    def active(self) -> list[tuple[int, Conversation]]:
        """(original index, conversation) for each running conversation, ascending."""
        return [(i, c) for i, c in enumerate(self.conversations) if not c.done]

    def active_rows(self) -> list[MultiModalInputs]:
        """The running conversations' rows in `active_indices` order (the engine's prompts)."""
        return [c.row for c in self.conversations if not c.done]

    def mark_done(self, i: int, reason: str = "stop") -> None:
        """End conversation ``i`` (original index); its row is final."""
        self.conversations[i] = finish(self._get(i), reason)

    def append_response(self, i: int, response=None, **kwargs) -> Conversation:
        """`append_response` on conversation ``i`` (original index)."""
        self.conversations[i] = append_response(self._get(i), response, **kwargs)
        return self.conversations[i]

    def append_observation(self, i: int, content, images: Sequence = (), **kwargs) -> Conversation:
        """`append_observation` on conversation ``i`` (original index)."""
        self.conversations[i] = append_observation(self._get(i), content, images, **kwargs)
        return self.conversations[i]

    def rows(self) -> list[MultiModalInputs]:
        """All B rows in original order (finished early or not)."""
        return [c.row for c in self.conversations]

    @property
    def finish_reasons(self) -> list[Optional[str]]:
        """Each conversation's finish reason in original order (None while running)."""
        return [c.finish_reason for c in self.conversations]

    def _get(self, i: int) -> Conversation:
        if not 0 <= i < len(self.conversations):
            raise IndexError(f"conversation {i}: this batch holds conversations 0..{len(self.conversations) - 1}")
        return self.conversations[i]

