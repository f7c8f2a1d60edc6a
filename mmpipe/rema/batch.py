"""Finished episodes -> `ReMABatch` (ReMA's tensor / non-tensor layout) and its Arrow form.

Per role ``{role}_input_ids / labels / step_ids / attention_mask / position_ids /
mm_token_type_ids`` in ReMA's form (shifted labels, see `mmpipe.records.rema`) padded to one
length shared by all roles (``max_length``: ReMA's fixed ``prompt_length + response_length``),
``{role}_num_gen_tokens / stop_reasons / turn_finished``; the questions' pixel data once;
non-tensor ``question, finish_reason, num_turns, response, history`` and
``{role}_conversation_history`` with ReMA's padding entries. One Arrow row per question
(`rema_arrow_schema`, ``schemas/rema_batch.json``).
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError, is_integer
from mmpipe.families import ModelFamily
from mmpipe.records.columns import IGNORE_INDEX, offsets
from mmpipe.records.rema import ROLE_TENSORS, Episode, ReMABatch, RoleEncoding, content_text, rema_arrow_schema
from mmpipe.rema.encode import RoleCodec

logger = logging.getLogger("mmpipe")

__all__ = ["PAD_ROLE", "PAD_CONTENT", "REACH_MAX_TURN", "COMPLETION_TOKEN_EXCEEDED", "STOP_WHEN_TRUNCATED", "FINISH_CODES",
           "check_lengths",
           "ROLE_TENSORS", "ReMABatch", "collate_episodes", "rema_arrow_schema",
           "history_size", "history_pad_entry", "conversation_pad_entry"]

PAD_ROLE = "padding"  # role of the explicit padding entries of padded histories
PAD_CONTENT = "<PAD>"
# ReMA's finish reasons and their codes in {role}_turn_finished (None: the finish flag ended it)
REACH_MAX_TURN = "reach_max_turn"
COMPLETION_TOKEN_EXCEEDED = "completion_token_exceeded"
STOP_WHEN_TRUNCATED = "stop_when_truncated"
FINISH_CODES = {None: 0, REACH_MAX_TURN: 1, COMPLETION_TOKEN_EXCEEDED: 2, STOP_WHEN_TRUNCATED: 3}


def _pad_entries(entries: list, size: int, pad: dict, what: str) -> list:
    """``entries`` + copies of ``pad`` up to ``size``; `ArgumentError` when they do not fit
    (episodes played more turns than the ``max_num_turns`` given to the batch)."""
    if len(entries) > size:
        raise ArgumentError(f"{what}: {len(entries)} entries do not fit the padded size {size}; max_num_turns must "
                            "be at least the number of rounds the episodes played")
    return list(entries) + [dict(pad) for _ in range(size - len(entries))]


def history_pad_entry() -> dict:
    """The explicit padding entry of ``history``: ReMA's ``{"role": "padding", "content": "<PAD>"}``."""
    return {"role": PAD_ROLE, "content": PAD_CONTENT}


def conversation_pad_entry() -> dict:
    """The explicit padding entry of ``{role}_conversation_history`` (ReMA's, as for ``history``)."""
    return {"role": PAD_ROLE, "content": PAD_CONTENT}


def history_size(num_roles: int, max_num_turns: int) -> int:
    """Padded length of ``history``: 2 * max_num_turns as in ReMA (two roles); with more
    roles, num_roles * max_num_turns so every response fits."""
    return max(2, num_roles) * max_num_turns


def check_lengths(max_length, pad_to_multiple_of) -> None:
    """`ArgumentError` unless ``max_length`` and ``pad_to_multiple_of`` are positive ints or None
    (checked before a rollout spends its engine calls)."""
    if max_length is not None and (not is_integer(max_length) or max_length < 1):
        raise ArgumentError(f"max_length must be a positive int (ReMA: prompt_length + response_length) or None, "
                            f"found {max_length!r}")
    if pad_to_multiple_of is not None and (not is_integer(pad_to_multiple_of) or pad_to_multiple_of < 1):
        raise ArgumentError(f"pad_to_multiple_of must be a positive int or None (no rounding), found "
                            f"{pad_to_multiple_of!r}; pass e.g. pad_to_multiple_of=8")


def collate_episodes(episodes: Sequence[Episode], processor, *, agent_roles: Sequence[str], max_num_turns: int,
                     pad_to_multiple_of: Optional[int] = None, max_length: Optional[int] = None) -> "ReMABatch":
    """Finished episodes -> a `ReMABatch` (every role encoded, padded to one common length).

    ``processor``: a Qwen-VL processor, tokenizer or `RoleCodec`. Tensors per role are int64
    [B, L] (``position_ids`` [B, 3, L] for vision families, [B, L] for text), L = ``max_length``
    (ReMA's fixed ``prompt_length + response_length``; longer sequences are cut there, as ReMA
    does, unless the cut would drop image tokens: `ArgumentError`) or the longest role
    sequence rounded up to ``pad_to_multiple_of``; pixels uint8 [N, 3*p*p] once per question.
    """
    import torch

    if not len(episodes):
        raise ArgumentError("collate_episodes got no episodes; pass the episodes of at least one question")
    check_lengths(max_length, pad_to_multiple_of)
    codec = processor if isinstance(processor, RoleCodec) else RoleCodec(processor)
    roles = tuple(agent_roles)
    fam = codec.fam
    encs, u8_blocks, grids = _encode_roles(episodes, codec, roles)
    views = {r: [x.rema_view() for x in encs[r]] for r in roles}
    L = max(len(v["input_ids"]) for r in roles for v in views[r])
    if pad_to_multiple_of:
        L = -(-L // int(pad_to_multiple_of)) * int(pad_to_multiple_of)
    L = L if max_length is None else int(max_length)
    tok = codec.tok
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    codes = torch.tensor([FINISH_CODES[e.finish_reason] for e in episodes], dtype=torch.int64)
    tensors = {}
    for role in roles:
        for name, arr in _pad_role(views[role], L, pad_id, fam, role).items():
            tensors[f"{role}_{name}"] = torch.from_numpy(arr)
        for name, arr in _turn_tensors(episodes, encs[role], role, max_num_turns).items():
            tensors[f"{role}_{name}"] = torch.from_numpy(arr)
        tensors[f"{role}_turn_finished"] = codes.clone()
    u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
    grid = np.concatenate(grids).reshape(-1, 3).astype(np.int64)
    return ReMABatch(
        agent_roles=roles, max_num_turns=max_num_turns, family=fam.name, batch=tensors,
        non_tensor_batch=_non_tensors(episodes, roles, max_num_turns),
        image_grid_thw=torch.from_numpy(grid), pixel_values_u8=torch.from_numpy(u8),
        image_offsets=torch.from_numpy(offsets([len(g) for g in grids])),
        patch_offsets=torch.from_numpy(offsets([int(g.prod(axis=1).sum()) if len(g) else 0 for g in grids])),
        spec=codec.enc.spec,
    )


def _encode_roles(episodes: Sequence[Episode], codec: RoleCodec, roles: tuple):
    """Encode every role's view of every episode (images once per question).

    Returns (role -> [RoleEncoding per episode], uint8 pixel blocks [N_b, 3*p*p] per episode,
    grids int64 [I_b, 3] per episode).
    """
    encs: dict[str, list[RoleEncoding]] = {r: [] for r in roles}
    u8_blocks, grids = [], []
    for e in episodes:
        if e.image_data is None:
            e.image_data = codec.encode_images(e.images, f"row {e.index}")
        u8_blocks.append(e.image_data[0])
        grids.append(e.image_data[1])
        for role in roles:
            where = f"row {e.index}, role {role!r}"
            msgs = e.messages.get(role)
            if not msgs:
                raise InputError(
                    "the episode has no messages for this role", where=where, row=e.index, stage="rollout",
                    column=f"{role}_conversation_history", expected=f"messages for role {role!r}",
                    found=f"roles {sorted(r for r, m in e.messages.items() if m)}",
                    fix="run the rollout with these agent_roles",
                )
            reasons = [h["stop_reason"] for h in e.history if h["role"] == role]
            encs[role].append(codec.encode(msgs, image_data=e.image_data, add_generation_prompt=False,
                                           finish_reasons=reasons, where=where))
    return encs, u8_blocks, grids


def _pad_role(views: Sequence[dict], L: int, pad_id: int, fam: ModelFamily, role: str) -> dict[str, np.ndarray]:
    """One role's ReMA sequences (`RoleEncoding.rema_view`) right-padded (or cut, as ReMA) to
    length L: int64 [B, L] input_ids (``pad_id``), labels / step_ids (-100), attention_mask,
    mm_token_type_ids, and position_ids as the model takes them, batch first: [B, 3, L]
    M-RoPE (pads 0), [B, L] 1-D (ReMA's ``clip(cumsum(mask) - 1, 0)``: pads repeat the last)."""
    B = len(views)
    ids = np.full((B, L), pad_id, np.int64)
    labels = np.full((B, L), IGNORE_INDEX, np.int64)
    steps = np.full((B, L), IGNORE_INDEX, np.int64)
    att = np.zeros((B, L), np.int64)
    mm = np.zeros((B, L), np.int64)
    pos = np.zeros((B, 3, L), np.int64)
    for b, v in enumerate(views):
        n = min(len(v["input_ids"]), L)
        if v["mm_token_type_ids"][n:].any():
            raise ArgumentError(f"row {b}, role {role!r}: {len(v['input_ids'])} tokens do not fit max_length={L} and "
                                "cutting them would drop image tokens; raise max_length (ReMA: prompt_length + "
                                "response_length)")
        ids[b, :n], labels[b, :n], steps[b, :n] = v["input_ids"][:n], v["labels"][:n], v["step_ids"][:n]
        att[b, :n], mm[b, :n], pos[b, :, :n] = 1, v["mm_token_type_ids"][:n], v["position_ids"][:, :n]
    _warn_cut_targets(views, L, role)
    if not fam.is_vision:
        pos[:] = np.clip(np.cumsum(att, axis=1) - 1, 0, None)[:, None, :]
    return {"input_ids": ids, "labels": labels, "step_ids": steps, "attention_mask": att,
            "position_ids": fam.model_positions(pos, axis=1), "mm_token_type_ids": mm}


def _warn_cut_targets(views: Sequence[dict], L: int, role: str) -> None:
    """Log (logger "mmpipe") the rows whose target tokens the cut at ``max_length`` drops, as
    ReMA prints the lengths it cuts: counted, and the rows that keep no target named (they
    train nothing, their loss mask is empty)."""
    cut, empty, lost = [], [], 0
    for b, v in enumerate(views):
        kept, total = int((v["labels"][:L] != IGNORE_INDEX).sum()), int((v["labels"] != IGNORE_INDEX).sum())
        if kept < total:
            cut.append(b)
            lost += total - kept
            if not kept:
                empty.append(b)
    if cut:
        logger.warning(
            "collate_episodes: max_length=%d cut %d target token(s) of role %r in %d of %d row(s) %s (kept: each "
            "sequence's start, as ReMA cuts); %d row(s) keep no target at all and train nothing: %s. Raise "
            "max_length (ReMA: prompt_length + response_length) to train them",
            L, lost, role, len(cut), len(views), cut[:20], len(empty), empty[:20])


def _turn_tensors(episodes: Sequence[Episode], encs: Sequence[RoleEncoding], role: str, T: int) -> dict[str, np.ndarray]:
    """ReMA's per-turn tensors of one role: num_gen_tokens int64 [B, T] (the turn's target
    tokens, counted on the encoding as ReMA's encode_conversation counts them) and
    stop_reasons bool [B, T] (the turn's stop reason is not "stop"); zeros past the last turn."""
    B = len(episodes)
    num = np.zeros((B, T), np.int64)
    stop = np.zeros((B, T), bool)
    for b, (e, x) in enumerate(zip(episodes, encs)):
        own = [h for h in e.history if h["role"] == role]
        for k, h in enumerate(own[:T]):
            num[b, k] = int((x.step_ids == k).sum())
            stop[b, k] = h["stop_reason"] != "stop"
    return {"num_gen_tokens": num, "stop_reasons": stop}


def _non_tensors(episodes: Sequence[Episode], roles: tuple, max_num_turns: int) -> dict[str, list]:
    """ReMA's non-tensor columns: question, finish_reason, num_turns, response, padded
    history and each role's padded conversation history (one entry per episode)."""
    h_size, c_size = history_size(len(roles), max_num_turns), 2 * max_num_turns
    non_tensors: dict[str, list] = {
        "question": [e.question_text for e in episodes],
        "finish_reason": [e.finish_reason for e in episodes],
        "num_turns": [e.num_turns for e in episodes],
        "response": [e.history[-1]["content"] if e.history else "" for e in episodes],  # ReMA: h[-1]["content"]
        "history": [_pad_entries([dict(h) for h in e.history], h_size, history_pad_entry(), f"row {e.index}, history")
                    for e in episodes],
    }
    for role in roles:
        non_tensors[f"{role}_conversation_history"] = [
            _pad_entries([_rema_message(m) for m in e.conversation_history(role)], c_size, conversation_pad_entry(),
                         f"row {e.index}, {role}_conversation_history")
            for e in episodes
        ]
    return non_tensors


def _rema_message(m: dict) -> dict:
    """A message as ReMA stores it: string content, or the content list where it shows images."""
    items = m["content"]
    return {"role": m["role"], "content": items if any(it["type"] == "image" for it in items) else content_text(items)}
