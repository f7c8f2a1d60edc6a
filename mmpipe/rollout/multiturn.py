"""Multi-turn appends (the VRAG-style agent loop): grow an encoded row turn by turn.

A `Conversation` is one encoded row (`MultiModalInputs`) plus what is needed to keep
appending to it: the chat messages so far (images as ``{"type": "image"}`` placeholders), the
images themselves, and the rendered chat text the tokens stand for. Each append renders the
whole conversation through the chat template, checks that the text so far is a prefix of it,
tokenizes only the new suffix, expands its image placeholders, encodes its images and
concatenates ``image_grid_thw`` and pixel data (``pixel_values_u8`` / ``pixel_values``) along
dim 0. Positions of the new tokens continue from the previous maximum (the M-RoPE rule runs
left to right), so nothing already encoded is recomputed.

Invariant (tested for all families): after any sequence of appends whose responses are the
re-tokenized assistant texts, the row equals ``mmpipe.encode_row`` of the whole conversation
(ids, labels, mm_token_type_ids, grids, pixels, positions, rope_delta). Labels are -100
everywhere except the model's response tokens (incl. ``<|im_end|>``); observation and tool
tokens and the generation prompt are never trained on.

Thinking templates (GLM-4.6V, Qwen3 thinking: ``<think></think>`` before a reply without reasoning,
history reasoning dropped after a user turn) keep replies as sampled (`Conversation.sampled`): the row
is the generation prompt, the sampled ids (all labels), then each next turn as the template writes it
after a reply, what the model saw (verl's agent loop; `mmpipe.rollout.turn_text.seen_render`).

    conv = start({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
                  "images": [img]}, processor)
    conv = append_response(conv, completion.token_ids)            # ids as generated, ending <|im_end|>
    conv = append_observation(conv, [{"type": "image"}, {"type": "text", "text": "page 3"}], images=[page])
    conv.row                                                      # a MultiModalInputs, ready to collate

`mmpipe.rollout.multiturn_batch.MultiTurnBatch` keeps B conversations for the loop: which
are still active, their rows for the rollout engine, and every result under its original index.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.parse import no_audio, parse_media, row_where
from mmpipe.encoding.tokenize import added_tokens
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, InputError, ParseError, PlaceholderError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.conversation import Conversation
from mmpipe.rollout.support import check_no_early_stop, check_processor, check_rollout, stop_ids, token_ids
from mmpipe.rollout.turn_buffer import compact, grow
from mmpipe.rollout.turn_media import add_turn_images, add_turn_videos
from mmpipe.encoding.spans import THINK_END
from mmpipe.rollout.turn_text import (drop_tail, end_of_turn, kept_as_sampled, seen_render, tokenize_suffix,
                                     turn_headers)

__all__ = ["Conversation", "start", "conversation_encoder", "append_response", "append_observation", "append_messages"]


# ---- start -------------------------------------------------------------------------------
def start(raw_row: dict, processor, *, index: Any = None, **encode_options) -> Conversation:
    """Encode a raw row (any format `mmpipe.encode` accepts) as the first prompt of a loop.

    ``processor``: a Qwen-VL processor (or tokenizer), or an `Encoder` (then no options).
    The prompt always ends with the generation prompt. ``max_length`` applies to the prompt
    only (appends never cut: the loop decides when a conversation is long enough, from
    ``conv.num_tokens``); only ``truncation="raise"`` is allowed, since cutting a prompt
    would cut its generation prompt.
    """
    enc = conversation_encoder(processor, encode_options)
    messages, images, _, audios = parse_media(raw_row, idx=index, images_column=enc.images_column,
                                              videos_column=enc.videos_column)
    no_audio(audios, row_where(index), "a multi-turn conversation")
    row = enc.encode_row(raw_row, index)
    tools = enc.row_tools(raw_row, index)
    return Conversation(row=row, messages=tuple(messages), images=tuple(images),
                        text=enc.render(messages, True, tools), encoder=enc, index=index, tools=tools)


def conversation_encoder(processor, options: dict) -> Encoder:
    """The `Encoder` a multi-turn loop appends with: ``processor`` (a processor / tokenizer,
    built with ``options``, or an `Encoder`, then no options) with the generation prompt on.
    Raises `ArgumentError` for options next to an Encoder or a truncation other than "raise"."""
    if isinstance(processor, Encoder):
        if options:
            raise ArgumentError(f"pass encode options ({sorted(options)}) to the Encoder, not to start(); "
                                "start() accepts options only with a processor")
        enc = processor
        check_rollout(enc.family, "multiturn")
    else:
        check_processor(processor, "multiturn")  # before encoding anything (the generic path, tiles)
        enc = Encoder(processor, **options)
    if enc.truncation != "raise":
        raise ArgumentError(
            f"multi-turn conversations need truncation='raise' (got {enc.truncation!r}): cutting or dropping "
            "a prompt would cut its generation prompt; filter long prompts before the loop"
        )
    if enc.end_of_turn != "template" and not enc.stop_rule().written:
        raise ArgumentError(f"end_of_turn={enc.end_of_turn!r} appends {enc.stop_rule().token} after each reply where the "
                            "template writes none; a multi-turn loop appends replies as the model generated them: "
                            "leave end_of_turn out (the engine stops on the family's stop tokens)")
    if enc.add_generation_prompt is not True:
        enc = copy.copy(enc)  # shares processor and spec; only the flag differs
        enc.add_generation_prompt = True
    return enc


# ---- responses ---------------------------------------------------------------------------
def append_response(conv: Conversation, response=None, *, text: Optional[str] = None,
                    done: bool = False, finish_reason: Optional[str] = None) -> Conversation:
    """Append the model's reply and close its turn as the chat template does.

    Args:
        response: the generated ids (``Sequence[int]``, as the engine returned them, usually
            ending with ``<|im_end|>``) or a `mmpipe.records.generation.Completion`. They are kept
            as generated, never re-tokenized, and all of them are labels (response mask 1).
            GLM-4.1V stops at the next turn's header (``<|user|>``, ``<|observation|>``): that
            last id is kept and opens the next appended turn (which must be of its kind).
        text: instead of ids, the reply as text (tokenized in context, ``<|im_end|>`` added
            and labelled): what encoding the whole conversation at once gives. A reply that
            merges with the generation prompt's last token (a leading ``\\n`` after
            ``assistant\\n`` under the real Qwen merges: one ``ĊĊ``) replaces that prompt token
            with the merged one, labelled (the row's prompt part is one token shorter).
        done: the conversation ends with this reply (no more observations).
        finish_reason: recorded when ``done`` (default: the Completion's, else "stop").

    The turn is closed by the template's end-of-turn text (``<|im_end|>\\n`` for Qwen). When
    the ids end with ``<|im_end|>`` only the rest (``\\n``) is added; when they do not (cut
    by max_tokens, or stopped by a stop string such as ``</search>``) the whole
    ``<|im_end|>\\n`` is added. Added tokens get label -100: the model did not sample them,
    so they have no rollout log-probability and are not trained on.

    Raises `ArgumentError` (naming the conversation) when the conversation is done or does not
    end with a generation prompt, `PlaceholderError` (stage "rollout") when the ids hold a vision
    special token (a pad would be read as an image slot without an image; the shared check of
    `mmpipe.records.vision_tokens`), `ParseError` (column "token_ids") when a stop token (eos, end
    of turn) sits before the last id (`check_no_early_stop`), `InputError` (stage "template")
    when the template does not render the reply verbatim.
    """
    _check_open(conv, "a response")
    if not conv.awaiting_response:
        raise ArgumentError(
            f"{conv.where}: the last turn is closed (no generation prompt); a response can only follow a prompt "
            "or an observation appended with add_generation_prompt=True"
        )
    if (response is None) == (text is None):
        raise ArgumentError(f"{conv.where}: pass exactly one of response ids or text= (got "
                            f"{'both' if text is not None else 'neither'})")
    if text is None:
        if hasattr(response, "token_ids"):  # a generation.Completion
            finish_reason = finish_reason or getattr(response, "finish_reason", None)
            response = response.token_ids
        new_ids, labels, n_resp, full, messages, sampled = _response_from_ids(conv, token_ids(
            response, where=conv.where, row=conv.index, error=ParseError,
            fix="pass the Completion or its token_ids; a reply as text goes in text="))
        span = (0, n_resp)
        conv = replace(conv, sampled=sampled)
    else:
        conv, new_ids, labels, span, full, messages = _response_from_text(conv, text)
    L = conv.num_tokens
    out = _extend(conv, new_ids, labels, [], [], full, messages, awaiting=False, images_added=())
    out = replace(out, response_spans=conv.response_spans + ((L + span[0], L + span[1]),))
    return finish(out, finish_reason or "stop") if done else out


def finish(conv: Conversation, reason: str = "stop") -> Conversation:
    """``conv`` ended (``done``, ``finish_reason``): nothing more is appended, so its grown pixel
    fields (`turn_buffer.grow`) become exact-size arrays (no spare room kept alive)."""
    row = conv.row
    fields = {k: compact(getattr(row, k)) for k in ("pixel_values_u8", "pixel_values", "pixel_values_videos_u8",
                                                    "pixel_values_videos")}
    row = replace(row, **{k: v for k, v in fields.items() if v is not getattr(row, k)})
    return replace(conv, done=True, finish_reason=reason, row=row)


def _response_from_ids(conv: Conversation, ids: np.ndarray):
    """Generated ids int64 [n] -> (ids + end-of-turn ids, labels, n response tokens, rendered
    text, messages). The ids are kept as generated and all labelled; the end-of-turn text
    the model did not produce is tokenized in context and gets label -100."""
    tok = conv.encoder.tokenizer
    _refuse_vision_tokens(conv, ids)
    # a stop id before the end (padding, text past <|im_end|>) would be labelled as the reply and the
    # turn would end twice in the row
    check_no_early_stop(ids, stop_ids(tok, conv.encoder.family), where=conv.where, row=conv.index, error=ParseError)
    close = end_of_turn(conv)  # e.g. "<|im_end|>\n"
    last = tok.convert_ids_to_tokens(int(ids[-1])) if len(ids) else None
    ended = last is not None and last in added_tokens(tok) and close.startswith(last)
    # GLM-4.1V writes no end of turn and stops at the next turn's header (<|user|>, <|observation|>):
    # that sampled header opens the next turn, which must not render it again
    header = not ended and not close and last in added_tokens(tok) and last in turn_headers(conv)
    content_ids = ids[:-1] if ended or header else ids
    content = tok.decode(content_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    messages = conv.messages + ({"role": "assistant", "content": content},)
    full = _render_checked(conv, messages, False, "the response")
    seen = conv.text + content + close
    thinking = kept_as_sampled(conv, content, close, full)  # a thinking template's reply: as the model saw it
    if full != seen and not thinking:
        raise InputError(
            f"the chat template does not render the reply verbatim followed by {close!r} "
            f"(it rendered {full[len(conv.text):]!r:.120})", where=conv.where, row=conv.index, stage="template",
            expected=f"{(content + close)!r:.80}", found=f"{full[len(conv.text):]!r:.80}",
            fix="re-encode the whole conversation with mmpipe.encode_row instead of appending",
        )
    full = seen if thinking else full
    added = close[len(last):] if ended else close
    close_ids = tokenize_suffix(conv, full[: len(full) - len(added)], added, "the end of the turn")[0]
    new_ids = np.concatenate([ids, close_ids]).astype(np.int64)
    labels = np.concatenate([ids, np.full(len(close_ids), IGNORE_INDEX, np.int64)])
    sampled = conv.sampled + ((len(messages) - 1,) if thinking else ())
    return new_ids, labels, len(ids), full + (last if header else ""), messages, sampled


def _response_from_text(conv: Conversation, text: str):
    """A reply as text -> (the conversation without the prompt tokens the reply re-tokenizes,
    the reply's ids in context, labels, (first, end) of the labelled tokens in the new ids,
    rendered text, messages): labels as encoding it whole gives, up to and including the
    end-of-turn token.

    A reply that merges with the generation prompt's last token (``"\\n..."`` after
    ``"assistant\\n"``: one ``"ĊĊ"`` under the real Qwen merges) replaces that token with the
    merged one, which is labelled (it holds reply text), as ``encode_row`` and transformers'
    assistant mask label it."""
    messages = conv.messages + ({"role": "assistant", "content": text},)
    full = _render_checked(conv, messages, False, "the response")
    suffix = full[len(conv.text):]
    new_ids, starts, ends, k = tokenize_suffix(conv, conv.text, suffix, "the response", merge_back=True)
    _refuse_vision_tokens(conv, new_ids)
    # the encoder's rule (`mmpipe.encoding.spans`): the reply as rendered, then the stop token where the
    # template writes it after a reply, never what follows it
    close, stop = end_of_turn(conv), conv.encoder.stop_rule()
    end = len(suffix) - len(close) if suffix.endswith(close) else len(suffix.rstrip("\n "))
    if stop.written and suffix.endswith(close) and stop.token in close:
        end += close.index(stop.token) + len(stop.token)
    keep = (starts < end) & ((starts >= 0) | (ends > 0))  # reply tokens, one merged with the header's included
    labels = np.where(keep, new_ids, IGNORE_INDEX).astype(np.int64)
    hit = np.flatnonzero(keep)
    span = (int(hit[0]), int(hit[-1]) + 1) if len(hit) else (0, 0)
    if THINK_END in text and suffix == text + close and kept_as_sampled(conv, text, close, full):
        conv = replace(conv, sampled=conv.sampled + (len(messages) - 1,))  # its reasoning as written, kept
    return drop_tail(conv, k), new_ids, labels, span, full, messages


def _refuse_vision_tokens(conv: Conversation, ids: np.ndarray) -> None:
    """Raise `PlaceholderError` when generated ids hold a vision special token (image / video
    pad, vision start / end): the shared check, `mmpipe.records.vision_tokens`."""
    enc = conv.encoder
    vt = VisionTokens.from_processor(enc.tokenizer, family=enc.family)
    vt.apply(ids, where=conv.where, row=conv.index, offset=conv.num_tokens)


# ---- observations ------------------------------------------------------------------------
def append_observation(conv: Conversation, content, images: Sequence = (), *, role: str = "user",
                       add_generation_prompt: bool = True, videos: Sequence = ()) -> Conversation:
    """Append one observation (tool result) turn, then the next generation prompt.

    Args:
        content: a string (``<image>`` marks images when ``images`` are given) or a content
            list of ``{"type": "text", "text": ...}`` / ``{"type": "image"}`` (or inline
            ``{"type": "image", "image": img}``) items.
        images: images for the ``{"type": "image"}`` placeholders, in order.
        videos: videos for the ``{"type": "video"}`` placeholders (``<video>`` in a string), in
            order; any value `mmpipe.encode` takes (path, bytes, frame list, ``{"frames", "fps"}``).
        role: ``"user"`` (the VRAG convention) or ``"tool"`` (Qwen3-VL wraps tool turns in
            ``<tool_response>`` inside a user turn; Qwen2-VL renders ``<|im_start|>tool``).
        add_generation_prompt: end with ``<|im_start|>assistant\\n`` (label -100) so the row
            is the next prompt.

    Every added token has label -100. New images: grids appended to ``image_grid_thw``
    [I, 3], pixels to ``pixel_values_u8`` [N, 3*p*p] (or the encoder's pixel format); new
    videos likewise to ``video_grid_thw`` [V, 3], ``second_per_grid_ts`` [V] and
    ``pixel_values_videos_u8`` [Nv, 3*T*p*p], sampled and sized with the encoder's video options.
    """
    return append_messages(conv, [{"role": role, "content": content}], images,
                           add_generation_prompt=add_generation_prompt, videos=videos)


def append_messages(conv: Conversation, messages: Sequence[dict], images: Sequence = (), *,
                    add_generation_prompt: bool = True, videos: Sequence = ()) -> Conversation:
    """Append non-assistant messages (observations, several tool results at once, a new
    user question) with their images; all added tokens get label -100.

    Consecutive tool results must come in ONE call: templates that merge consecutive tool
    messages into one turn (Qwen3-VL) re-render the earlier one when another is appended,
    which this function detects and refuses.
    """
    _check_open(conv, "messages")
    if conv.awaiting_response:
        raise ArgumentError(
            f"{conv.where}: the row ends with a generation prompt waiting for the model's reply; append the "
            "response (append_response) before the next observation"
        )
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if not messages or "assistant" in roles or None in roles:
        raise ParseError(
            "messages to append", where=conv.where, row=conv.index, stage="rollout", column="messages",
            expected="a non-empty list of non-assistant messages", found=f"roles {roles}",
            fix="append model replies with append_response",
        )
    enc = conv.encoder
    new_msgs, new_images, new_videos, new_audios = parse_media(
        {"messages": list(messages), enc.images_column: list(images), enc.videos_column: list(videos)},
        idx=conv.index, images_column=enc.images_column, videos_column=enc.videos_column)
    no_audio(new_audios, conv.where, "a multi-turn conversation")
    if (new_images or new_videos) and not enc.family.is_vision:
        raise PlaceholderError(
            f"the observation holds {len(new_images)} image(s) and {len(new_videos)} video(s) but the model is "
            "text-only", where=conv.where, row=conv.index, column="images", expected="a text-only observation",
            found=f"{len(new_images)} image(s), {len(new_videos)} video(s)",
            fix="send text-only observations to a text model",
        )
    all_msgs = conv.messages + tuple(new_msgs)
    full = _render_checked(conv, all_msgs, add_generation_prompt, "the observation")
    ids = tokenize_suffix(conv, conv.text, full[len(conv.text):], "the observation")[0]
    # images first: GLM-4.1V expands a video into frames of <|image|> tokens, not to be counted as images
    ids, grids, blocks = add_turn_images(conv, ids, new_images)
    ids, video = add_turn_videos(conv, ids, new_videos)
    labels = np.full(ids.shape, IGNORE_INDEX, np.int64)
    return _extend(conv, ids, labels, grids, blocks, full, all_msgs, awaiting=add_generation_prompt,
                   images_added=tuple(new_images), video=video)


# ---- shared machinery --------------------------------------------------------------------
def _check_open(conv: Conversation, what: str) -> None:
    """Raise `ArgumentError` when ``conv`` is done (nothing may be appended to it): appending to
    a finished conversation is a caller's mistake, not bad data."""
    if conv.done:
        raise ArgumentError(
            f"{conv.where} is done (finish_reason={conv.finish_reason!r}); cannot append {what}. "
            "Loop over MultiTurnBatch.active() to skip finished conversations"
        )


def _render_checked(conv: Conversation, messages: Sequence[dict], agp: bool, what: str) -> str:
    """The chat text of ``messages``; `InputError` (stage "template") unless the text so far
    is its prefix."""
    full = seen_render(conv, list(messages), agp) if conv.sampled else None
    full = conv.encoder.render(list(messages), agp, conv.tools) if full is None else full
    if not full.startswith(conv.text):
        at = next((i for i, (a, b) in enumerate(zip(full, conv.text)) if a != b), min(len(full), len(conv.text)))
        head = next((t for t in added_tokens(conv.encoder.tokenizer) if conv.text.endswith(t)
                     and at >= len(conv.text) - len(t) and not conv.awaiting_response), None)
        if head is not None:  # the reply's ids ended with the next turn's header (GLM-4.1V)
            raise InputError(
                f"the model's reply ended with {head!r}, which opens the next turn, but {what} renders "
                f"{full[len(conv.text) - len(head):][:40]!r} there", where=conv.where, row=conv.index,
                stage="template", expected=repr(head), found=repr(full[len(conv.text) - len(head):][:40]),
                fix=f"append the turn {head} opens (GLM: <|user|> a user turn, <|observation|> "
                "a tool turn), or re-encode the whole conversation with mmpipe.encode_row")
        raise InputError(
            f"with {what} appended, the chat template re-renders earlier text (first difference "
            f"at character {at}: {conv.text[at:at + 40]!r} became {full[at:at + 40]!r}), so the tokens so far "
            "are no longer a prefix of the conversation. Templates do this when they merge consecutive tool "
            "messages (pass them in one append_messages call) or rewrite earlier assistant turns (e.g. strip "
            "reasoning)", where=conv.where, row=conv.index, stage="template",
            expected=f"{conv.text[at:at + 40]!r} at character {at}", found=repr(full[at:at + 40]),
            fix="re-encode the whole conversation with mmpipe.encode_row instead",
        )
    return full


def _extend(conv: Conversation, ids, labels, grids, blocks, text, messages, *, awaiting, images_added, video=None):
    """Concatenate new tokens (and images, videos) onto the row; positions continue after the max.

    ids / labels: int64 [n] new tokens; grids: int [k, 3] new image grids; blocks: their pixel
    rows (the encoder's pixel format); video: None or (grids [v, 3], second_per_grid_ts [v],
    pixel blocks) of new videos. Returns the new `Conversation`."""
    from mmpipe.rope import get_rope_index

    row, fam = conv.row, conv.encoder.family
    mm = conv.encoder.token_types(ids)
    grids = np.asarray(grids, np.int64).reshape(-1, 3)
    vgrids, secs, vblocks = video if video is not None else (np.zeros((0, 3), np.int64), np.zeros(0, np.float32), [])
    pos, _ = get_rope_index(ids[None], mm[None], image_grid_thw=grids if len(grids) else None, family=fam,
                            video_grid_thw=vgrids if len(vgrids) else None,
                            second_per_grid_ts=secs if len(vgrids) else None)
    offset = int(row.position_ids.max()) + 1 if row.num_tokens else 0
    pos = pos[:, 0, :].numpy() + offset
    all_pos = np.concatenate([row.position_ids, pos], axis=1)
    L = row.num_tokens + len(ids)
    new = replace(
        row,
        input_ids=np.concatenate([row.input_ids, ids]),
        attention_mask=np.ones(L, np.int64),
        mm_token_type_ids=np.concatenate([row.mm_token_type_ids, mm]),
        position_ids=all_pos,
        rope_delta=int(all_pos.max()) + 1 - L if L else 0,
        labels=None if row.labels is None else np.concatenate([row.labels, labels]),
        image_grid_thw=np.concatenate([row.image_grid_thw, grids]) if len(grids) else row.image_grid_thw,
        video_grid_thw=np.concatenate([row.video_grid_thw, vgrids]).astype(np.int64) if len(vgrids) else row.video_grid_thw,
        second_per_grid_ts=(np.concatenate([row.second_per_grid_ts, secs]).astype(np.float32) if len(vgrids)
                            else row.second_per_grid_ts),
    )
    # pixels grow in place after the earlier turns' (`turn_buffer.grow`): concatenating copied
    # every earlier turn's pixels again on each append, O(turns^2) bytes over a loop
    if blocks:
        name = "pixel_values_u8" if conv.encoder.pixels == "uint8" else "pixel_values"
        setattr(new, name, grow(getattr(row, name), blocks))
    if vblocks:
        name = "pixel_values_videos_u8" if conv.encoder.pixels == "uint8" else "pixel_values_videos"
        setattr(new, name, grow(getattr(row, name), vblocks))
    return replace(conv, row=new, text=text, messages=tuple(messages), awaiting_response=awaiting,
                   images=conv.images + tuple(images_added))
