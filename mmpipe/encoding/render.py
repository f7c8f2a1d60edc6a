"""Encode, the chat template side of `mmpipe.Encoder`, the same for every family: render a
conversation (one or many in one batched call), read a row's tools, find the character spans of
the assistant replies (what ``labels`` train on) and turn them into token labels.

A reply's span runs from the end of the conversation rendered before it (with the generation
prompt) to the end of the conversation rendered up to it, its trailing newlines and spaces
dropped: the reply's text, its tool calls and its end-of-turn token, never the newline after.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from mmpipe.encoding.parse import check_text, parse_tools
from mmpipe.errors import InputError
from mmpipe.records.columns import IGNORE_INDEX

__all__ = ["ChatTemplate", "span_labels"]

logger = logging.getLogger("mmpipe.encoding.encoder")


def span_labels(ids: np.ndarray, offsets: np.ndarray, spans: list) -> np.ndarray:
    """int64 [L]: ``ids`` int64 [L] where a token (character ``offsets`` int64 [L, 2]) overlaps
    one of ``spans`` ([(start, end)] characters), -100 elsewhere. A token merging the header's
    newline with a reply's leading newline counts (transformers' assistant-mask rule)."""
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    if spans:
        starts, ends = offsets[:, 0], offsets[:, 1]
        for a, b in spans:
            sel = (starts < b) & (ends > a)
            labels[sel] = ids[sel]
    return labels


class ChatTemplate:
    """The rendering half of `mmpipe.Encoder` (it sets ``processor``, ``tokenizer``, ``tools``,
    ``tools_column``, ``chat_template_kwargs``, ``add_generation_prompt`` and the runtime set
    ``_checked_tool_fields``)."""

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: Optional[list] = None) -> str:
        """The chat template applied to ``messages`` (text, not tokenized), with ``tools``
        (None: the encoder's ``tools`` option) passed as ``tools=``."""
        return self.render_many([messages], add_generation_prompt, tools)[0]

    def render_many(self, conversations: list, add_generation_prompt: bool,
                    tools: Optional[list] = None) -> list:
        """`render` of each conversation in one batched ``apply_chat_template`` call (same strings)."""
        target = self.processor if hasattr(self.processor, "apply_chat_template") else self.tokenizer
        tools = self.tools if tools is None else tools
        extra = {"tools": tools} if tools is not None else {}
        try:
            out = target.apply_chat_template([list(c) for c in conversations], tokenize=False, **extra,
                                             add_generation_prompt=add_generation_prompt,
                                             **self.chat_template_kwargs)
        except Exception as e:  # jinja raises its own types (TemplateError, TypeError, ...)
            raise InputError(f"the chat template failed on these messages ({type(e).__name__}: {e})",
                             stage="template", column="messages",
                             fix="check the roles and their order against the model's chat template") from e
        return [out] if isinstance(out, str) else list(out)

    def row_tools(self, example: dict, idx=None) -> Optional[list]:
        """Row ``example``'s ``tools_column`` value when not None, else the ``tools`` option
        (`parse_tools`)."""
        return parse_tools(example, idx=idx, column=self.tools_column, default=self.tools)

    def generation_prompt(self, messages: list[dict]) -> bool:
        """The ``add_generation_prompt`` of a row: the option, else whether the last message is
        not the assistant's."""
        if self.add_generation_prompt is not None:
            return self.add_generation_prompt
        return messages[-1]["role"] != "assistant"

    def prompt_text(self, messages: list[dict], agp: bool, tools: Optional[list], where: str) -> str:
        """The row's rendered prompt, checked (`check_text`); logs once when the template drops tool use."""
        text = self.render(messages, agp, tools)
        self.warn_ignored_tools(messages, agp, tools, text)
        return check_text(text, where=where, column="messages", what="the rendered prompt")

    def _assistant_spans(self, messages: list[dict], full: str, where: str,
                         tools: Optional[list] = None,
                         full_agp: Optional[bool] = None) -> list[tuple[int, int]]:
        """Character spans of assistant responses in ``full`` (module doc). ``full_agp``: the
        ``add_generation_prompt`` of ``full``; when False, ``full`` is the last prefix, not
        rendered again. The other prefixes: at most two batched renders."""
        ks = [k for k, msg in enumerate(messages) if msg["role"] == "assistant"]
        again = [k for k in ks if not (k == len(messages) - 1 and full_agp is False)]
        befores = iter(self.render_many([messages[:k] for k in ks if k], True, tools)
                       if ks and ks[-1] else [])
        uptos = dict(zip(again, self.render_many([messages[: k + 1] for k in again], False, tools)
                         if again else []))
        spans = []
        for k in ks:
            before = next(befores) if k else ""
            upto = uptos.get(k, full)
            if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
                raise InputError(
                    "the chat template does not render conversation prefixes as prefixes of the "
                    "whole conversation, so assistant tokens cannot be located", where=where,
                    stage="template", column="messages",
                    fix="pass labels=False or a prefix-stable chat template")
            # up to the end-of-turn token: trailing newlines/spaces dropped, never into ``before``
            spans.append((len(before), max(len(before), len(upto.rstrip("\n ")))))
        return spans

    def warn_ignored_tools(self, messages: list[dict], agp: bool, tools: Optional[list], text: str) -> None:
        """Log once per encoder when the chat template renders a row's ``tool_calls`` or
        ``tools`` as nothing (Qwen2-VL's / Qwen2.5-VL's processor templates ignore both, so the
        model would be trained on conversations without them)."""
        checks = (("tool_calls", any(m.get("tool_calls") for m in messages)), ("tools", bool(tools)))
        for field, present in checks:
            if not present or field in self._checked_tool_fields:
                continue
            self._checked_tool_fields.add(field)
            if field == "tools":
                without = self.render(messages, agp, [])
            else:
                plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
                without = self.render(plain, agp, tools)
            if without == text:
                logger.warning("mmpipe.encode: the chat template ignores %s (it renders the conversation "
                               "the same without them); use a chat template that renders tool use", field)
