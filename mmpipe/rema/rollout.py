"""The turn-taking rollout (ReMA's ``multi_turn_generate_sequences``) on a `RolloutEngine`.

Each round asks every role once, in ``agent_roles`` order, with ONE batched
``engine.generate`` call per role over the rows still running; every prompt row carries the
question's images. A row ends at the end of the round in which a response of one of
``finish_roles`` (default: the first role) contains ``finish_flag`` (``finish_reason ==
"finish_flag"``), or after ``max_num_turns`` rounds (``"max_turns"``).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.generation import Generation, SamplingParams
from mmpipe.records.rema import Episode, text_item
from mmpipe.rema.batch import PAD_ROLE, collate_episodes
from mmpipe.rema.encode import RoleCodec
from mmpipe.rema.views import View, ViewContext, content_items, question_items, rema_views

__all__ = ["FINISH_FLAG", "MAX_TURNS", "Episode", "run_episodes", "rollout"]

FINISH_FLAG = "finish_flag"  # finish_reason: a finish role's response contained the finish flag
MAX_TURNS = "max_turns"      # finish_reason: max_num_turns rounds were played without the flag


def _check_setup(agent_roles, system_prompts, views, finish_roles, max_num_turns, finish_flag, codec):
    """Validate the rollout's arguments (`ArgumentError`); returns the roles as a tuple."""
    roles = tuple(agent_roles)
    if not roles or len(set(roles)) != len(roles) or not all(isinstance(r, str) and r for r in roles):
        raise ArgumentError(f"agent_roles must be distinct non-empty strings, found {list(agent_roles)!r}")
    if PAD_ROLE in roles:
        raise ArgumentError(f"agent role {PAD_ROLE!r} is reserved for history padding entries; rename the role")
    if not isinstance(max_num_turns, int) or max_num_turns < 1:
        raise ArgumentError(f"max_num_turns must be an int >= 1, found {max_num_turns!r}")
    for name, mapping in (("system_prompts", system_prompts), ("views", views)):
        extra = set(mapping) - set(roles)
        if extra:
            raise ArgumentError(f"{name} names roles {sorted(extra)} that are not in agent_roles {list(roles)}")
    missing = [r for r in roles if r not in views]
    if missing:
        raise ArgumentError(f"views: no view for roles {missing}; give one per role (or views=None for ReMA's views)")
    bad = [r for r in finish_roles if r not in roles]
    if bad:
        raise ArgumentError(f"finish_roles {bad} are not in agent_roles {list(roles)}")
    if finish_flag is not None and (not finish_flag or finish_flag in codec.special_strings):
        raise ArgumentError(
            f"finish_flag {finish_flag!r} must be non-empty plain text: special tokens are removed from responses "
            "(they would re-tokenize as control tokens), so the flag could never be seen"
        )
    return roles


def _per_role(value, roles, name, kind):
    """``value`` for every role: a mapping role -> value (one entry per role), or one value for all."""
    if isinstance(value, Mapping):
        missing = [r for r in roles if r not in value]
        if missing:
            raise ArgumentError(f"{name}: no entry for roles {missing}; give one {kind} per role, or a single one for all")
        return {r: value[r] for r in roles}
    return {r: value for r in roles}


def run_episodes(questions: Sequence, engine, processor, *, agent_roles: Sequence[str],
                 max_num_turns: int, finish_flag: Optional[str],
                 system_prompts: Optional[Mapping[str, Optional[str]]] = None,
                 views: Optional[Mapping[str, View]] = None, params=SamplingParams(),
                 finish_roles: Optional[Sequence[str]] = None) -> list[Episode]:
    """The turn-taking loop: one `Episode` per question (see `rollout` for the arguments)."""
    codec = processor if isinstance(processor, RoleCodec) else RoleCodec(processor)
    system_prompts = dict(system_prompts or {})
    views = dict(views) if views is not None else rema_views(agent_roles)
    finish_roles = tuple(finish_roles) if finish_roles is not None else tuple(agent_roles[:1])
    roles = _check_setup(agent_roles, system_prompts, views, finish_roles, max_num_turns, finish_flag, codec)
    engines = _per_role(engine, roles, "engine", "RolloutEngine")
    params = _per_role(params, roles, "params", "SamplingParams")
    for r, p in params.items():
        if getattr(p, "n", 1) != 1:
            raise ArgumentError(
                f"params for role {r!r}: n={p.n}; a turn-taking rollout takes one completion per question per turn. "
                "For groups (GRPO), repeat each question n times in `questions`"
            )
    if not len(questions):
        raise ArgumentError("questions is empty; pass at least one question")
    episodes = _start_episodes(questions, codec)
    for turn in range(max_num_turns):
        active = [e for e in episodes if e.finish_reason is None]
        if not active:
            break
        flagged = set()
        for role in roles:
            prompts = [_prompt_row(e, role, turn, roles, views[role], system_prompts.get(role), codec) for e in active]
            gens = engines[role].generate(prompts, params[role])
            flagged |= _record_responses(active, gens, role, turn, codec,
                                         finish_flag if role in finish_roles else None)
        for e in active:
            e.num_turns = turn + 1
            if e.index in flagged:
                e.finish_reason = FINISH_FLAG
    for e in episodes:
        if e.finish_reason is None:
            e.finish_reason = MAX_TURNS
    return episodes


def _start_episodes(questions: Sequence, codec: RoleCodec) -> list[Episode]:
    """One empty `Episode` per question, its images encoded once."""
    episodes = []
    for i, q in enumerate(questions):
        items, images = question_items(q, i)
        episodes.append(Episode(index=i, question=items, images=images,
                                image_data=codec.encode_images(images, f"question {i}")))
    return episodes


def _prompt_row(e: Episode, role: str, turn: int, roles: tuple, view: View, sys_prompt: Optional[str],
                codec: RoleCodec):
    """Append the role's view (a user message; the system prompt first on turn 0) to the
    role's messages in ``e`` and return the encoded prompt row (`MultiModalInputs`)."""
    where = f"row {e.index}, role {role!r}, turn {turn}"
    ctx = ViewContext(index=e.index, turn=turn, role=role, agent_roles=roles,
                      question=tuple(e.question), history=tuple(e.history))
    user = {"role": "user", "content": content_items(view(ctx), f"{where}: the view returned")}
    if turn == 0:
        msgs = ([{"role": "system", "content": content_items(sys_prompt, f"system_prompts[{role!r}]")}]
                if sys_prompt is not None else [])
    else:
        msgs = list(e.messages[role])
    msgs.append(user)
    e.messages[role] = msgs
    return codec.encode(msgs, image_data=e.image_data, add_generation_prompt=True, where=where).row


def _record_responses(active: list[Episode], gens: Sequence[Generation], role: str, turn: int,
                      codec: RoleCodec, finish_flag: Optional[str]) -> set:
    """Add each generation's response to its episode (messages and history); returns the
    indices of episodes whose response holds ``finish_flag`` (None: the role is not checked)."""
    if len(gens) != len(active):
        raise InputError(
            f"the engine returned {len(gens)} generations for {len(active)} prompts", where=f"role {role!r}, turn {turn}",
            stage="rollout", expected="one Generation per prompt, in order", found=f"{len(gens)} generations",
            fix="make the engine's generate(prompts, params) return one Generation per prompt, in order",
        )
    flagged = set()
    for e, g in zip(active, gens):
        if len(g.completions) != 1:
            raise InputError(
                f"{len(g.completions)} completions; expected exactly one (SamplingParams.n=1)",
                where=f"row {e.index}, role {role!r}, turn {turn}", row=e.index, stage="rollout",
                fix="generate one completion per prompt",
            )
        c = g.completions[0]
        text = codec.response_text(c.token_ids)
        e.messages[role].append({"role": "assistant", "content": [text_item(text)] if text else []})
        e.history.append({"role": role, "content": text, "turn": turn,
                          "finish_reason": str(c.finish_reason), "num_tokens": len(c.token_ids)})
        if finish_flag is not None and finish_flag in text:
            flagged.add(e.index)
    return flagged


def rollout(questions: Sequence, engine, processor, *, agent_roles: Sequence[str], max_num_turns: int,
            finish_flag: Optional[str], system_prompts: Optional[Mapping[str, Optional[str]]] = None,
            views: Optional[Mapping[str, View]] = None, params=SamplingParams(),
            finish_roles: Optional[Sequence[str]] = None, pad_to_multiple_of: Optional[int] = None):
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

    Every round makes ONE batched ``engine.generate`` call per role over the rows still
    running; each prompt row carries the question's images. Returns a `ReMABatch`.
    """
    codec = RoleCodec(processor)
    episodes = run_episodes(questions, engine, codec, agent_roles=agent_roles, max_num_turns=max_num_turns,
                            finish_flag=finish_flag, system_prompts=system_prompts, views=views, params=params,
                            finish_roles=finish_roles)
    return collate_episodes(episodes, codec, agent_roles=agent_roles, max_num_turns=max_num_turns,
                            pad_to_multiple_of=pad_to_multiple_of)
