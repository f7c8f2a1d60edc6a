"""Finished episodes -> `ReMABatch` (ReMA's tensor / non-tensor layout) and its Arrow form.

Per role ``{role}_input_ids / labels / step_ids / attention_mask / position_ids /
mm_token_type_ids`` padded to one length shared by all roles; the questions' pixel data once;
non-tensor ``question, finish_reason, num_turns, response, history`` and
``{role}_conversation_history`` with explicit padding entries. One Arrow row per question
(`rema_arrow_schema`, ``schemas/rema_batch.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..families import get_family
from ..images import VisionSpec, u8_to_pixel_values
from ..records import IGNORE_INDEX, _u8_block, _u8_bytes
from .encode import RoleEncoding, _Codec
from .rollout import Episode
from .views import _text

__all__ = ["PAD_ROLE", "PAD_CONTENT", "ROLE_TENSORS", "ReMABatch", "collate_episodes", "rema_arrow_schema",
           "history_size", "history_pad_entry", "conversation_pad_entry"]

PAD_ROLE = "padding"  # role of the explicit padding entries of padded histories
PAD_CONTENT = "<PAD>"


def _pad_entries(entries: list, size: int, pad: dict, what: str) -> list:
    if len(entries) > size:
        raise ValueError(f"{what}: {len(entries)} entries do not fit the padded size {size}")
    return list(entries) + [dict(pad) for _ in range(size - len(entries))]


def history_pad_entry() -> dict:
    """The explicit padding entry of ``history`` (ReMA's ``{"role": "padding", "content": "<PAD>"}``
    plus the other entry keys, so every entry has the same fields)."""
    return {"role": PAD_ROLE, "content": PAD_CONTENT, "turn": -1, "finish_reason": "", "num_tokens": 0}


def conversation_pad_entry() -> dict:
    """The explicit padding entry of ``{role}_conversation_history`` (a message, content list form)."""
    return {"role": PAD_ROLE, "content": [_text(PAD_CONTENT)]}


def history_size(num_roles: int, max_num_turns: int) -> int:
    """Padded length of ``history``: 2 * max_num_turns as in ReMA (two roles); with more
    roles, num_roles * max_num_turns so every response fits."""
    return max(2, num_roles) * max_num_turns


def collate_episodes(episodes: Sequence[Episode], processor, *, agent_roles: Sequence[str], max_num_turns: int,
                     pad_to_multiple_of: Optional[int] = None) -> "ReMABatch":
    """Finished episodes -> a `ReMABatch` (every role encoded, padded to one common length)."""
    import torch

    if not len(episodes):
        raise ValueError("collate_episodes got no episodes; pass the episodes of at least one question")
    codec = processor if isinstance(processor, _Codec) else _Codec(processor)
    roles = tuple(agent_roles)
    fam = codec.fam
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
                raise ValueError(f"{where}: the episode has no messages for this role; run the rollout with these agent_roles")
            reasons = [h["finish_reason"] for h in e.history if h["role"] == role]
            encs[role].append(codec.encode(msgs, image_data=e.image_data, add_generation_prompt=False,
                                           finish_reasons=reasons, where=where))
    B = len(episodes)
    L = max(x.row.num_tokens for r in roles for x in encs[r])
    if pad_to_multiple_of:
        L = -(-L // pad_to_multiple_of) * pad_to_multiple_of
    tok = codec.tok
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    tensors = {}
    for role in roles:
        ids = np.full((B, L), pad_id, np.int64)
        labels = np.full((B, L), IGNORE_INDEX, np.int64)
        steps = np.full((B, L), IGNORE_INDEX, np.int64)
        att = np.zeros((B, L), np.int64)
        mm = np.zeros((B, L), np.int64)
        pos = np.zeros((B, 3, L), np.int64)
        for b, x in enumerate(encs[role]):
            n = x.row.num_tokens
            ids[b, :n], labels[b, :n], steps[b, :n] = x.row.input_ids, x.row.labels, x.step_ids
            att[b, :n], mm[b, :n], pos[b, :, :n] = 1, x.row.mm_token_type_ids, x.row.position_ids
        for name, arr in (("input_ids", ids), ("labels", labels), ("step_ids", steps), ("attention_mask", att),
                          ("position_ids", pos if fam.is_vision else pos[:, 0]), ("mm_token_type_ids", mm)):
            tensors[f"{role}_{name}"] = torch.from_numpy(arr)
    u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
    grid = np.concatenate(grids).reshape(-1, 3).astype(np.int64)
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
    return ReMABatch(
        agent_roles=roles, max_num_turns=max_num_turns, family=fam.name, batch=tensors, non_tensor_batch=non_tensors,
        image_grid_thw=torch.from_numpy(grid), pixel_values_u8=torch.from_numpy(u8),
        image_offsets=torch.from_numpy(_offsets([len(g) for g in grids])),
        patch_offsets=torch.from_numpy(_offsets([int(g.prod(axis=1).sum()) if len(g) else 0 for g in grids])),
        spec=codec.enc.spec,
    )


def _offsets(counts) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


ROLE_TENSORS = ("input_ids", "labels", "step_ids", "attention_mask", "position_ids", "mm_token_type_ids")


@dataclass(eq=False)
class ReMABatch:
    """A rollout batch of B questions in ReMA's layout (a verl ``DataProto``'s two dicts).

    Attributes (L = one padded length shared by all roles, right padding):
        batch: batch-first tensors, for each role ``{role}_input_ids`` / ``{role}_labels`` /
            ``{role}_step_ids`` / ``{role}_attention_mask`` / ``{role}_mm_token_type_ids``
            int64 [B, L] and ``{role}_position_ids`` int64 [B, 3, L] (vision families, M-RoPE;
            a row without images has 3 equal rows) or [B, L] (text family). Pads: input id
            = pad token, mask 0, labels and step_ids -100, positions 0.
        non_tensor_batch: lists of B: ``question`` (text, ``<image>`` where images go),
            ``finish_reason`` ("finish_flag" / "max_turns"), ``num_turns`` (rounds played),
            ``response`` (the last role's final response), ``history`` (every response entry,
            padded to `history_size` entries with ``{"role": "padding", "content": "<PAD>", ...}``),
            ``{role}_conversation_history`` (the role's last prompt as messages with content
            lists, padded to 2 * max_num_turns with ``{"role": "padding", ...}``).
        image_grid_thw: int64 [I, 3], the questions' images, once (not per role).
        pixel_values_u8: uint8 [N, 3*p*p], their resized pixels in patch order.
        image_offsets / patch_offsets: int64 [B+1]; row b owns images / patch rows
            ``offsets[b]:offsets[b+1]``.
        pixel_values: float32 [N, 3*T*p*p] (property), the processor's pixel_values.
    """

    agent_roles: tuple
    max_num_turns: int
    family: str
    batch: dict
    non_tensor_batch: dict
    image_grid_thw: Any
    pixel_values_u8: Any
    image_offsets: Any
    patch_offsets: Any
    spec: Any = None

    def __len__(self) -> int:
        return len(self.non_tensor_batch["question"])

    @property
    def pixel_values(self):
        import torch

        fam = get_family(self.family)
        if not fam.is_vision:
            return None
        spec = self.spec or VisionSpec.from_family(fam)
        cached = getattr(self, "_pv", None)
        if cached is None or cached[0] is not self.pixel_values_u8:
            pv = u8_to_pixel_values(self.pixel_values_u8.numpy(), spec.lut(), spec.temporal_patch_size)
            cached = self._pv = (self.pixel_values_u8, torch.from_numpy(pv))
        return cached[1]

    def model_inputs(self, role: str, device=None, *, labels: bool = False) -> dict:
        """Forward kwargs of ``role``'s sequences for a transformers Qwen-VL (or text) model:
        input_ids / attention_mask [B, L], position_ids [3, B, L] (text: [B, L]),
        mm_token_type_ids, pixel_values [N, D] + image_grid_thw [I, 3] when there are images,
        and labels [B, L] if asked."""
        if role not in self.agent_roles:
            raise KeyError(f"role {role!r} is not in this batch's agent_roles {list(self.agent_roles)}")
        b = self.batch
        out = {"input_ids": b[f"{role}_input_ids"], "attention_mask": b[f"{role}_attention_mask"]}
        if get_family(self.family).is_vision:
            out["position_ids"] = b[f"{role}_position_ids"].permute(1, 0, 2).contiguous()
            out["mm_token_type_ids"] = b[f"{role}_mm_token_type_ids"]
            if self.image_grid_thw.shape[0]:
                out["pixel_values"], out["image_grid_thw"] = self.pixel_values, self.image_grid_thw
        else:
            out["position_ids"] = b[f"{role}_position_ids"]
        if labels:
            out["labels"] = b[f"{role}_labels"]
        return {k: v.to(device) for k, v in out.items()} if device is not None else out

    def multi_modal_inputs(self, i: int) -> dict:
        """Row ``i``'s image inputs (verl's per-row ``multi_modal_inputs``): pixel_values
        float32 [N_i, D], image_grid_thw int64 [I_i, 3]."""
        a, b = int(self.patch_offsets[i]), int(self.patch_offsets[i + 1])
        g0, g1 = int(self.image_offsets[i]), int(self.image_offsets[i + 1])
        pv = self.pixel_values
        return {"pixel_values": pv[a:b] if pv is not None else None, "image_grid_thw": self.image_grid_thw[g0:g1]}

    # -- Arrow -------------------------------------------------------------------------------
    def to_arrow(self) -> pa.Table:
        """One Arrow row per question, with `rema_arrow_schema` (roles and turns in metadata)."""
        schema = rema_arrow_schema(self.agent_roles, family=self.family, max_num_turns=self.max_num_turns)
        B = len(self)
        cols: dict[str, list] = {k: list(v) for k, v in self.non_tensor_batch.items()}
        cols["history"] = [[dict(h, finish_reason=h.get("finish_reason") or "") for h in hs] for hs in cols["history"]]
        for role in self.agent_roles:
            cols[f"{role}_conversation_history"] = [
                [{"role": m["role"], "content": [{"type": it["type"], "text": it.get("text")} for it in m["content"]]}
                 for m in msgs] for msgs in cols[f"{role}_conversation_history"]
            ]
            for name in ROLE_TENSORS:
                t = self.batch[f"{role}_{name}"]
                cols[f"{role}_{name}"] = (t[:, None, :] if t.dim() == 2 and name == "position_ids" else t).tolist()
        grids = self.image_grid_thw.numpy()
        u8 = self.pixel_values_u8.numpy()
        io, po = self.image_offsets.tolist(), self.patch_offsets.tolist()
        cols["image_grid_thw"] = [grids[io[b]:io[b + 1]].tolist() for b in range(B)]
        cols["pixel_values_u8"] = [_u8_bytes(u8[po[b]:po[b + 1]]) for b in range(B)]
        cols["family"] = [self.family] * B
        return pa.table({f.name: pa.array(cols[f.name], type=f.type) for f in schema}, schema=schema)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "ReMABatch":
        """Inverse of `to_arrow` (float32 pixel_values are rebuilt from the uint8 pixels)."""
        import torch

        meta = table.schema.metadata or {}
        try:
            roles = tuple(json.loads(meta[b"mmpipe.agent_roles"]))
            max_turns = int(meta[b"mmpipe.max_num_turns"])
        except KeyError:
            raise ValueError(
                "the table has no mmpipe.agent_roles / mmpipe.max_num_turns schema metadata; it was not written by "
                "ReMABatch.to_arrow (keep the schema metadata when saving, e.g. pyarrow.parquet keeps it)"
            ) from None
        rows = table.to_pydict()
        fam = get_family(rows["family"][0]) if rows["family"] else get_family(meta.get(b"mmpipe.family", b"text").decode())
        B = table.num_rows
        tensors = {}
        for role in roles:
            for name in ROLE_TENSORS:
                arr = np.asarray(rows[f"{role}_{name}"], np.int64)
                if name == "position_ids":
                    arr = arr.reshape(B, -1, arr.shape[-1] if arr.size else 0)
                    arr = arr if fam.is_vision else arr[:, 0]
                tensors[f"{role}_{name}"] = torch.from_numpy(np.ascontiguousarray(arr))
        grids = [np.asarray(g, np.int64).reshape(-1, 3) for g in rows["image_grid_thw"]]
        u8 = [_u8_block(v, int(g.prod(axis=1).sum()) if len(g) else 0, fam.patch_dim_u8, "pixel_values_u8", b)
              for b, (v, g) in enumerate(zip(rows["pixel_values_u8"], grids))]
        non = {k: rows[k] for k in ("question", "finish_reason", "num_turns", "response", "history")}
        for role in roles:
            non[f"{role}_conversation_history"] = [
                [{"role": m["role"], "content": [_from_arrow_item(it) for it in m["content"]]} for m in msgs]
                for msgs in rows[f"{role}_conversation_history"]
            ]
        return cls(
            agent_roles=roles, max_num_turns=max_turns, family=fam.name, batch=tensors, non_tensor_batch=non,
            image_grid_thw=torch.from_numpy(np.concatenate(grids).reshape(-1, 3) if grids else np.zeros((0, 3), np.int64)),
            pixel_values_u8=torch.from_numpy(np.concatenate(u8) if u8 else np.zeros((0, fam.patch_dim_u8), np.uint8)),
            image_offsets=torch.from_numpy(_offsets([len(g) for g in grids])),
            patch_offsets=torch.from_numpy(_offsets([len(x) for x in u8])),
            spec=VisionSpec.from_family(fam) if fam.is_vision else None,
        )

    def diff(self, other: "ReMABatch") -> list[str]:
        """Names of what differs (exact comparison): for round-trip checks."""
        import torch

        out = [n for n in ("agent_roles", "max_num_turns", "family") if getattr(self, n) != getattr(other, n)]
        if set(self.batch) != set(other.batch):
            out.append("batch keys")
        for k in self.batch.keys() & other.batch.keys():
            a, b = self.batch[k], other.batch[k]
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
                out.append(k)
        if set(self.non_tensor_batch) != set(other.non_tensor_batch):
            out.append("non_tensor_batch keys")
        for k in self.non_tensor_batch.keys() & other.non_tensor_batch.keys():
            if self.non_tensor_batch[k] != other.non_tensor_batch[k]:
                out.append(k)
        for n in ("image_grid_thw", "pixel_values_u8", "image_offsets", "patch_offsets"):
            a, b = getattr(self, n), getattr(other, n)
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
                out.append(n)
        return out

    def __repr__(self) -> str:
        L = int(next(iter(self.batch.values())).shape[-1]) if self.batch else 0
        return (f"ReMABatch(family={self.family!r}, B={len(self)}, roles={list(self.agent_roles)}, L={L}, "
                f"images={int(self.image_grid_thw.shape[0])}, finish={self.non_tensor_batch['finish_reason']})")


def _from_arrow_item(it: dict) -> dict:
    return {"type": "image"} if it["type"] == "image" else _text(it["text"])


_ITEM = pa.struct([("type", pa.string()), ("text", pa.string())])
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.list_(_ITEM))])
_HISTORY_ENTRY = pa.struct([("role", pa.string()), ("content", pa.string()), ("turn", pa.int32()),
                            ("finish_reason", pa.string()), ("num_tokens", pa.int32())])


def rema_arrow_schema(agent_roles: Sequence[str] = ("{role}",), *, family: Optional[str] = None,
                      max_num_turns: Optional[int] = None) -> pa.Schema:
    """Arrow schema of a `ReMABatch` stored one row per question.

    With the default ``agent_roles=("{role}",)`` it shows the per-role column pattern (what
    ``schemas/rema_batch.json`` holds). Tensor columns are stored padded (length L).
    """
    cols: list[tuple[str, pa.DataType, str]] = [
        ("question", pa.string(), "the question's text, <image> where each image goes"),
        ("finish_reason", pa.string(), "finish_flag (a finish role's response held the flag) or max_turns"),
        ("num_turns", pa.int32(), "rounds played; every role answered once per round"),
        ("response", pa.string(), "the last role's final response"),
        ("history", pa.list_(_HISTORY_ENTRY),
         "every response in order {role, content, turn, finish_reason (engine's), num_tokens (generated)}, "
         "padded to max(2, R) * max_num_turns entries with {role: padding, content: <PAD>, turn: -1}"),
    ]
    for r in agent_roles:
        cols += [
            (f"{r}_input_ids", pa.list_(pa.int32()), "int [L] the role's view, image pads expanded, right-padded"),
            (f"{r}_labels", pa.list_(pa.int32()), "int [L] -100 except the role's own response tokens (+ end-of-turn after a normal stop)"),
            (f"{r}_step_ids", pa.list_(pa.int32()), "int [L] turn index on the role's target tokens, -100 elsewhere"),
            (f"{r}_attention_mask", pa.list_(pa.int8()), "int [L] 1 for real tokens"),
            (f"{r}_position_ids", pa.list_(pa.list_(pa.int32())), "int [3, L] M-RoPE (vision families) or [1, L] plain (text), pads 0"),
            (f"{r}_mm_token_type_ids", pa.list_(pa.int8()), "int [L] 0 text, 1 image"),
            (f"{r}_conversation_history", pa.list_(_MESSAGE),
             "the role's last prompt as chat messages {role, content: [{type: text|image, text}]}, padded to "
             "2 * max_num_turns with {role: padding, content: [{type: text, text: <PAD>}]}"),
        ]
    cols += [
        ("image_grid_thw", pa.list_(pa.list_(pa.int32())), "int [I, 3] patch grid per question image (shared by all roles)"),
        ("pixel_values_u8", pa.binary(), "uint8 [N, 3*p*p] raw bytes + one 0xFF end marker: the question's resized images, once"),
        ("family", pa.string(), "model family name: qwen2_vl, qwen2_5_vl, qwen3_vl, text"),
    ]
    meta = {"mmpipe.agent_roles": json.dumps(list(agent_roles))}
    if max_num_turns is not None:
        meta["mmpipe.max_num_turns"] = str(int(max_num_turns))
    if family is not None:
        meta["mmpipe.family"] = family
    return pa.schema([pa.field(n, t, nullable=False, metadata={"doc": d}) for n, t, d in cols], metadata=meta)
