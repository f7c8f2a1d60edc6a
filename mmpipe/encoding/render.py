"""Encode, the chat template side of `mmpipe.Encoder`, the same for every family: put each
message's content in the form the template renders for its role (`template_messages`), render a
conversation (one or many in one batched call), read a row's tools, find the character spans of
the assistant replies (what ``labels`` train on: `mmpipe.encoding.spans`) and turn them into
token labels (`span_labels`).
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from mmpipe._fork import ForkSafeLock
from mmpipe.encoding.marked_render import Probe, TrackedText, overlay, plain_text
from mmpipe.encoding.parse import check_text, parse_tools
from mmpipe.encoding.spans import ReplySpans, StopRule, locate_replies, marked_messages, reply_indices
from mmpipe.errors import InputError, PlaceholderError
from mmpipe.records.columns import IGNORE_INDEX

__all__ = ["ChatTemplate", "span_labels"]

logger = logging.getLogger("mmpipe.encoding.encoder")
# (processor class, its chat templates, chat_template_kwargs, cause) whose ignored tool use was logged in
# this process: one warning per template and cause, not one per Encoder (mmpipe.encode_row builds one
# per call; a dataset's __getitem__ calling it warned on every row)
_WARNED_TOOLS: set = set()
_WARNED_LOCK = ForkSafeLock()


def _warn_ignored_once(enc, field: str) -> None:
    """The warning that ``enc``'s chat template ignores ``field`` (``"tool_calls"``, ``"tools"``,
    ``"tool turns"``), logged the first time only for the same template and cause in this process."""
    settings = enc.processor_settings or {}
    key = (enc.processor_class, settings.get("tokenizer"), settings.get("chat_template"),
           repr(sorted(enc.chat_template_kwargs.items())), field)
    with _WARNED_LOCK:
        if key in _WARNED_TOOLS:
            return
        _WARNED_TOOLS.add(key)
    logger.warning("mmpipe.encode: the chat template ignores %s (it renders the conversation the same without "
                   "them); use a chat template that renders tool use", field)


def span_labels(ids: np.ndarray, offsets: np.ndarray, spans: list) -> np.ndarray:
    """int64 [L]: ``ids`` int64 [L] where a token (character ``offsets`` int64 [L, 2]) overlaps
    one of ``spans`` ([(start, end)] characters), -100 elsewhere. A token merging the header's
    newline with a reply's leading newline counts (transformers' assistant-mask rule)."""
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    if spans and len(ids):
        # spans in order, disjoint: a token overlaps one iff it overlaps the last span starting
        # before its end (one pass, however many replies)
        a, b = (np.asarray(x, np.int64) for x in zip(*sorted(spans)))
        last = np.searchsorted(a, offsets[:, 1], side="left") - 1
        sel = (last >= 0) & (offsets[:, 0] < b[np.maximum(last, 0)])
        labels[sel] = ids[sel]
    return labels


_PROBE = "\x02mmpipe-probe\x03"


class _DirectRender:
    """A transformers processor's ``apply_chat_template(conversations, tokenize=False)`` without
    its copies: for plain conversations (dicts of role and content, the content a string or a
    list of dicts of strings, no None values, no reasoning fields, no ``image_url`` parts; no
    tools, no extra template kwargs) the call renders ``compiled.render(messages=conversation,
    tools=None, documents=None, add_generation_prompt=..., **tokenizer.special_tokens_map)`` on
    deep copies of the same values (`_plain_template_data`, `_normalize_chat_messages`), which
    the immutable sandbox never writes. The first batch rendered this way is checked against the
    processor's call, once per processor class, template and template kwargs in a process (a
    difference turns the way off for them: ``_checked``)."""

    _compiled: dict = {}  # template text -> compiled template (None: not available)
    _checked: dict = {}  # (processor class, template text, template kwargs) -> renders the same as the call

    @classmethod
    def run(cls, enc, target, conversations: list, agp: bool) -> Optional[list]:
        if not conversations or not all(map(_plain_conversation, conversations)):
            return None
        compiled, kwargs, key = cls._template(enc, target)
        if compiled is None:
            return None
        try:
            out = _render_each(compiled, conversations, agp, kwargs)
        except Exception:  # noqa: BLE001 - the processor's call raises it, with its message
            return None
        if key not in cls._checked:
            try:
                slow = target.apply_chat_template([list(c) for c in conversations], tokenize=False,
                                                  add_generation_prompt=agp)
            except Exception:  # noqa: BLE001
                return None
            cls._checked[key] = out == ([slow] if isinstance(slow, str) else list(slow))
        if not cls._checked[key]:
            logger.debug("the direct chat-template render differs from the processor's call; not used")
            return None
        return out

    @classmethod
    def _template(cls, enc, target):
        """(compiled template, template kwargs, check key) of a plain transformers processor, else Nones."""
        try:
            from transformers.processing_utils import ProcessorMixin
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:
            return None, None, None
        if (not isinstance(target, ProcessorMixin)
                or type(target).apply_chat_template is not ProcessorMixin.apply_chat_template
                or "apply_chat_template" in vars(target)  # patched on the instance: call it
                or not hasattr(target, "_resolve_chat_template")):
            return None, None, None
        try:
            text = target._resolve_chat_template(None)
        except Exception:  # noqa: BLE001
            return None, None, None
        if text not in cls._compiled:
            try:  # the processor's compiled template, in an overlay that writes TrackedText out
                cls._compiled[text] = overlay(_compile_jinja_template(text), text)
            except Exception:  # noqa: BLE001
                cls._compiled[text] = None
        kwargs = enc.__dict__.get("_direct_kwargs")
        if kwargs is None:
            kwargs = enc._direct_kwargs = dict(target.tokenizer.special_tokens_map)
        key = (type(target), text, repr(sorted(kwargs.items())))
        return cls._compiled[text], kwargs, key


def _render_each(compiled, conversations: list, agp: bool, kwargs: dict) -> list:
    """``[compiled.render(messages=c, tools=None, documents=None, add_generation_prompt=agp,
    **kwargs) for c in conversations]``: the same strings, each context built from one flat copy
    of the template's globals. jinja keeps a template's globals as a ``ChainMap``, which
    ``render`` copies into a dict and a set for every call: ~11 of the ~14 us that a render costs
    before the template runs (30 conversations: ~0.3 ms). Raises what ``render`` raises (a
    repeated keyword as the call's ``TypeError``; jinja's own errors without its traceback
    rewrite: the caller only needs to know it failed)."""
    env = compiled.environment
    if env.is_async:  # jinja's async render: left to it
        return [compiled.render(messages=c, tools=None, documents=None, add_generation_prompt=agp, **kwargs)
                for c in conversations]
    flat = dict(compiled.globals)
    # the call's vars, in its order (new_context's ``dict(globals, **vars)``); messages set per row
    base = dict(flat, **dict(messages=None, tools=None, documents=None, add_generation_prompt=agp, **kwargs))
    make, name, blocks, concat, root = env.context_class, compiled.name, compiled.blocks, env.concat, \
        compiled.root_render_func
    out = []
    for c in conversations:
        parent = base.copy()
        parent["messages"] = c
        out.append(concat(root(make(env, parent, name, blocks, globals=flat))))
    return out


_PLAIN_KEYS = frozenset(("role", "content"))
_STRINGS = (str, TrackedText)  # a marked reply's content is a TrackedText (`marked_render`)


def _plain_conversation(messages) -> bool:
    """Whether the processor's call renders ``messages`` as they are (`_DirectRender`)."""
    if type(messages) is not list:
        return False
    for m in messages:
        if type(m) is not dict or not m.keys() <= _PLAIN_KEYS or type(m.get("role")) is not str:
            return False
        content = m.get("content")
        if type(content) in _STRINGS:
            continue
        if type(content) is not list:
            return False
        for part in content:
            if type(part) is not dict or part.get("type") == "image_url":
                return False
            for v in part.values():
                if type(v) not in _STRINGS:
                    return False
    return True


def _probe_conversation(role: str, content) -> list:
    """The shortest conversation a template renders with one ``role`` message of ``content``."""
    a = {"role": "user", "content": "a"}
    if role == "system":
        return [{"role": "system", "content": content}, a]
    if role == "assistant":
        return [a, {"role": "assistant", "content": content}]
    if role == "tool":
        return [a, {"role": "assistant", "content": "b"}, {"role": "tool", "content": content}]
    return [{"role": role, "content": content}]


class ChatTemplate:
    """The rendering half of `mmpipe.Encoder` (it sets ``processor``, ``tokenizer``, ``tools``,
    ``tools_column``, ``chat_template_kwargs``, ``add_generation_prompt`` and the runtime set
    ``_checked_tool_fields``)."""

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: Optional[list] = None, *,
               probe: bool = False) -> str:
        """The chat template applied to ``messages`` (text, not tokenized), with ``tools``
        (None: the encoder's ``tools`` option) passed as ``tools=``. ``probe``: a probe render of
        how the template writes turns (`stop_rule`, `reply_header`, `content_form`): without
        ``continue_final_message``, which would cut the probe's own last turn open."""
        return self.render_many([messages], add_generation_prompt, tools, probe=probe)[0]

    def render_many(self, conversations: list, add_generation_prompt: bool,
                    tools: Optional[list] = None, *, probe: bool = False) -> list:
        """`render` of each conversation in one batched ``apply_chat_template`` call (same strings);
        plain conversations of a transformers processor go through its compiled template directly
        (`_DirectRender`: the same render without the call's two deep copies, ~half its time)."""
        target = self.processor if hasattr(self.processor, "apply_chat_template") else self.tokenizer
        tools = self.tools if tools is None else tools
        kwargs = self.chat_template_kwargs
        if probe and "continue_final_message" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "continue_final_message"}
        if tools is None and not kwargs:
            out = _DirectRender.run(self, target, conversations, add_generation_prompt)
            if out is not None:
                return out
        extra = {"tools": tools} if tools is not None else {}
        try:
            out = target.apply_chat_template([list(c) for c in conversations], tokenize=False, **extra,
                                             add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as e:  # jinja raises its own types (TemplateError, TypeError, ...)
            calls = [c.get("function") or c for conv in conversations for m in conv if isinstance(m, dict)
                     for c in m.get("tool_calls") or () if isinstance(c, dict)]  # GLM templates read a mapping
            as_str = any(isinstance(c, dict) and isinstance(c.get("arguments"), str) for c in calls)
            raise InputError(f"the chat template failed on these messages ({type(e).__name__}: {e})",
                             stage="template", column="messages", expected="messages the chat template renders",
                             found=f"{type(e).__name__} from the template",
                             fix=("tool_calls arguments are JSON strings: pass them as dicts (json.loads), as "
                                  "this template may iterate them; or " if as_str else "")
                             + "check the roles and their order against the model's chat template") from e
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

    def marked_render(self, conversations: list, agp: bool, tools: Optional[list] = None) -> list:
        """``[(text, marked)]`` per conversation: its render and the render of its
        `marked_messages`, from that one render where it provably gives both
        (`mmpipe.encoding.marked_render`), else from two. ``marked`` is None where the template
        fails on it; a conversation whose own render fails raises as `render_many` does."""
        probes = [Probe() for _ in conversations]
        try:
            marked = self.render_many([marked_messages(c, p) for c, p in zip(conversations, probes)], agp, tools)
        except InputError:
            marked = [None] * len(conversations)
        texts = [None if m is None else plain_text(m, p, reply_indices(c))
                 for c, m, p in zip(conversations, marked, probes)]
        again = [i for i, t in enumerate(texts) if t is None]
        for i, t in zip(again, self.render_many([conversations[i] for i in again], agp, tools) if again else []):
            texts[i] = t
        return list(zip(texts, marked))

    def prompt_text(self, messages: list[dict], agp: bool, tools: Optional[list], where: str,
                    text: Optional[str] = None) -> str:
        """The row's rendered prompt (``text``: already rendered), checked (`check_text`); logs once
        when the template drops tool use."""
        text = self.render(messages, agp, tools) if text is None else text
        self.warn_ignored_tools(messages, agp, tools, text)
        return check_text(text, where=where, column="messages", what="the rendered prompt")

    # -- content forms ----------------------------------------------------------------------
    def content_form(self, role: str) -> str:
        """How the template renders a ``role`` message's content: ``"list"`` (it renders a list
        of parts, a string not: LLaVA-OneVision's filters parts by type), ``"string"`` (it prints
        the content as it is, a list as its Python repr: GLM-4.1V's assistant and system turns)
        or ``"any"``. Probed once per role and encoder."""
        forms = self.__dict__.setdefault("_content_forms", {})
        if role not in forms:
            def shows(content, repr_free: bool) -> bool:
                try:
                    text = self.render(_probe_conversation(role, content), False, [] if self.tools else None, probe=True)
                except InputError:
                    return True  # the probe conversation is not one this template takes: leave rows as they are
                return _PROBE in text and not (repr_free and ("'text'" in text or '"text"' in text))
            as_list, as_string = shows([{"type": "text", "text": _PROBE}], True), shows(_PROBE, False)
            forms[role] = "any" if as_list == as_string else ("list" if as_list else "string")
        return forms[role]

    def template_messages(self, messages: list[dict], where: str) -> list[dict]:
        """``messages`` with each content in the form the template renders for its role
        (`content_form`): text parts joined into a string where it prints the content as it is
        (never a Python repr in the training text: a part other than text there is a
        `PlaceholderError`), a string made one text part where it renders only parts."""
        out = []
        for m_i, m in enumerate(messages):
            content, form = m.get("content"), self.content_form(m["role"])
            if form == "string" and isinstance(content, list):
                other = [p.get("type") for p in content if p.get("type") != "text"]
                if other:
                    raise PlaceholderError(
                        f"message {m_i} ({m['role']}) holds a {other[0]} item, but the chat template prints "
                        f"{m['role']} content as it is (a list of parts would be written as its Python repr)",
                        where=where, column="messages", expected="text parts only", found=f"a {other[0]} item",
                        fix=f"move the {other[0]}s to a user turn, or use a chat template that renders "
                            f"{m['role']} content parts")
                m = {**m, "content": "".join(str(p.get("text", "")) for p in content)}
            elif form == "list" and isinstance(content, str):
                m = {**m, "content": [{"type": "text", "text": content}]}
            out.append(m)
        return out

    # -- replies ------------------------------------------------------------------------------
    def unlabel_vision(self, ids: np.ndarray, labels: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """``labels`` int64 [L] with -100 at every vision token of the family in ``ids`` int64 [L]
        (the ids the patch-grid encoder found once, `ModelFamily.vision_token_ids`: image and video
        pads and the image's start and end tokens, ``<|vision_start|>`` / ``<|begin_of_image|>``),
        an image inside a reply included: inputs, never targets (the rollout side bans them in
        samples). In place; None stays None."""
        if labels is None:
            return None
        unk = getattr(self.tokenizer, "unk_token_id", None)
        vision = [i for i in (self.image_token_id, self.video_token_id, self.vision_start_id, self.vision_end_id)
                  if i is not None and i != unk]
        if vision:
            labels[np.isin(ids, vision)] = IGNORE_INDEX
        return labels

    def stop_rule(self) -> StopRule:
        """The end-of-turn rule of this encoder (`mmpipe.encoding.spans.StopRule`): the end-of-turn
        text the template writes after a reply (what it writes there up to its last special added
        token or the family's stop token: ``<|im_end|>``, ``<end_of_turn>``; one probe), else the
        family's stop token (the tokenizer's eos), and the ``end_of_turn`` option."""
        rule = self.__dict__.get("_stop_rule")
        if rule is None:
            probe = self.template_messages(_probe_conversation("assistant", [{"type": "text", "text": _PROBE}]), "")
            try:
                text = self.render(probe, False, None, probe=True)
            except InputError:
                text = ""
            after = text[text.index(_PROBE) + len(_PROBE):] if _PROBE in text else ""
            stop = self.family.stop_token or getattr(self.tokenizer, "eos_token", None)
            # special added tokens only: a tokenizer may hold "\n" runs as plain added tokens (Gemma's), and
            # the newline after <end_of_turn> is the template's, not the reply's
            added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
            special = [str(t) for t in added.values() if getattr(t, "special", True)] + [stop]
            end = max((after.find(t) + len(t) for t in special if t and t in after), default=0)
            token = after[:end] or stop
            rule = self._stop_rule = StopRule(token, end > 0, self.end_of_turn == "stop_token")
        return rule

    def reply_header(self) -> str:
        """The text the template writes before a reply (its generation prompt: the conversation
        rendered with it, minus without); "" when that is not a suffix (probed once)."""
        header = self.__dict__.get("_reply_header")
        if header is None:
            probe = self.template_messages([{"role": "user", "content": "a"}], "")
            try:
                without, with_prompt = self.render(probe, False, None, probe=True), self.render(probe, True, None, probe=True)
            except InputError:
                without, with_prompt = "", ""
            header = self._reply_header = with_prompt[len(without):] if with_prompt.startswith(without) else ""
        return header

    def reply_spans(self, messages: list[dict], full: str, where: str, tools: Optional[list] = None,
                    full_agp: Optional[bool] = None, marked_text: Optional[str] = None) -> ReplySpans:
        """The text to tokenize and the character spans of the assistant replies in it
        (`mmpipe.encoding.spans.locate_replies`): ``full`` itself, or with the family's stop
        token appended to each reply under ``end_of_turn="stop_token"`` where the template
        writes none. ``full_agp``: the ``add_generation_prompt`` of ``full``; ``marked_text``:
        the render of `mmpipe.encoding.spans.marked_messages` when the caller batched it."""
        if full_agp is None:
            full_agp = self.generation_prompt(messages)
        return locate_replies(self, messages, full, where, tools, full_agp, self.stop_rule(), marked_text)

    def warn_ignored_tools(self, messages: list[dict], agp: bool, tools: Optional[list], text: str) -> None:
        """Log once per process and cause (`_warn_ignored_once`) when the chat template renders a row's ``tool_calls``, ``tools``
        or tool turns (``role: "tool"`` messages) as nothing (Qwen2-VL's / Qwen2.5-VL's processor
        templates ignore the first two, GLM-4.1V's published one drops tool turns, so the model
        would be trained on conversations without them)."""
        checks = (("tool_calls", any(m.get("tool_calls") for m in messages)), ("tools", bool(tools)),
                  ("tool turns", any(m.get("role") == "tool" for m in messages)))
        for field, present in checks:
            if not present or field in self._checked_tool_fields:
                continue
            self._checked_tool_fields.add(field)
            if field == "tools":
                without = self.render(messages, agp, [])
            elif field == "tool_calls":
                plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
                without = self.render(plain, agp, tools)
            else:
                try:  # a template may refuse the conversation without them (roles must alternate)
                    without = self.render([m for m in messages if m.get("role") != "tool"], agp, tools)
                except Exception:  # noqa: BLE001  (it renders them, then)
                    continue
            if without == text:
                _warn_ignored_once(self, field)
