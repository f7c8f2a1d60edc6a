"""The turn-taking rollout (ReMA's ``multi_turn_generate_sequences``) on a `RolloutEngine`.

Each round asks every role once, in ``agent_roles`` order, with ONE batched
``engine.generate`` call per role over the rows still running; every prompt row carries the
question's images. ReMA's ending rules and finish reasons:

- a response of one of ``finish_roles`` (default: the first role) contains ``finish_flag``:
  the row ends at the end of that round, finish reason None;
- ``max_num_turns`` rounds played: ``"reach_max_turn"`` (ReMA marks it only when
  ``max_num_turns > 1``; with one round an unfinished row keeps None);
- ``prompt_length``: a role's prompt longer than it ends the row before that role answers,
  ``"completion_token_exceeded"`` (the first role's first prompt: an error, as in ReMA);
- ``stop_when_truncated``: a response cut by the token limit (engine finish reason
  ``"length"``) ends the row at once, ``"stop_when_truncated"``.

A row that ends inside a round gets, for each role still to answer in it, an empty
placeholder response (history ``{"content": "", "num_gen_tokens": 0, "stop_reason": <the
finish reason>}``), so every round in ``history`` has all roles, as ReMA's.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from mmpipe.errors import ArgumentError, InputError, is_integer
from mmpipe.records.generation import Generation, SamplingParams
from mmpipe.records.rema import Episode, text_item
from mmpipe.rema.batch import (COMPLETION_TOKEN_EXCEEDED, PAD_ROLE, REACH_MAX_TURN, STOP_WHEN_TRUNCATED, check_lengths,
                               collate_episodes)
from mmpipe.rema.encode import RoleCodec
from mmpipe.rema.views import (AskQuestion, QuestionWithInstruction, View, ViewContext, content_items,
                               question_items, rema_views)

__all__ = ["FINISH_FLAG", "MAX_TURNS", "Episode", "run_episodes", "rollout"]

FINISH_FLAG = None         # finish_reason: a finish role's response contained the finish flag (ReMA's None)
MAX_TURNS = REACH_MAX_TURN  # finish_reason: max_num_turns rounds were played without the flag


def _role_names(agent_roles) -> tuple:
    """``agent_roles`` as a tuple; a string or a non-sequence is refused (a string would be read as
    one role per character)."""
    if isinstance(agent_roles, (str, bytes, Mapping)) or not hasattr(agent_roles, "__iter__"):
        raise ArgumentError(f"agent_roles must be a list of role names in turn order, e.g. ['meta', 'reasoner'], "
                            f"found {agent_roles!r:.80}")
    return tuple(agent_roles)


def _check_setup(agent_roles, system_prompts, views, finish_roles, max_num_turns, finish_flag, codec, strip=(),
                 prompt_length=None):
    """Validate the rollout's arguments (`ArgumentError`); returns the roles as a tuple."""
    roles = _role_names(agent_roles)
    if not roles or len(set(roles)) != len(roles) or not all(isinstance(r, str) and r for r in roles):
        raise ArgumentError(f"agent_roles must be distinct non-empty strings, found {list(agent_roles)!r}")
    if PAD_ROLE in roles:
        raise ArgumentError(f"agent role {PAD_ROLE!r} is reserved for history padding entries; rename the role")
    if not isinstance(max_num_turns, int) or max_num_turns < 1:
        raise ArgumentError(f"max_num_turns must be an int >= 1, found {max_num_turns!r}")
    if prompt_length is not None and (not is_integer(prompt_length) or prompt_length < 1):
        raise ArgumentError(f"prompt_length must be a positive int (the most tokens a role's prompt may hold, image "
                            f"tokens expanded; ReMA's rollout prompt_length) or None for no limit, found "
                            f"{prompt_length!r}; pass e.g. prompt_length=1024")
    for name, mapping in (("system_prompts", system_prompts), ("views", views)):
        extra = set(mapping) - set(roles)
        if extra:
            raise ArgumentError(f"{name} names roles {sorted(extra)} that are not in agent_roles {list(roles)}")
    missing = [r for r in roles if r not in views]
    if missing:
        raise ArgumentError(f"views: no view for roles {missing}; give one per role (or views=None for ReMA's views)")
    for r, v in views.items():  # a misspelt source role would only show up once the rollout runs
        _check_view_roles(r, v, roles)
    for name, given in (("finish_roles", finish_roles), ("strip_finish_flag", strip)):
        bad = [r for r in given if r not in roles]
        if isinstance(given, str) or bad:
            raise ArgumentError(f"{name} {list(bad or [given])} are not in agent_roles {list(roles)}; "
                                "give a list of role names")
    if finish_flag is not None and not isinstance(finish_flag, str):
        raise ArgumentError(f"finish_flag must be a string (or None), found {type(finish_flag).__name__} {finish_flag!r:.40}")
    if finish_flag is not None and (not finish_flag or finish_flag in codec.special_strings):
        raise ArgumentError(
            f"finish_flag {finish_flag!r} must be non-empty plain text: special tokens are removed from responses "
            "(they would re-tokenize as control tokens), so the flag could never be seen"
        )
    return roles


def _check_view_roles(role: str, view, roles: tuple) -> None:
    """`ArgumentError` for ReMA's views taking replies from a role not in ``roles`` (it never answers)."""
    if isinstance(view, QuestionWithInstruction) and view.instruction_from not in (None, *roles):
        raise ArgumentError(f"views[{role!r}] needs the latest response of {view.instruction_from!r}, which has not "
                            f"answered yet and never will: it is not among agent_roles {list(roles)}; set "
                            "instruction_from to a role of agent_roles")
    names = view.reply_from if isinstance(view, AskQuestion) else None
    names = (names,) if isinstance(names, str) else tuple(names or ())
    if any(n not in roles for n in names):
        raise ArgumentError(f"views[{role!r}] takes replies from {list(names)}, which are not all in agent_roles "
                            f"{list(roles)}; name roles of agent_roles (a list of names, or one name)")


def _per_role(value, roles, name, kind):
    """``value`` for every role: a mapping role -> value (one entry per role), or one value for all."""
    if isinstance(value, Mapping):
        missing = [r for r in roles if r not in value]
        if missing:
            raise ArgumentError(f"{name}: no entry for roles {missing}; give one {kind} per role, or a single one for all")
        out = {r: value[r] for r in roles}
    else:
        out = {r: value for r in roles}
    if kind == "RolloutEngine":
        bad = [r for r, e in out.items() if not callable(getattr(e, "generate", None))]
        if bad:
            raise ArgumentError(f"{name} for roles {bad} is {type(out[bad[0]]).__name__}, not a RolloutEngine; pass an "
                                "engine with generate(rows, params) (e.g. mmpipe.rollout.TransformersEngine(model, "
                                "processor)), or a mapping role -> engine")
    return out


def run_episodes(questions: Sequence, engine, processor, *, agent_roles: Sequence[str],
                 max_num_turns: int, finish_flag: Optional[str],
                 system_prompts: Optional[Mapping[str, Optional[str]]] = None,
                 views: Optional[Mapping[str, View]] = None, params=SamplingParams(),
                 finish_roles: Optional[Sequence[str]] = None, prompt_length: Optional[int] = None,
                 stop_when_truncated: bool = False, strip_finish_flag: Sequence[str] = ()) -> list[Episode]:
    """The turn-taking loop: one `Episode` per question (see `rollout` for the arguments)."""
    codec = processor if isinstance(processor, RoleCodec) else RoleCodec(processor)
    agent_roles, system_prompts = _role_names(agent_roles), dict(system_prompts or {})
    views = dict(views) if views is not None else rema_views(agent_roles)
    finish_roles = tuple(finish_roles) if finish_roles is not None else tuple(agent_roles[:1])
    roles = _check_setup(agent_roles, system_prompts, views, finish_roles, max_num_turns, finish_flag, codec,
                         strip_finish_flag, prompt_length)
    engines = _per_role(engine, roles, "engine", "RolloutEngine")
    params = _per_role(params, roles, "params", "SamplingParams")
    for r, p in params.items():
        if getattr(p, "n", 1) != 1:
            raise ArgumentError(
                f"params for role {r!r}: n={p.n}; a turn-taking rollout takes one completion per question per turn. "
                "For groups (GRPO), repeat each question n times in `questions`"
            )
    if isinstance(questions, (str, bytes, Mapping)) or not hasattr(questions, "__len__") or not len(questions):
        raise ArgumentError(f"questions must be a non-empty list of questions (strings or {{'question': ..., "
                            f"'images': [...]}} dicts), found {questions!r:.80}")
    ctx = dict(roles=roles, views=views, system_prompts=system_prompts, codec=codec)
    episodes = _start_episodes(questions, codec)
    for turn in range(max_num_turns):
        playing = [e for e in episodes if not e.finished]
        if not playing:
            break
        flagged = set()
        for k, role in enumerate(roles):
            prompts, asked = [], []
            for e in (e for e in playing if not e.finished):
                msgs, row = _prompt_row(e, role, turn, **ctx)
                if prompt_length is not None and row.num_tokens > prompt_length:
                    _end_in_round(e, COMPLETION_TOKEN_EXCEEDED, k, turn, ctx, first=msgs,
                                  limit=(prompt_length, row.num_tokens))
                    continue
                e.messages[role] = msgs
                prompts.append(row)
                asked.append(e)
            if not asked:
                continue
            gens = engines[role].generate(prompts, params[role])
            flag = finish_flag if role in finish_roles else None
            flagged |= _record_responses(asked, gens, role, turn, codec, flag,
                                         finish_flag if role in strip_finish_flag else None)
            for e in asked:
                if stop_when_truncated and e.history[-1]["stop_reason"] == "length":
                    _end_in_round(e, STOP_WHEN_TRUNCATED, k + 1, turn, ctx)
        for e in playing:
            if e.index in flagged and not e.finished:
                e.finished, e.finish_reason = True, FINISH_FLAG
    for e in episodes:
        if not e.finished and max_num_turns > 1:  # ReMA: with one round an unfinished row keeps None
            e.finish_reason = REACH_MAX_TURN
        e.finished = True
        e.num_turns = len(e.history) // len(roles)
    return episodes


def _end_in_round(e: Episode, reason: str, k: int, turn: int, ctx: dict, first=None, limit=None) -> None:
    """End episode ``e`` inside round ``turn`` with ``reason``: roles ``k..`` of the round get an
    empty placeholder response (ReMA's dummy entry). ``first``: role k's view, already built."""
    roles = ctx["roles"]
    if k == 0 and reason == COMPLETION_TOKEN_EXCEEDED:
        if turn == 0:
            raise InputError(
                "the first role's first prompt is longer than prompt_length", where=f"row {e.index}, role {roles[0]!r}",
                row=e.index, stage="rollout", expected=f"at most prompt_length={limit[0]} tokens",
                found=f"{limit[1]} tokens (image tokens expanded)",
                fix="raise prompt_length or shorten the question / system prompt",
            )
        k = len(roles)  # the round had not started: nothing to fill (ReMA)
    e.finished, e.finish_reason = True, reason
    for j, role in enumerate(roles[k:]):
        msgs = first if (j == 0 and first is not None) else _prompt_row(e, role, turn, **ctx)[0]
        e.messages[role] = msgs + [{"role": "assistant", "content": []}]
        e.history.append({"role": role, "content": "", "num_gen_tokens": 0, "stop_reason": reason})


def _start_episodes(questions: Sequence, codec: RoleCodec) -> list[Episode]:
    """One empty `Episode` per question, its images encoded once."""
    episodes = []
    for i, q in enumerate(questions):
        items, images = question_items(q, i)
        episodes.append(Episode(index=i, question=items, images=images,
                                image_data=codec.encode_images(images, f"question {i}")))
    return episodes


def _prompt_row(e: Episode, role: str, turn: int, roles: tuple, views: Mapping[str, View],
                system_prompts: Mapping[str, Optional[str]], codec: RoleCodec):
    """(the role's messages with its view appended - a user message, the system prompt first
    on turn 0 -, the encoded prompt row `MultiModalInputs`); ``e`` is not changed."""
    where = f"row {e.index}, role {role!r}, turn {turn}"
    ctx = ViewContext(index=e.index, turn=turn, role=role, agent_roles=roles,
                      question=tuple(e.question), history=tuple(e.history))
    user = {"role": "user", "content": content_items(views[role](ctx), f"{where}: the view returned")}
    sys_prompt = system_prompts.get(role)
    if turn == 0:
        msgs = ([{"role": "system", "content": content_items(sys_prompt, f"system_prompts[{role!r}]")}]
                if sys_prompt is not None else [])
    else:
        msgs = list(e.messages[role])
    msgs.append(user)
    enc = codec.encode(msgs, image_data=e.image_data, add_generation_prompt=True, where=where)
    if turn and msgs[-2]["role"] == "assistant":
        # the role's last reply must stand verbatim in this prompt, as it was sampled: a template
        # that rewrites it (GLM-4.6V's '<think></think>') is refused now, not after the whole rollout
        codec.reply_span(msgs, len(msgs) - 2, enc.text, where)
    return msgs, enc.row


def _record_responses(active: list[Episode], gens: Sequence[Generation], role: str, turn: int,
                      codec: RoleCodec, finish_flag: Optional[str], strip: Optional[str] = None) -> set:
    """Add each generation's response to its episode (messages and ReMA history entries);
    returns the indices of episodes whose response holds ``finish_flag`` (None: the role is
    not checked). ``strip``: removed from the response text, trailing space then stripped (ReMA
    does this with the finish flag in the second role's responses)."""
    if len(gens) != len(active):
        raise InputError(
            f"the engine returned {len(gens)} generations for {len(active)} prompts", where=f"role {role!r}, turn {turn}",
            stage="rollout", expected="one Generation per prompt, in order", found=f"{len(gens)} generations",
            fix="make the engine's generate(prompts, params) return one Generation per prompt, in order",
        )
    flagged = set()
    for e, g in zip(active, gens):
        _check_generation(g, e.index, role, turn)
        if len(g.completions) != 1:
            raise InputError(
                "the generation does not hold exactly one completion",
                where=f"row {e.index}, role {role!r}, turn {turn}", row=e.index, stage="rollout",
                expected="exactly one completion (SamplingParams.n=1)", found=f"{len(g.completions)} completions",
                fix="generate one completion per prompt",
            )
        c = g.completions[0]
        text = codec.response_text(c.token_ids)
        if strip:
            text = text.replace(strip, "").rstrip()
        e.messages[role].append({"role": "assistant", "content": [text_item(text)] if text else []})
        e.history.append({"role": role, "content": text, "num_gen_tokens": len(c.token_ids),
                          "stop_reason": str(c.finish_reason)})
        if finish_flag is not None and finish_flag in text:
            flagged.add(e.index)
    return flagged


def _check_generation(g, row: int, role: str, turn: int) -> None:
    """One engine output: a `Generation` whose completions hold a list of token ids and a finish
    reason string (`InputError` naming the row, role and turn otherwise)."""
    comps = getattr(g, "completions", None)
    bad = None if isinstance(comps, (list, tuple)) else f"{type(g).__name__} {g!r:.60}"
    for c in comps if bad is None else ():
        ids = getattr(c, "token_ids", None)
        if not isinstance(ids, (list, tuple)) and not hasattr(ids, "tolist"):
            bad = f"token_ids {ids!r:.60}"
        elif not isinstance(getattr(c, "finish_reason", None), str):
            bad = f"finish_reason {getattr(c, 'finish_reason', None)!r:.40}"
    if bad is not None:
        raise InputError(
            "the engine's output is not a Generation of completions with token ids and a finish reason",
            where=f"row {row}, role {role!r}, turn {turn}", row=row, stage="rollout",
            expected="Generation(completions=[Completion(token_ids=[int...], finish_reason='stop'|'length'|...)])",
            found=bad, fix="make the engine's generate(prompts, params) return mmpipe Generation objects",
        )


def rollout(questions: Sequence, engine, processor, *, agent_roles: Sequence[str], max_num_turns: int,
            finish_flag: Optional[str], system_prompts: Optional[Mapping[str, Optional[str]]] = None,
            views: Optional[Mapping[str, View]] = None, params=SamplingParams(),
            finish_roles: Optional[Sequence[str]] = None, pad_to_multiple_of: Optional[int] = None,
            prompt_length: Optional[int] = None, max_length: Optional[int] = None, stop_when_truncated: bool = False,
            strip_finish_flag: Sequence[str] = ()):
    """ReMA's ``multi_turn_generate_sequences`` on a `RolloutEngine`, with images.

    Args:
        questions: B questions: strings, or ``{"question": str | content list, "images": [...]}``
            (a string marks each image's place with ``<image>``).
        engine: a `mmpipe.records.generation.RolloutEngine` (transformers, vLLM, scripted), or a
            mapping role -> engine (ReMA with separate parameters per role).
        processor: the Qwen-VL processor (or tokenizer for text LLMs) of the model(s).
        agent_roles: roles in turn order, e.g. ``["meta_thinking", "reasoning"]``.
        max_num_turns: rounds at most; a round asks every role once.
        finish_flag: text that ends a row at the end of the round in which a response of
            one of ``finish_roles`` contains it (None: rows always play every round).
        system_prompts: role -> system prompt (a missing role gets none: the template's default).
        views: role -> view, a callable ``ViewContext -> str | content list`` giving the user
            message the role receives before its turn (default `rema_views`). A role's view
            grows append-only: [system], user, assistant (its response), user, ...
        params: `SamplingParams` (n must be 1), or a mapping role -> params.
        finish_roles: roles whose responses are checked for the flag (default: the first role,
            the meta-thinker in ReMA).
        prompt_length: a positive int: a role prompt longer than this (tokens, image pads
            expanded) ends its row (``"completion_token_exceeded"``; ReMA's ``prompt_length``).
            None: no limit.
        max_length: the fixed padded length of every role's tensors (ReMA:
            ``prompt_length + response_length``); None: the longest, rounded up to
            ``pad_to_multiple_of``.
        stop_when_truncated: a response cut by the token limit ends its row (ReMA's option).
        strip_finish_flag: roles whose responses get ``finish_flag`` removed (ReMA: its
            second role, ``[agent_roles[1]]``).

    Every round makes ONE batched ``engine.generate`` call per role over the rows still
    running; each prompt row carries the question's images. Returns a `ReMABatch`.
    """
    check_lengths(max_length, pad_to_multiple_of)
    codec = RoleCodec(processor)
    episodes = run_episodes(questions, engine, codec, agent_roles=agent_roles, max_num_turns=max_num_turns,
                            finish_flag=finish_flag, system_prompts=system_prompts, views=views, params=params,
                            finish_roles=finish_roles, prompt_length=prompt_length,
                            stop_when_truncated=stop_when_truncated, strip_finish_flag=strip_finish_flag)
    return collate_episodes(episodes, codec, agent_roles=agent_roles, max_num_turns=max_num_turns,
                            pad_to_multiple_of=pad_to_multiple_of, max_length=max_length)
