"""The `Encoder`'s option checks (accepted policies, values refused before any work, a kind's
refusals: `refuse_options`) and its truncation policies (`truncate_row`, `RowDropped`)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mmpipe.error_text import keep_fields
from mmpipe.errors import ArgumentError, TruncationError
from mmpipe.records.columns import ENCODE_PIXEL_FORMATS, IGNORE_INDEX

TRUNCATION_POLICIES = ("raise", "drop", "truncate_text")
ERROR_POLICIES = ("raise", "skip")


def check_choice(name: str, value, accepted: tuple) -> None:
    if value not in accepted:
        raise ArgumentError(f"{name} must be one of {accepted}, got {value!r}")


class RowDropped(Exception):
    """Raised inside the encoder when a row is dropped under ``truncation="drop"`` (the map
    protocol's drop signal, `mmpipe.encoding.mapping`). ``reason`` is the counted cause
    (``"too_long"``), the message the detail. Pickles with both (a ``num_proc`` map worker, a
    spawn DataLoader worker); ``RowDropped(text)`` of a DataLoader worker's re-raise takes the reason
    back from the text's fields note (`mmpipe.error_text.keep_fields`)."""

    def __init__(self, reason: Optional[str], detail: Optional[str] = None):
        if detail is None:  # one argument: the message only
            reason, detail = None, reason
        super().__init__(detail)
        keep_fields(self, detail, reason=reason)

    def __reduce__(self):
        return (type(self), (self.reason, *self.args), dict(vars(self)))


def refusal(enc, template: str, what: str, why: str) -> ArgumentError:
    """A kind's refusal of an option value: ``template`` (its ``REFUSAL``) filled with ``what``
    (``"min_pixels="``, ``"pixels='none'"``), ``why`` (what to do instead), ``cls`` (the processor
    class) and ``fam`` (the family name)."""
    return ArgumentError(template.format(what=what, why=why, cls=enc.processor_class, fam=enc.family.name))


def refuse_options(enc, given: dict, refused: dict, template: str) -> None:
    """The first of the ``given`` options (`mmpipe.encoding.encoder.KIND_OPTIONS`, in that order)
    that the kind refuses (``refused``: option -> what to do instead), as a `refusal`."""
    for name in given:
        if name in refused:
            raise refusal(enc, template, f"{name}=", refused[name])


def kind_options(enc, given: dict, refused: Optional[dict] = None) -> None:
    """What every kind checks the same way, from its declarations (``enc.family.media``): the
    ``given`` options it refuses (``ENCODE_REFUSED``, or ``refused``), ``pixels`` (one of ``ENCODE_PIXELS``, the
    first the default; set on ``enc``) and ``enc.truncation`` (one of ``TRUNCATIONS``), each
    refusal said in the kind's ``REFUSAL`` with the values it takes and why (``CHOICE_NOTES``)."""
    media = enc.family.media
    refuse_options(enc, given, media.ENCODE_REFUSED if refused is None else refused, media.REFUSAL)
    enc.pixels = given.get("pixels", media.ENCODE_PIXELS[0])
    check_choice("pixels", enc.pixels, ENCODE_PIXEL_FORMATS)
    for name, accepted in (("pixels", media.ENCODE_PIXELS), ("truncation", media.TRUNCATIONS)):
        if getattr(enc, name) not in accepted:
            note = media.CHOICE_NOTES.get(name)
            raise refusal(enc, media.REFUSAL, f"{name}={getattr(enc, name)!r}",
                          f"use {_either(accepted)}" + (f" ({note})" if note else ""))


def _either(values: tuple) -> str:
    """``"'a', 'b' or 'c'"``."""
    words = [repr(v) for v in values]
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def check_options(o: dict) -> None:
    """Refuse option values that silently do the wrong thing (max_length <= 0 cuts every token), before any work."""
    for name, low, kinds in (("max_length", 1, (int, np.integer)), ("threads", 0, (int, np.integer)),
                             ("min_pixels", 0, (int, float, np.number)), ("max_pixels", 1, (int, float, np.number))):
        if o[name] is not None and (isinstance(o[name], bool) or not isinstance(o[name], kinds) or o[name] < low):
            raise ArgumentError(f"{name} must be a number >= {low} (an int for counts) or None, got {o[name]!r}")
    for name in ("images_column", "tools_column"):
        if not isinstance(o[name], str) or not o[name]:
            raise ArgumentError(f"{name} must be a column name (a non-empty str), got {o[name]!r}")


# apply_chat_template's own arguments: the Encoder passes them itself -> what to pass instead
_CALL_ARGUMENTS = {"add_generation_prompt": "the Encoder's add_generation_prompt= option",
                   "conversation": "the row's messages column", "tokenize": None}


def check_template_kwargs(kwargs: dict) -> None:
    """`ArgumentError` for a ``chat_template_kwargs`` key that is one of ``apply_chat_template``'s
    own arguments, which the encoder sets itself (each row would fail with a TypeError otherwise)."""
    for key in kwargs:
        if key in _CALL_ARGUMENTS:
            instead = _CALL_ARGUMENTS[key]
            raise ArgumentError(f"chat_template_kwargs[{key!r}] is apply_chat_template's own argument, which the "
                                "encoder sets itself; " + (f"use {instead}" if instead else "leave it out")
                                + " (chat_template_kwargs are the template's keywords: enable_thinking, "
                                "add_vision_id, ...)")


def truncate_row(enc, ids: np.ndarray, labels, mm: np.ndarray, where: str, tail=None) -> tuple:
    """``enc.truncation`` applied to a row over ``enc.max_length``: ``"raise"`` (`TruncationError`),
    ``"drop"`` (`RowDropped`), or ``"truncate_text"``: cut ids int64 [L] / labels / mm to the cap
    unless that reaches into a vision block - its pads and the ``<|vision_end|>`` token(s) after
    them (Qwen3-VL videos close each frame group and then the video: two) - then raise. A row
    whose replies (labelled tokens) all lie past the cut would keep 0 trained tokens: raise too
    (`TruncationError`, column ``labels``; recorded and counted under ``on_error="skip"``),
    never kept silently. ``tail``: called only when a row is cut, the count of its last tokens
    that must stay (`generation_tail`: a prompt row's end of turn and generation prompt, which the
    model answers after); the text before them is cut instead, so a cut prompt still ends as the
    template ends it.
    Returns ``(ids, labels, mm)``."""
    L, cap = len(ids), enc.max_length
    if cap is None or L <= cap:
        return ids, labels, mm
    detail = (f"{where}: {L} tokens (text + {int((mm == 1).sum())} image tokens + {int((mm == 2).sum())} video "
              f"tokens) exceed max_length={cap}") if (mm == 2).any() else (
              f"{where}: {L} tokens (text + {int((mm > 0).sum())} image tokens) exceed max_length={cap}")
    if enc.truncation == "raise":
        raise TruncationError(detail, where="", column="input_ids", expected=f"at most {cap} tokens",
                              found=f"{L} tokens",
                              fix="raise max_length, lower max_pixels, or pass truncation='drop' / 'truncate_text'")
    if enc.truncation == "drop":
        raise RowDropped("too_long", detail)
    kept = 0 if tail is None else tail()  # the row's last tokens that stay
    if kept >= cap:
        raise TruncationError(detail + f"; its last {kept} tokens (the end of its last turn and the generation "
                              "prompt) alone fill max_length", where="", column="input_ids",
                              expected=f"a kept tail under {cap} tokens", found=f"{kept} tokens",
                              fix="use truncation='drop' or a larger max_length")
    cut = cap - kept  # the text is cut here; the kept tail follows
    vis = np.flatnonzero(mm[:L - kept] > 0)
    if len(vis):
        end = int(vis[-1]) + 2  # the block's pads, then <|vision_end|>
        if mm[vis[-1]] == 2 and end < L and ids[end] == enc.vision_end_id:
            end += 1  # a Qwen3-VL video: the video's own <|vision_end|> after its last frame group's
        if cut < end:
            kind = "a video" if mm[vis[-1]] == 2 else "an image"
            raise TruncationError(detail + f"; truncating text only would cut into {kind} (its tokens end at {end})",
                                  where="", column="input_ids", expected=f"a cut at or after token {end}",
                                  found=f"a cut at token {cut}", fix="use truncation='drop' or a larger max_length")
    if labels is not None:
        trained = np.flatnonzero(labels != IGNORE_INDEX)
        if len(trained) and trained[0] >= cut:  # the replies all lie past the cut: nothing left to train on
            raise TruncationError(detail + f"; truncating text would cut every trained token (the replies start "
                                  f"at token {int(trained[0])}): the row would train on nothing", where="",
                                  column="labels", expected=f"a reply starting before token {cap}",
                                  found=f"the first reply at token {int(trained[0])}",
                                  fix="use truncation='drop', a larger max_length or a shorter prompt")
    keep = np.r_[0:cut, L - kept:L]
    return ids[keep], (labels[keep] if labels is not None else None), mm[keep]


def generation_tail(enc, messages: list, tools, where: str, ids: np.ndarray) -> int:
    """The count of ``ids``' last tokens that a cut must keep: 0 for a row rendered without a
    generation prompt; else the tokens the generation prompt adds (the template's render with
    and without it) and the end the template writes for the last turn before them (`_turn_end`:
    ``<|im_end|>\n``, or GLM-4.6V's ``/nothink`` with ``enable_thinking=False``; else the family's
    end of turn), so a cut prompt row still asks the model for its answer as the template asks it.
    A row whose ids do not end with those tokens (its render is not the plain render's prefix) is
    a `TruncationError`: it cannot be cut safely."""
    if not enc.generation_prompt(messages):
        return 0
    from mmpipe.encoding.tokenize import tokenize_text

    texts = [enc.render(messages, agp, tools) for agp in (False, True)]
    (ids0, offsets), ids1 = tokenize_text(enc.tokenizer, texts[0], True), tokenize_text(enc.tokenizer, texts[1], False)[0]
    plain = [ids0, ids1]
    n, tail = len(plain[0]), len(plain[1]) - len(plain[0])
    end = _turn_end(enc, messages, tools, texts[0])
    if end:  # the tokens from the first one reaching into the last turn's end
        tail += n - int(np.searchsorted(offsets[:, 1], len(texts[0]) - len(end), side="right"))
    else:
        stop = enc.family.stop_token
        stop_id = enc.tokenizer.convert_tokens_to_ids(stop) if stop else None
        back = [i for i in range(max(n - 3, 0), n) if stop_id is not None and plain[0][i] == stop_id]
        tail += n - back[-1] if back else 0
    if tail <= 0 or not np.array_equal(plain[1][:n], plain[0]) or not np.array_equal(ids[-tail:], plain[1][-tail:]):
        raise TruncationError(f"{where}: truncation='truncate_text' would cut this prompt row's generation prompt, and "
                              "its end could not be located in its tokens", where="", column="input_ids",
                              expected="ids ending with the template's generation prompt",
                              found=f"a tail of {tail} token(s)",
                              fix="use truncation='drop' or a larger max_length")
    return tail


_END_PROBE = "\x02mmpipe-turn-end\x03"


def _turn_end(enc, messages: list, tools, text: str) -> str:
    """What the template writes after the last message's text (its end of turn, and any text it
    adds to the turn: ``"/nothink"``), read from a render with a probe after that text; "" where
    the message ends in no text part, the probe is not rendered, or ``text`` does not end the same."""
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        probed = {**last, "content": content + _END_PROBE}
    else:
        parts = list(content or ())
        at = [i for i, p in enumerate(parts) if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if not at or at[-1] != len(parts) - 1:
            return ""
        parts[-1] = {**parts[-1], "text": parts[-1]["text"] + _END_PROBE}
        probed = {**last, "content": parts}
    try:
        render = enc.render([*messages[:-1], probed], False, tools)
    except Exception:  # noqa: BLE001 - the template refuses the probe: the family's end of turn
        return ""
    if render.count(_END_PROBE) != 1:
        return ""
    end = render[render.index(_END_PROBE) + len(_END_PROBE):]
    return end if end and text.endswith(end) else ""
