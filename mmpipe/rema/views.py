"""Role views: what each agent role is shown before its turn (and the question's content form).

A view is any callable ``ViewContext -> str | content list`` returning the user message the
role receives before it answers. A role's conversation only grows ([system], user, its
response, user, ...), so every earlier prompt is a prefix of the final training sequence.
ReMA's views are the defaults (`rema_views`): the first role gets the question and then the
other roles' replies; later roles get the question plus the first role's latest message,
then that role's latest message alone.

    views = {"planner": AskQuestion(), "solver": QuestionWithInstruction(template="{instruction}\n{question}"),
             "critic": lambda ctx: f"Check this answer: {ctx.latest('solver')}"}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from mmpipe.errors import ArgumentError, ParseError, PlaceholderError
from mmpipe.records.columns import IMAGE_PLACEHOLDER
from mmpipe.records.rema import text_item

__all__ = ["ViewContext", "View", "AskQuestion", "QuestionWithInstruction", "rema_views", "content_items",
           "num_images", "question_items"]


# ---- questions and message contents -----------------------------------------------------


def content_items(value, where: str, column: str = "content") -> list[dict]:
    """A message content -> normalised content items.

    ``value``: a string or a list of items (``{"type": "text", "text": str}``, plain strings,
    ``{"type": "image"}``). Returns a list of ``{"type": "text", "text": ...}`` /
    ``{"type": "image"}`` dicts with adjacent texts merged and empty texts dropped. ``where``
    and ``column`` (the field holding ``value``) name it in errors (`ParseError`, stage "rollout").
    """
    if isinstance(value, str):
        return [text_item(value)] if value else []
    if not isinstance(value, (list, tuple)):
        raise ParseError(
            "message content", where=where, stage="rollout", column=column,
            expected="a string or a list of content items ({'type': 'text', 'text': ...} / {'type': 'image'})",
            found=type(value).__name__, fix="pass the text as a string; images go with the question",
        )
    out: list[dict] = []
    for item in value:
        if isinstance(item, dict) and item.get("type") == "image":
            out.append({"type": "image"})
            continue
        text = item if isinstance(item, str) else (item.get("text") if isinstance(item, dict) else None)
        if not isinstance(text, str):
            raise ParseError(
                f"content item {item!r:.80} is neither {{'type': 'text', 'text': str}} nor {{'type': 'image'}}",
                where=where, stage="rollout", column=column,
                expected="{'type': 'text', 'text': str} or {'type': 'image'}", found=f"{item!r:.80}",
                fix="pass images with the question, not inline: a role's view shows the question's images",
            )
        if out and out[-1]["type"] == "text":  # adjacent texts render as one; store them as one
            out[-1] = text_item(out[-1]["text"] + text)
        elif text:
            out.append(text_item(text))
    return out


def num_images(items: Sequence[dict]) -> int:
    """Number of ``{"type": "image"}`` items in normalised content items (`content_items`)."""
    return sum(it["type"] == "image" for it in items)


def question_items(q, idx: int) -> tuple[list[dict], tuple]:
    """A question -> (content items, images).

    ``q``: a string (``<image>`` marks each image's place when images are given) or
    ``{"question": str | content list, "images": [...]}``; ``idx`` names it in errors.
    Returns normalised content items (`content_items`) and the images as a tuple, one per
    ``{"type": "image"}`` item. Raises `ParseError` (stage "rollout") / `PlaceholderError`.
    """
    where = f"question {idx}"
    images: Sequence = ()
    if isinstance(q, dict):
        if "question" not in q:
            raise ParseError(
                "question row", where=where, row=idx, stage="rollout", column="question",
                expected="{'question': str | content list, 'images': [...]}", found=f"keys {sorted(q)}",
                fix="give each question as a string or a dict with a 'question' key (and its 'images')",
            )
        images = q.get("images")
        if images is None:
            images = ()
        elif not isinstance(images, (list, tuple)):  # one image, not a list of them
            raise ParseError(
                "question images", where=where, row=idx, stage="rollout", column="images",
                expected="a list of images (one per <image> / {'type': 'image'})", found=type(images).__name__,
                fix="wrap a single image in a list: {'question': ..., 'images': [image]}",
            )
        q = q["question"]
    if isinstance(q, str) and images:
        if q.count(IMAGE_PLACEHOLDER) != len(images):
            raise PlaceholderError(
                f"{len(images)} image(s) but {q.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} placeholder(s) "
                "in the text", where=where, row=idx, column="question",
                expected=f"{len(images)} {IMAGE_PLACEHOLDER} placeholder(s)",
                found=f"{q.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} placeholder(s)",
                fix=f"put one {IMAGE_PLACEHOLDER} where each image goes, or pass a content list",
            )
        items = []
        for k, part in enumerate(q.split(IMAGE_PLACEHOLDER)):
            if k:
                items.append({"type": "image"})
            if part:
                items.append(text_item(part))
    else:
        items = content_items(q, where, "question")
    if num_images(items) != len(images):
        raise PlaceholderError(
            f"the content holds {num_images(items)} image item(s) but {len(images)} image(s) were given",
            where=where, row=idx, column="question",
            expected=f"{len(images)} image item(s)", found=f"{num_images(items)} image item(s)",
            fix="give one image per {'type': 'image'} item",
        )
    return items, tuple(images)


# ---- role views --------------------------------------------------------------------------
@dataclass(frozen=True)
class ViewContext:
    """What a role's view may look at when its turn comes.

    Attributes:
        index:       the row (question) index in the batch.
        turn:        0-based round index.
        role:        the role about to respond.
        agent_roles: all roles, in turn order.
        question:    the question as content items (images as ``{"type": "image"}``).
        history:     every response of this row so far (earlier roles of this round
                     included), as `Episode.history` entries ``{"role", "content", "turn", ...}``.
    """

    index: int
    turn: int
    role: str
    agent_roles: tuple
    question: tuple
    history: tuple

    def _known(self, roles: Sequence[str], what: str) -> tuple:
        """``roles`` (one name or a sequence of names) as a tuple; `ArgumentError` for a name not in
        ``agent_roles`` (it never answers: the view would silently get nothing from it)."""
        names = (roles,) if isinstance(roles, str) else tuple(roles)
        bad = [r for r in names if r not in self.agent_roles]
        if bad:
            raise ArgumentError(f"row {self.index}, role {self.role!r}, turn {self.turn}: the view's {what} names "
                                f"{bad}, not among agent_roles {list(self.agent_roles)}; name roles of agent_roles "
                                "(a list of names, or one name)")
        return names

    def latest(self, role: str) -> Optional[str]:
        """The most recent response of ``role`` (one of ``agent_roles``) in this row, or None."""
        self._known(role, "role")
        for h in reversed(self.history):
            if h["role"] == role:
                return h["content"]
        return None

    def since_own_last(self, roles: Optional[Sequence[str]] = None) -> list[str]:
        """Responses of ``roles`` (names of ``agent_roles``, or one name; default: every other role)
        after this role's last response."""
        start = 0
        for k, h in enumerate(self.history):
            if h["role"] == self.role:
                start = k + 1
        want = set(self._known(roles, "reply_from")) if roles is not None else set(self.agent_roles) - {self.role}
        return [h["content"] for h in self.history[start:] if h["role"] in want]


View = Callable[[ViewContext], Union[str, list]]


@dataclass(frozen=True)
class AskQuestion:
    """View: turn 0 the question; later turns the responses of ``reply_from`` (role names, or
    one name; default: every other role) since this role last spoke, joined by ``joiner``;
    ``continue_text`` when there are none (a single role). ReMA's first-role (meta-thinker) view."""

    reply_from: Optional[tuple] = None
    joiner: str = "\n\n"
    continue_text: str = "Continue."

    def __call__(self, ctx: ViewContext):
        if ctx.turn == 0:
            return list(ctx.question)
        replies = ctx.since_own_last(self.reply_from)
        return self.joiner.join(replies) if replies else self.continue_text


@dataclass(frozen=True)
class QuestionWithInstruction:
    """View: turn 0 ``template`` with ``{question}`` (its images included) and ``{instruction}``
    (the latest response of ``instruction_from``, default the first role); later turns that
    role's latest response alone. ReMA's view for the roles after the first."""

    instruction_from: Optional[str] = None
    template: str = "Question:\n{question}\n\nInstruction:\n{instruction}"

    def __call__(self, ctx: ViewContext):
        src = self.instruction_from or ctx.agent_roles[0]
        ctx._known(src, "instruction_from")
        instruction = ctx.latest(src)
        if instruction is None:
            raise ArgumentError(
                f"row {ctx.index}, role {ctx.role!r}, turn {ctx.turn}: the view needs the latest response of "
                f"{src!r}, which has not answered yet; put {src!r} before {ctx.role!r} in agent_roles or set "
                "instruction_from to a role that speaks earlier"
            )
        if ctx.turn:
            return instruction
        out: list[dict] = []
        for part in re.split(r"(\{question\}|\{instruction\})", self.template):
            if part == "{question}":
                out += list(ctx.question)
            elif part == "{instruction}":
                out.append(text_item(instruction))
            elif part:
                out.append(text_item(part))
        return out


def rema_views(agent_roles: Sequence[str]) -> dict[str, View]:
    """ReMA's views: the first role `AskQuestion`, every later role `QuestionWithInstruction`."""
    return {r: (AskQuestion() if k == 0 else QuestionWithInstruction()) for k, r in enumerate(agent_roles)}
