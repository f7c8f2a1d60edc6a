"""Finished episodes -> `ReMABatch` (ReMA's tensor / non-tensor layout) and its Arrow form.

Per role ``{role}_input_ids / labels / step_ids / attention_mask / position_ids /
mm_token_type_ids`` padded to one length shared by all roles; the questions' pixel data once;
non-tensor ``question, finish_reason, num_turns, response, history`` and
``{role}_conversation_history`` with explicit padding entries. One Arrow row per question
(`rema_arrow_schema`, ``schemas/rema_batch.json``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import ModelFamily
from mmpipe.records.columns import IGNORE_INDEX, offsets
from mmpipe.records.rema import ROLE_TENSORS, Episode, ReMABatch, RoleEncoding, rema_arrow_schema, text_item
from mmpipe.rema.encode import RoleCodec

__all__ = ["PAD_ROLE", "PAD_CONTENT", "ROLE_TENSORS", "ReMABatch", "collate_episodes", "rema_arrow_schema",
           "history_size", "history_pad_entry", "conversation_pad_entry"]

PAD_ROLE = "padding"  # role of the explicit padding entries of padded histories
PAD_CONTENT = "<PAD>"


def _pad_entries(entries: list, size: int, pad: dict, what: str) -> list:
    """``entries`` + copies of ``pad`` up to ``size``; `ArgumentError` when they do not fit
    (episodes played more turns than the ``max_num_turns`` given to the batch)."""
    if len(entries) > size:
        raise ArgumentError(f"{what}: {len(entries)} entries do not fit the padded size {size}; max_num_turns must "
                            "be at least the number of rounds the episodes played")
    return list(entries) + [dict(pad) for _ in range(size - len(entries))]


def history_pad_entry() -> dict:
    """The explicit padding entry of ``history`` (ReMA's ``{"role": "padding", "content": "<PAD>"}``
    plus the other entry keys, so every entry has the same fields)."""
    return {"role": PAD_ROLE, "content": PAD_CONTENT, "turn": -1, "finish_reason": "", "num_tokens": 0}


def conversation_pad_entry() -> dict:
    """The explicit padding entry of ``{role}_conversation_history`` (a message, content list form)."""
    return {"role": PAD_ROLE, "content": [text_item(PAD_CONTENT)]}


def history_size(num_roles: int, max_num_turns: int) -> int:
    """Padded length of ``history``: 2 * max_num_turns as in ReMA (two roles); with more
    roles, num_roles * max_num_turns so every response fits."""
    return max(2, num_roles) * max_num_turns


def collate_episodes(episodes: Sequence[Episode], processor, *, agent_roles: Sequence[str], max_num_turns: int,
                     pad_to_multiple_of: Optional[int] = None) -> "ReMABatch":
    """Finished episodes -> a `ReMABatch` (every role encoded, padded to one common length).

    ``processor``: a Qwen-VL processor, tokenizer or `RoleCodec`. Tensors per role are int64
    [B, L] (``position_ids`` [B, 3, L] for vision families, [B, L] for text), L the longest
    role encoding rounded up to ``pad_to_multiple_of``; pixels uint8 [N, 3*p*p] once per question.
    """
    import torch

    if not len(episodes):
        raise ArgumentError("collate_episodes got no episodes; pass the episodes of at least one question")
    codec = processor if isinstance(processor, RoleCodec) else RoleCodec(processor)
    roles = tuple(agent_roles)
    fam = codec.fam
    encs, u8_blocks, grids = _encode_roles(episodes, codec, roles)
    L = max(x.row.num_tokens for r in roles for x in encs[r])
    if pad_to_multiple_of:
        L = -(-L // pad_to_multiple_of) * pad_to_multiple_of
    tok = codec.tok
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    tensors = {}
    for role in roles:
        for name, arr in _pad_role(encs[role], L, pad_id, fam).items():
            tensors[f"{role}_{name}"] = torch.from_numpy(arr)
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
                    column=f"{role}_conversation_history", fix="run the rollout with these agent_roles",
                )
            reasons = [h["finish_reason"] for h in e.history if h["role"] == role]
            encs[role].append(codec.encode(msgs, image_data=e.image_data, add_generation_prompt=False,
                                           finish_reasons=reasons, where=where))
    return encs, u8_blocks, grids


def _pad_role(encs: Sequence[RoleEncoding], L: int, pad_id: int, fam: ModelFamily) -> dict[str, np.ndarray]:
    """One role's encodings right-padded to length L: int64 [B, L] input_ids (``pad_id``),
    labels / step_ids (-100), attention_mask, mm_token_type_ids, and position_ids as the model
    takes them, batch first (`ModelFamily.model_positions`): [B, 3, L] M-RoPE, [B, L] 1-D."""
    B = len(encs)
    ids = np.full((B, L), pad_id, np.int64)
    labels = np.full((B, L), IGNORE_INDEX, np.int64)
    steps = np.full((B, L), IGNORE_INDEX, np.int64)
    att = np.zeros((B, L), np.int64)
    mm = np.zeros((B, L), np.int64)
    pos = np.zeros((B, 3, L), np.int64)
    for b, x in enumerate(encs):
        n = x.row.num_tokens
        ids[b, :n], labels[b, :n], steps[b, :n] = x.row.input_ids, x.row.labels, x.step_ids
        att[b, :n], mm[b, :n], pos[b, :, :n] = 1, x.row.mm_token_type_ids, x.row.position_ids
    return {"input_ids": ids, "labels": labels, "step_ids": steps, "attention_mask": att,
            "position_ids": fam.model_positions(pos, axis=1), "mm_token_type_ids": mm}


def _non_tensors(episodes: Sequence[Episode], roles: tuple, max_num_turns: int) -> dict[str, list]:
    """ReMA's non-tensor columns: question, finish_reason, num_turns, response, padded
    history and each role's padded conversation history (one entry per episode)."""
    h_size, c_size = history_size(len(roles), max_num_turns), 2 * max_num_turns
    non_tensors: dict[str, list] = {
        "question": [e.question_text for e in episodes],
        "finish_reason": [e.finish_reason for e in episodes],
        "num_turns": [e.num_turns for e in episodes],
        "response": [e.history[-1]["content"] if e.history else "" for e in episodes],
        "history": [_pad_entries([dict(h) for h in e.history], h_size, history_pad_entry(), f"row {e.index}, history")
                    for e in episodes],
    }
    for role in roles:
        non_tensors[f"{role}_conversation_history"] = [
            _pad_entries(e.conversation_history(role), c_size, conversation_pad_entry(),
                         f"row {e.index}, {role}_conversation_history")
            for e in episodes
        ]
    return non_tensors
