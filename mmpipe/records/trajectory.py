"""Agent-loop records: `ToolCall` (one parsed call), `AgentTurn` (one model reply and the
tool turn after it) and `Trajectory` (one finished conversation of `mmpipe.rollout.agent`).

Positions follow `mmpipe.records`: a row's ``position_ids`` are ``[3, L]``.

    >>> ToolCall(name="search", arguments={"q": "cat"}, text='{"name": "search", "arguments": {"q": "cat"}}').ok
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mmpipe.records.columns import to_numpy
from mmpipe.records.row import MultiModalInputs

__all__ = ["ToolCall", "AgentTurn", "Trajectory", "TRAJECTORY_FINISH_REASONS"]

# "stop" / "length" / "abort": the final reply's own finish reason (no tool call in it); the
# others are the loop's budgets, or "vision_token" (the reply was cut before a sampled vision token).
TRAJECTORY_FINISH_REASONS = ("stop", "length", "abort", "max_turns", "max_tokens", "max_images", "vision_token")


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from a model reply.

    Attributes:
        name: the tool's name (None when the call could not be parsed).
        arguments: the keyword arguments (a JSON object), ``{}`` when unparsable.
        text: the call's raw text (between ``<tool_call>`` and ``</tool_call>`` for Qwen).
        error: why the call is malformed (bad JSON, no name, arguments not an object, not
            closed), or None for a well-formed call. A malformed call becomes a tool turn
            holding an error text; the trajectory goes on.
    """

    name: Optional[str]
    arguments: dict
    text: str
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class AgentTurn:
    """One model reply of a trajectory, and the tool turn that answered it (if any).

    Attributes:
        token_ids: int64 [R] the reply's ids as appended to the row (all labelled; cut at a
            budget or before a sampled vision token when the trajectory ended there).
        logprobs: float32 [R] the engine's logprobs of those ids, or None when the engine gave none.
        text: the reply decoded (special tokens kept, the closing ``<|im_end|>`` left out).
        finish_reason: the engine's finish reason for the reply ("stop", "length", ...).
        span: (start, end) of the reply's ids in the trajectory row.
        tool_calls: the calls parsed from the reply (malformed ones included, with their error).
        tool_outputs: per call, the text given back to the model (an error text for a failed
            call); empty when no tool turn followed.
        tool_errors: per call, True when its output is an error text.
        num_images: images the tool turn added to the row.
    """

    token_ids: np.ndarray
    logprobs: Optional[np.ndarray]
    text: str
    finish_reason: str
    span: tuple[int, int]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_outputs: tuple[str, ...] = ()
    tool_errors: tuple[bool, ...] = ()
    num_images: int = 0


@dataclass(eq=False)
class Trajectory:
    """One finished agent conversation: the policy row and what happened on the way.

    Attributes:
        row: the policy row (`MultiModalInputs`): input_ids int64 [L], labels int64 [L] = the
            model's own reply ids, -100 elsewhere (prompt, tool outputs and their images,
            generation prompts, end-of-turn tokens the model did not sample), position_ids
            int64 [3, L], image_grid_thw int64 [I, 3] (prompt images, then each tool turn's),
            pixel data in the encoder's format.
        turns: tuple of `AgentTurn`, one per model reply.
        finish_reason: one of `TRAJECTORY_FINISH_REASONS`.
        prompt_index: index of the prompt in the loop's input; sample_index: 0..n-1 in its group.
        messages: the whole conversation as chat messages (images as ``{"type": "image"}``);
            the assistant contents are the replies' raw text (``<tool_call>`` blocks included).
        images: the row's I images in order (prompt images, then tool images).
        tools: the prompt row's own ``tools`` column (tool specs), kept for `to_raw_row`; None when
            it had none (tool specs given to the loop as ``tool_specs=`` are an encode option).
    """

    row: MultiModalInputs
    turns: tuple[AgentTurn, ...]
    finish_reason: str
    prompt_index: int
    sample_index: int = 0
    messages: tuple = ()
    images: tuple = field(default=())
    tools: Optional[list] = None

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def num_tool_errors(self) -> int:
        return sum(sum(t.tool_errors) for t in self.turns)

    @property
    def num_model_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    @property
    def response_mask(self) -> np.ndarray:
        """int64 [L]: 1 on the model's own tokens (the labelled ones), 0 elsewhere."""
        mask = np.zeros(self.row.num_tokens, np.int64)
        for t in self.turns:
            mask[t.span[0]:t.span[1]] = 1
        return mask

    @property
    def logprobs(self) -> Optional[np.ndarray]:
        """float32 [num_model_tokens]: the engine's logprobs of every model token in row order
        (aligned with ``row.labels != -100``), or None when some turn has none."""
        if any(t.logprobs is None for t in self.turns):
            return None
        parts = [to_numpy(t.logprobs).astype(np.float32, copy=False) for t in self.turns]  # bf16 tensors too
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def to_raw_row(self) -> dict:
        """The whole conversation as a raw row (``{"messages", "images"}``, and ``"tools"`` when
        the prompt had them) for `mmpipe.encode_row`."""
        raw = {"messages": list(self.messages), "images": list(self.images)}
        return raw if self.tools is None else {**raw, "tools": self.tools}

    def __repr__(self) -> str:
        return (f"Trajectory(prompt={self.prompt_index}.{self.sample_index}, turns={self.num_turns}, "
                f"tool_calls={len(self.tool_calls)} ({self.num_tool_errors} errors), tokens={self.row.num_tokens}, "
                f"images={self.row.num_images}, finish={self.finish_reason!r})")
