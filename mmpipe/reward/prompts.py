"""The two judge questions, their JSON schemas, and the chat messages that carry them.

Message layout (one user turn)::

    [system?] user: [ image_url (data URL) , text (the question) ]

The image comes first and the question last, so both questions about one frame share
the longest possible token prefix (system + image) and a server with prefix caching
(``vllm serve --enable-prefix-caching``, on by default in vLLM v1) encodes the image
once for both.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from mmpipe.errors import ArgumentError

DEFAULT_ACTION_PROMPT = """You are evaluating a robot's action selection for a manipulation task.

Task: {task}

Available action primitives:
{primitives}

The robot selected: "{primitive}"

Based on the current scene shown in the image, is this action selection reasonable for making progress on the task?

Respond with ONLY a JSON object:
{{"reasonable": true/false, "confidence": 0.0-1.0, "reason": "..."}}"""

DEFAULT_PROGRESS_PROMPT = """You are evaluating task progress for a robot manipulation task.

Task: {task}

Based on the current scene shown in the image, estimate the progress toward completing the task.

Respond with ONLY a JSON object:
{{"progress": 0.0-1.0, "stage": "...", "next_step": "..."}}"""

ACTION_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "reasonable": {"type": "boolean"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reason": {"type": "string"},
    },
    "required": ["reasonable", "confidence", "reason"],
    "additionalProperties": False,
}

PROGRESS_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "progress": {"type": "number", "minimum": 0, "maximum": 1},
        "stage": {"type": "string"},
        "next_step": {"type": "string"},
    },
    "required": ["progress", "stage", "next_step"],
    "additionalProperties": False,
}

# The schema names double as the question kinds on the wire ("action_verdict" / "progress_estimate").
ACTION_SCHEMA_NAME = "action_verdict"
PROGRESS_SCHEMA_NAME = "progress_estimate"

Primitives = Union[Sequence[str], Mapping[str, str]]
_FIELDS = {"action": {"task", "primitives", "primitive"}, "progress": {"task", "primitives"}}


def format_primitives(primitives: Primitives) -> str:
    """``["reach", "grasp"]`` -> ``"- reach\\n- grasp"``; a mapping adds ``": description"``."""
    if isinstance(primitives, Mapping):
        return "\n".join(f"- {name}: {desc}" if desc else f"- {name}" for name, desc in primitives.items())
    return "\n".join(f"- {name}" for name in primitives) or "- (not given)"


def response_format(name: str, schema: dict) -> dict:
    """The OpenAI ``response_format`` that forces JSON matching ``schema``.

    vLLM, SGLang and OpenAI honour ``{"type": "json_schema", ...}`` (vLLM removed the older
    ``guided_json`` parameter, which servers now ignore silently).
    """
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@dataclass(frozen=True)
class JudgePrompts:
    """The question templates (``str.format`` fields; write literal braces as ``{{ }}``).

    Args:
        action: template with ``{task}``, ``{primitives}`` (the formatted list) and
            ``{primitive}`` (the chosen one); the answer must match `ACTION_SCHEMA`.
        progress: template with ``{task}`` and optionally ``{primitives}``; the answer must
            match `PROGRESS_SCHEMA`.
        system: optional system message sent before the image (part of the shared prefix).

    Example::

        >>> p = JudgePrompts(progress="Task: {task}. Progress 0-1 as JSON {{\\"progress\\": x}}")
        >>> p.render_progress("stack the cubes", ["reach"])
        'Task: stack the cubes. Progress 0-1 as JSON {"progress": x}'
    """

    action: str = DEFAULT_ACTION_PROMPT
    progress: str = DEFAULT_PROGRESS_PROMPT
    system: Optional[str] = None

    def __post_init__(self) -> None:
        for kind in ("action", "progress"):
            template = getattr(self, kind)
            try:
                names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as e:
                raise ArgumentError(f"JudgePrompts.{kind}: not a valid str.format template ({e}); "
                                    "write literal braces as '{{' and '}}'") from e
            unknown = names - _FIELDS[kind]
            if unknown:
                raise ArgumentError(
                    f"JudgePrompts.{kind}: unknown field(s) {sorted(unknown)}; expected a subset of "
                    f"{sorted(_FIELDS[kind])}; write literal braces as '{{{{' and '}}}}'"
                )

    def render_action(self, task: str, primitives: Primitives, primitive: str) -> str:
        return self.action.format(task=task, primitives=format_primitives(primitives), primitive=primitive)

    def render_progress(self, task: str, primitives: Primitives) -> str:
        return self.progress.format(task=task, primitives=format_primitives(primitives))


def build_messages(image_url: str, question: str, system: Optional[str] = None) -> list[dict]:
    """Chat messages for one question: image first, question last (see the module doc)."""
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    messages.append({
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": question},
        ],
    })
    return messages
