"""`Conversation`: one sample of a multi-turn rollout loop so far (the row, the messages,
the images, the spans of each response). Positions follow `mmpipe.records`: ``[3, L]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np

from mmpipe.families import ModelFamily
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs


class TurnEncoder(Protocol):
    """What a `Conversation` needs of the encoder its turns are encoded with (records sit below
    the encode stage, so the type is this protocol; `mmpipe.encoding.encoder.Encoder` is one)."""

    tokenizer: Any
    family: ModelFamily
    pixels: str

    def render(self, messages: list, add_generation_prompt: bool, tools: Optional[list] = None) -> str:
        """The chat template's text of ``messages``."""

    def encode_row(self, raw_row: dict, idx: Any = None) -> MultiModalInputs:
        """One raw row -> its encoded row."""

    def token_types(self, ids: np.ndarray) -> np.ndarray:
        """int64 [L] token types (0 text, 1 image, 2 video) of ids int [L]."""


@dataclass(frozen=True, eq=False)
class Conversation:
    """One sample of a multi-turn loop. Immutable: every append returns a new Conversation.

    Attributes:
        row:        the encoded row so far (`MultiModalInputs`): input_ids int64 [L], labels
                    int64 [L] (or None when encoded with labels=False), position_ids int64
                    [3, L], image_grid_thw int64 [I, 3], pixel_values_u8 uint8 [N, 3*p*p] (or
                    float32 pixel_values [N, 3*T*p*p], or none, as the encoder was set).
        messages:   tuple of chat message dicts so far, images as ``{"type": "image"}`` placeholders.
        images:     the I images in order of appearance (as given: PIL, path, bytes...);
                    what a rollout engine that takes raw images (vLLM) needs.
        text:       the rendered chat text the tokens stand for (one placeholder per image):
                    ``render(messages, add_generation_prompt=awaiting_response)``, except that each
                    reply of ``sampled`` stands as the model saw it (its generation prompt, then
                    the reply as sampled) where a thinking template writes its turn otherwise.
        encoder:    the `TurnEncoder` (an `mmpipe.Encoder`: processor, vision spec, pixel format)
                    shared by the batch.
        index:      the sample's original index (int, or None), used in error messages.
        awaiting_response: the row ends with the generation prompt (``<|im_start|>assistant\\n``).
        response_spans: tuple of (start, end) token spans of each appended response (model tokens only,
                    not the tokens added to close a cut turn).
        done / finish_reason: set by `MultiTurnBatch.mark_done` or ``append_response(done=True)``.
        tools:      the tool specs the chat template gets (the row's ``tools`` column, else the
                    encoder's ``tools`` option), or None: every render of the conversation uses them.
        sampled:    indices into ``messages`` of the replies kept as sampled under a thinking template
                    (GLM-4.6V, Qwen3 thinking: the template writes ``<think></think>`` before a reply
                    without reasoning and drops history reasoning); `mmpipe.rollout.turn_text.seen_render`.
    """

    row: MultiModalInputs
    messages: tuple
    images: tuple
    text: str
    encoder: TurnEncoder
    index: Optional[int] = None
    awaiting_response: bool = True
    response_spans: tuple = ()
    done: bool = False
    finish_reason: Optional[str] = None
    tools: Optional[list] = None
    sampled: tuple = ()

    @property
    def num_tokens(self) -> int:
        return self.row.num_tokens

    @property
    def num_turns(self) -> int:
        """Responses appended so far."""
        return len(self.response_spans)

    @property
    def response_mask(self) -> np.ndarray:
        """int64 [L]: 1 on the model's response tokens (where labels are not -100)."""
        if self.row.labels is None:
            mask = np.zeros(self.num_tokens, np.int64)
            for a, b in self.response_spans:
                mask[a:b] = 1
            return mask
        return (self.row.labels != IGNORE_INDEX).astype(np.int64)

    @property
    def where(self) -> str:
        return f"conversation {self.index}" if self.index is not None else "conversation"

    def __repr__(self) -> str:
        state = "done" if self.done else ("awaiting response" if self.awaiting_response else "closed")
        return (f"Conversation(index={self.index}, turns={self.num_turns}, tokens={self.num_tokens}, "
                f"images={self.row.num_images}, {state})")

