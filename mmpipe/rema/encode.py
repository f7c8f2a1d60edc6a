"""Encode one role's view of a conversation: ids, labels, step_ids, positions, pixels.

The training ids are the tokenizer/processor ids of the whole rendered conversation (one
tokenizer call, so nothing drifts at turn borders); a response's tokens are found by its
character span in the rendered text. Responses enter conversations as text: the engine's
ids decoded with special tokens skipped (vLLM's ``CompletionOutput.text``), special-token
spellings removed, then normalised as the tokenizer normalises text, so the labeled tokens
decode to exactly the stored response. If a response starts with characters the tokenizer
merges with the template's text before it (a leading newline with the real Qwen
vocabulary), that merged token starts in the template and is not a target.

Each reply must stand verbatim right after the generation prompt it was sampled after, in its
own turn and once later turns exist. A template that rewrites replies (GLM-4.6V and other
thinking templates write ``<think></think>`` in place of an earlier reply's reasoning) is
refused with where the renders part; such models are encoded exactly with thinking off
(``Encoder(processor, labels=False, chat_template_kwargs={"enable_thinking": False})``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.placeholders import expand_image_pads
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, InputError, ParseError, PlaceholderError
from mmpipe.images.pixels import encode_image
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.rema.views import content_items, num_images
from mmpipe.rollout.support import RolloutRefusal, check_rollout
from mmpipe.records.rema import content_text
from mmpipe.records.rema import RoleEncoding

__all__ = ["RoleEncoding", "RoleCodec", "encode_conversation", "response_text"]


class RoleCodec:
    """Renders and encodes role views with one processor (an `Encoder` underneath).

    Built once per rollout and shared by the turn loop (`mmpipe.rema.rollout`) and the batch
    (`mmpipe.rema.batch`): ``processor`` is a Qwen-VL processor, a tokenizer (text-only
    model) or an `Encoder`. Holds the tokenizer's special ids / spellings (removed from
    responses) and its normaliser.
    """

    def __init__(self, processor):
        enc = processor if isinstance(processor, Encoder) else Encoder(processor, labels=False)
        self.enc, self.fam, self.tok = enc, enc.family, enc.tokenizer
        try:  # the views are multi-turn conversations laid out as patch grids (ReMA has no stage of its own)
            check_rollout(self.fam, "multiturn")
        except RolloutRefusal:
            raise ArgumentError(
                f"the ReMA rollout takes the patch-grid families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.xV) or a "
                f"text tokenizer; {type(processor).__name__} is of family {self.fam.name!r}, whose multi-turn "
                "rows are not laid out here; use a patch-grid family's processor, or pass processor.tokenizer "
                "for text-only questions"
            ) from None
        # a template that writes no end of turn after a reply (GLM-4.xV) gets the family's stop token
        # appended to each reply, as LLaMA-Factory does: ReMA's target after a stopped response is EOS
        rule = enc.stop_rule()
        self.appended_stop = None if rule.written or not rule.token else rule.token
        specials = set(getattr(self.tok, "all_special_tokens", ()))
        self.special_ids = set(int(i) for i in getattr(self.tok, "all_special_ids", ()))
        # longest first, so "<|im_end|>" is removed before a shorter special it might contain
        self.special_strings = tuple(sorted(specials, key=len, reverse=True))
        backend = getattr(self.tok, "backend_tokenizer", None)
        self.normalizer = getattr(backend, "normalizer", None)
        self.vision_tokens = VisionTokens.from_processor(self.tok, family=self.fam)

    # -- images ---------------------------------------------------------------------------
    def encode_images(self, images: Sequence, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Images -> (uint8 patches [N, 3*p*p], grids int64 [I, 3]); once per question."""
        fam = self.fam
        if images and not fam.is_vision:
            raise PlaceholderError(f"holds {len(images)} image(s) but the processor is a text-only tokenizer",
                                   where=where, column="images", expected="no images (text-only tokenizer)",
                                   found=f"{len(images)} image(s)",
                                   fix="pass a Qwen-VL processor for questions with images")
        blocks, grids = [], []
        for k, img in enumerate(images):
            u8, g = encode_image(img, self.enc.spec, where=f"{where}, image {k}")
            blocks.append(u8)
            grids.append(g)
        width = fam.patch_dim_u8
        u8 = np.concatenate(blocks) if blocks else np.zeros((0, width), np.uint8)
        return u8, np.asarray(grids, np.int64).reshape(-1, 3)

    # -- text -----------------------------------------------------------------------------
    def response_text(self, token_ids: Sequence[int]) -> str:
        """Generated ids -> the response as it enters the conversation (see module doc)."""
        ids = [int(t) for t in token_ids if int(t) not in self.special_ids]
        text = self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        # text that spells a special token would re-tokenize as that control token (a literal
        # "<|image_pad|>" becomes an image slot with no image): remove it, as skip_special_tokens does
        changed = True
        while changed:
            changed = False
            for s in self.special_strings:
                if s and s in text:
                    text, changed = text.replace(s, ""), True
        if self.normalizer is not None:
            text = self.normalizer.normalize_str(text)
        return text

    def render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        """The chat text of normalised messages (the encoder's template)."""
        # pure-text contents as strings: text-LLM templates print a list's repr; VL templates
        # render both forms identically
        msgs = [
            {"role": m["role"], "content": m["content"] if num_images(m["content"]) else content_text(m["content"])}
            for m in messages
        ]
        if self.appended_stop:  # assistant contents are text (`encode` refuses images there)
            msgs = [{**m, "content": m["content"] + self.appended_stop} if m["role"] == "assistant" else m for m in msgs]
        return self.enc.render(msgs, add_generation_prompt)

    # -- one view -------------------------------------------------------------------------
    def encode(self, messages: Sequence[dict], *, image_data, add_generation_prompt: bool,
               finish_reasons: Optional[Sequence[str]] = None, where: str = "conversation") -> RoleEncoding:
        """One role's view (normalised messages) -> `RoleEncoding` (see `encode_conversation`);
        ``image_data``: the question's (uint8 patches [N, 3*p*p], grids int64 [I, 3])."""
        fam, tok = self.fam, self.tok
        u8, grids = image_data
        full = self.render(messages, add_generation_prompt)
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=not add_generation_prompt)
        ids = np.asarray(enc["input_ids"], np.int64)
        labels = steps = None
        tail = 0
        if not add_generation_prompt:
            starts = np.asarray([s for s, _ in enc["offset_mapping"]], np.int64).reshape(-1)
            labels = np.full(ids.shape, IGNORE_INDEX, np.int64)
            steps = np.full(ids.shape, IGNORE_INDEX, np.int64)
            turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
            reasons = list(finish_reasons) if finish_reasons is not None else ["stop"] * len(turns)
            if len(reasons) != len(turns):
                raise ArgumentError(
                    f"{where}: {len(reasons)} finish reason(s) for {len(turns)} assistant message(s); "
                    "give one finish reason per response (finish_reasons=)"
                )
            for step, (k, reason) in enumerate(zip(turns, reasons)):
                if num_images(messages[k]["content"]):
                    raise ParseError(
                        "an assistant message holds an image; responses are text", where=f"{where}, message {k}",
                        stage="rollout", column="messages", expected="text only in assistant messages",
                        found=f"{num_images(messages[k]['content'])} image item(s)",
                        fix="show images in the question or a user turn",
                    )
                a, b = self.reply_span(messages, k, full, where)
                sel = (starts >= a) & (starts < b)
                self._refuse_vision_tokens(ids, sel, f"{where}, message {k}")
                labels[sel], steps[sel] = ids[sel], step
                if reason == "stop":  # the end-of-turn token is a target only after a normal stop
                    hit = np.flatnonzero(starts == b)
                    if len(hit) and int(ids[hit[0]]) in self.special_ids:
                        labels[hit[0]], steps[hit[0]] = ids[hit[0]], step
                if k == len(messages) - 1:  # the template's tokens after the last response
                    tail = int((starts >= b).sum())
        mm = np.zeros(ids.shape, np.int64)
        if fam.is_vision:
            pad = np.flatnonzero(ids == self.enc.image_token_id)
            if len(pad) != len(grids):
                raise PlaceholderError(
                    f"the rendered view holds {len(pad)} {fam.image_token} token(s) but the question has "
                    f"{len(grids)} image(s); every role's view must show each question image exactly once",
                    where=where, column="messages", expected=f"{len(grids)} {fam.image_token} token(s)",
                    found=f"{len(pad)} {fam.image_token} token(s)", fix="include ctx.question in the role's first message",
                )
            if (ids == self.enc.video_token_id).any():
                raise PlaceholderError(f"the view holds {fam.video_token}; videos are not supported here",
                                       where=where, column="messages", expected="images only",
                                       found=f"{int((ids == self.enc.video_token_id).sum())} {fam.video_token} token(s)",
                                       fix="show images, not videos")
            if len(pad):
                ids, labels, steps = expand_image_pads(ids, pad, grids, fam, labels, steps)
                mm = self.enc.token_types(ids)
        from mmpipe.rope import get_rope_index

        pos, delta = get_rope_index(ids[None], mm[None], image_grid_thw=grids if len(grids) else None, family=fam)
        row = MultiModalInputs(
            input_ids=ids, attention_mask=np.ones(ids.shape, np.int64), mm_token_type_ids=mm,
            position_ids=pos[:, 0, :].numpy(), rope_delta=int(delta.reshape(-1)[0]), family=fam.name,
            labels=labels, image_grid_thw=grids, pixel_values_u8=u8,
        )
        return RoleEncoding(row=row, step_ids=steps if steps is not None else np.full(ids.shape, IGNORE_INDEX, np.int64),
                            text=full, tail=tail)

    def _refuse_vision_tokens(self, ids: np.ndarray, sel: np.ndarray, where: str) -> None:
        """A response (``ids[sel]``, sel bool [L]) holding a vision special token is refused
        (`mmpipe.records.vision_tokens`). Rollout responses never do (`response_text` removes
        special tokens); assistant messages handed to `encode_conversation` may."""
        pos = np.flatnonzero(sel)
        if len(pos):
            self.vision_tokens.with_policy("raise").apply(ids[pos], where=where, row=None, offset=int(pos[0]))

    def reply_span(self, messages, k: int, full: str, where: str) -> tuple[int, int]:
        """Character span of assistant message ``k``'s content in ``full``: right after the
        conversation before it rendered with the generation prompt (the prompt the reply was
        sampled after), verbatim; `_unstable_error` where the template writes it otherwise."""
        before = self.render(messages[:k], True)
        upto = self.render(messages[: k + 1], False)
        text = content_text(messages[k]["content"])
        a = len(before)
        if not (full.startswith(upto) and upto.startswith(before) and upto[a:a + len(text)] == text):
            raise _unstable_error(k, before, text, upto, full, where)
        return a, a + len(text)


def _unstable_error(k: int, before: str, text: str, upto: str, full: str, where: str) -> InputError:
    """The `InputError` of a template that does not write reply ``k`` verbatim right after the
    generation prompt it was sampled after (``before``): where the renders part, and what to do."""
    sampled = before + text  # what the model saw and wrote in the rollout
    if not (upto.startswith(before) and upto[len(before):len(before) + len(text)] == text):
        what, bad = "this reply's own turn (rendered as the conversation's last message)", upto
    else:
        what, bad = "the whole conversation (a later turn follows the reply)", full
    i = next((j for j, (x, y) in enumerate(zip(sampled, bad)) if x != y), min(len(sampled), len(bad)))
    think = "<think>" in bad[max(0, i - 20):i + 40] or "</think>" in text
    return InputError(
        "the chat template does not write this reply verbatim after the generation prompt it was sampled "
        f"after: {what} renders it differently, so its training tokens would not be the ones the model "
        "generated in that context and the reply cannot be labeled" + (
            " (a thinking template: earlier replies' reasoning is replaced by '<think></think>', "
            "or the generation prompt lacks the '<think></think>' the reply's turn gets)" if think else ""),
        where=f"{where}, message {k}", stage="template", column="messages",
        expected=f"at character {i}: {sampled[max(0, i - 20):i + 40]!r} (the prompt, then the reply as sampled)",
        found=f"{bad[max(0, i - 20):i + 40]!r}",
        fix="render the role's turns so every prompt is a prefix of the next: for a thinking template "
            "(GLM-4.6V, Qwen3) pass Encoder(processor, labels=False, chat_template_kwargs={'enable_thinking': "
            "False}) as the processor and sample replies without reasoning; otherwise give the tokenizer a chat "
            "template that writes each reply unchanged (no stripping, no rewriting of earlier turns)",
    )


def encode_conversation(messages: Sequence[dict], processor, *, images: Sequence = (),
                        finish_reasons: Optional[Sequence[str]] = None, add_generation_prompt: bool = False,
                        where: str = "conversation") -> RoleEncoding:
    """One role's view of a conversation -> ids, labels, step_ids, attention_mask, positions.

    Args:
        messages: the role's view: optional ``system``, then ``user`` / ``assistant``
            alternating; contents are strings or content lists whose ``{"type": "image"}``
            items take ``images`` in order. The role's own responses are the ``assistant``
            messages (other roles' messages reach it as ``user`` content).
        processor: a Qwen-VL processor, a tokenizer (text-only model) or an `Encoder`.
        images: the conversation's images (PIL, path, bytes, uint8 array, ...).
        finish_reasons: per assistant message, the engine's finish reason; the end-of-turn
            token after a response is a target only where it is ``"stop"`` (default: all).
        add_generation_prompt: encode a prompt (no labels) ending with the generation prompt.

    Returns a `RoleEncoding`: input_ids int64 [L] equal to the processor's ids for the whole
    rendered conversation; labels int64 [L] -100 except the assistant messages' tokens (and
    their end-of-turn token after a normal stop); step_ids int64 [L] the assistant message
    index on those tokens, -100 elsewhere; attention_mask int64 [L] ones; position_ids int64
    [3, L] (M-RoPE when there are images, equal rows otherwise); grids and uint8 pixels.

    Example::

        enc = encode_conversation([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], tok)
        tok.decode(enc.input_ids[enc.labels != -100])    # '4<|im_end|>'
    """
    codec = RoleCodec(processor)
    msgs = _parse_messages(messages, where)
    n_items = sum(num_images(m["content"]) for m in msgs)
    if n_items != len(images):
        raise PlaceholderError(f"{n_items} image item(s) in the messages but {len(images)} image(s) given",
                               where=where, column="images", expected=f"{n_items} image(s)", found=f"{len(images)} image(s)",
                               fix="give one image per item")
    return codec.encode(msgs, image_data=codec.encode_images(images, where), add_generation_prompt=add_generation_prompt,
                        finish_reasons=finish_reasons, where=where)


def _parse_messages(messages, where: str) -> list[dict]:
    """Messages -> normalised messages (`content_items`); `ParseError` (stage "rollout", column
    "messages") for a value that is not a list of messages, a message without a known role or
    without content (None is not an empty reply: pass ""), a conversation whose first
    non-system message is not the user's (a role's view starts [system,] user), and two
    assistant messages in a row (a reply without a prompt: another role's reply or a split
    one). Consecutive user messages are kept: they are context, never targets, and ReMA's
    encoder takes them too."""
    if not isinstance(messages, (list, tuple)):
        raise ParseError("messages", where=where, stage="rollout", column="messages",
                         expected="a list of {'role': ..., 'content': ...} dicts", found=type(messages).__name__,
                         fix="pass the role's view as a list of chat messages")
    msgs = []
    for k, m in enumerate(messages):
        at = f"{where}, message {k}"
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ParseError("message", where=at, stage="rollout", column="messages",
                             expected="{'role': system|user|assistant, 'content': ...}", found=f"{m!r:.80}",
                             fix="a role's own replies are 'assistant'; the other roles' turns reach it as 'user'")
        if m.get("content") is None:
            raise ParseError(f"{m['role']} message without content", where=at, stage="rollout", column="messages",
                             expected="a string or a list of content items", found=f"{m!r:.80}",
                             fix='give its text; an empty reply is content ""')
        msgs.append({"role": m["role"], "content": content_items(m["content"], at, "messages")})
    first = next((k for k, m in enumerate(msgs) if m["role"] != "system"), None)
    if first is not None and msgs[first]["role"] != "user":
        raise ParseError("the conversation starts with an assistant message", where=f"{where}, message {first}",
                         stage="rollout", column="messages", expected="[system,] user, assistant, user, ...",
                         found=f"{[m['role'] for m in msgs][:4]}",
                         fix="put the message the role answers (the question) as a user message before its reply")
    _refuse_reply_without_prompt(msgs, where)
    return msgs


def _refuse_reply_without_prompt(msgs: list[dict], where: str) -> None:
    """`ParseError` for an assistant message whose previous non-system message is an assistant
    message too (ReMA's turns alternate: the role's reply follows the prompt it answers)."""
    last = None  # the previous non-system message's index
    for k, m in enumerate(msgs):
        if m["role"] == "system":
            continue
        prev, last = last, k
        if m["role"] == "assistant" and prev is not None and msgs[prev]["role"] == "assistant":
            raise ParseError(
                "two assistant messages in a row: each assistant message is this role's own reply to the user "
                "message before it (one turn of ReMA's loop, trained as this role's tokens and counted as its own "
                "turn in step_ids); a reply with no prompt before it is another role's reply (its tokens would be "
                "trained as this role's) or one reply split in two (counted as two turns)",
                where=f"{where}, message {k}", stage="rollout", column="messages",
                expected="[system,] user, assistant, user, assistant, ...", found=f"messages {prev} and {k} assistant",
                fix="pass another role's reply as a user message (its content is this role's view of it), or merge "
                    "the role's consecutive replies into one assistant message")


def response_text(token_ids: Sequence[int], processor) -> str:
    """Generated ids -> the response text exactly as the rollout puts it into conversations
    (special tokens and their spellings removed, tokenizer-normalised); for rewards that must
    score the same text the policy is trained on."""
    return RoleCodec(processor).response_text(token_ids)
