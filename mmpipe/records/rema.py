"""ReMA records: one question's multi-agent `Episode`, one role's `RoleEncoding`, and the
collated `ReMABatch` with its Arrow schema (`rema_arrow_schema`).

`ReMABatch` holds what ReMA's trainer reads (ReMA-public ``vllm_rollout_spmd.py``
``multi_turn_generate_sequences``, ``dp_rema_actor``, ``reward_manager/rema``): labels and
step_ids SHIFTED (the label at t is the target of the logits at t), ids ending at the role's
last response token, per-turn ``num_gen_tokens`` / ``stop_reasons``, ``turn_finished``,
ReMA's finish reasons and history entries (see `ReMABatch`).

Position layout: `ReMABatch` is a batch-first container (verl's DataProto: every tensor of a
TensorDict leads with the batch dim), so it holds the batch-first form stated in
`mmpipe.records`: ``{role}_position_ids`` int64 [B, 3, L]; the model layout [3, B, L] is
``position_ids.transpose(0, 1)`` (what `ReMABatch.model_inputs` returns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import get_family
from mmpipe.images.pixels import u8_to_pixel_values
from mmpipe.images.spec import VisionSpec
from mmpipe.records.columns import IGNORE_INDEX, IMAGE_PLACEHOLDER, offsets, u8_block, u8_bytes
from mmpipe.records.row import MultiModalInputs

if TYPE_CHECKING:  # records never import torch at import time (the methods that need it do)
    import torch


def text_item(s: str) -> dict:
    """A text content item ``{"type": "text", "text": s}``."""
    return {"type": "text", "text": s}


def content_text(items: Sequence[dict]) -> str:
    """Content items -> text, images as ``<image>`` (the ``question`` column, rewards)."""
    return "".join(IMAGE_PLACEHOLDER if it["type"] == "image" else it["text"] for it in items)


@dataclass(eq=False)
class Episode:
    """One question's multi-agent conversation.

    Attributes:
        index:         row index in the batch.
        question:      content items (images as ``{"type": "image"}``).
        images:        the question's images, as given (PIL, path, bytes...).
        messages:      role -> that role's full view: [system], user, assistant, ..., with
                       content lists; its assistant messages are the role's own responses.
        history:       every response in order, ReMA's entries: ``{"role": agent role,
                       "content": text, "num_gen_tokens": generated token count,
                       "stop_reason": the engine's finish reason ("stop", "length", ...) or,
                       for an empty placeholder response, the episode's finish reason}``.
        num_turns:     rounds played (ReMA: ``len(history) // len(agent_roles)``).
        finished:      whether the episode has ended.
        finish_reason: ReMA's: None (running, or ended by the finish flag), ``reach_max_turn``,
                       ``completion_token_exceeded``, ``stop_when_truncated``.
        image_data:    None until encoded, then (pixels uint8 [N, 3*p*p], grids int64 [I, 3]):
                       the question's images, encoded once and shared by every role.
    """

    index: int
    question: list[dict[str, Any]]
    images: tuple[Any, ...]
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    num_turns: int = 0
    finished: bool = False
    finish_reason: Optional[str] = None
    image_data: Optional[tuple[np.ndarray, np.ndarray]] = None

    @property
    def question_text(self) -> str:
        return content_text(self.question)

    def conversation_history(self, role: str) -> list[dict]:
        """ReMA's ``{role}_conversation_history``: the role's last prompt (its view without
        its final response), at most 2 * num_turns messages."""
        msgs = self.messages.get(role, [])
        return list(msgs[:-1]) if msgs and msgs[-1]["role"] == "assistant" else list(msgs)


@dataclass(eq=False)
class RoleEncoding:
    """One role's view of one conversation, encoded.

    Attributes:
        row:      `MultiModalInputs`: input_ids int64 [L] (image pads expanded), labels int64
                  [L] (or None for a prompt), mm_token_type_ids int64 [L], position_ids int64
                  [3, L] (M-RoPE; text-only families: 3 equal rows), image_grid_thw int64
                  [I, 3], pixel_values_u8 uint8 [N, 3*p*p].
        step_ids: int64 [L]: the turn index (0-based, = index of the role's assistant message)
                  on the role's target tokens, -100 elsewhere (``step_ids != -100`` exactly
                  where ``labels != -100``).
        text:     the rendered conversation the ids stand for.
        tail:     tokens after the end of the last assistant message (the template's
                  end-of-turn, e.g. ``<|im_end|>`` and a newline); 0 for a prompt.
    """

    row: MultiModalInputs
    step_ids: np.ndarray
    text: str
    tail: int = 0

    def rema_view(self) -> dict[str, np.ndarray]:
        """ReMA's training sequence: ids up to the last response's last token (the end-of-turn
        tokens after it dropped), labels and step_ids SHIFTED left by one (the label at t is
        the target of the logits at t; the last one is the end-of-turn token after a normal
        stop, -100 otherwise). Returns int64 arrays: input_ids / labels / step_ids /
        mm_token_type_ids [n], position_ids [3, n], n = L - tail."""
        r = self.row
        n = r.num_tokens - self.tail
        if self.tail < 1:
            raise ArgumentError("rema_view needs a conversation that ends with an assistant message (tail >= 1)")
        return {
            "input_ids": r.input_ids[:n], "labels": r.labels[1:n + 1], "step_ids": self.step_ids[1:n + 1],
            "mm_token_type_ids": r.mm_token_type_ids[:n], "position_ids": r.position_ids[:, :n],
        }

    @property
    def input_ids(self) -> np.ndarray:
        return self.row.input_ids

    @property
    def labels(self) -> Optional[np.ndarray]:
        return self.row.labels

    @property
    def attention_mask(self) -> np.ndarray:
        return self.row.attention_mask

    @property
    def position_ids(self) -> np.ndarray:
        return self.row.position_ids


@dataclass(eq=False)
class ReMABatch:
    """A rollout batch of B questions in ReMA's layout (a verl ``DataProto``'s two dicts).

    Attributes (L = one padded length shared by all roles, right padding; ReMA: a fixed
    ``prompt_length + response_length``, here ``max_length=`` or the longest sequence):
        batch: batch-first tensors, for each role ``{role}_input_ids`` / ``{role}_labels`` /
            ``{role}_step_ids`` / ``{role}_attention_mask`` / ``{role}_mm_token_type_ids``
            int64 [B, L] (labels and step_ids shifted, see the module doc) and
            ``{role}_position_ids`` int64 [B, 3, L] (vision families, M-RoPE; a row without
            images has 3 equal rows) or [B, L] (text family: ReMA's ``cumsum(mask) - 1``
            clipped at 0, so pads repeat the last position); ``{role}_num_gen_tokens`` int64
            [B, T] (per turn, the role's target tokens: response + end-of-turn after a stop, 0
            for a placeholder), ``{role}_stop_reasons`` bool [B, T] (False for "stop", True
            otherwise; False past the last turn), ``{role}_turn_finished`` int64 [B] (finish
            code: 0 None, 1 reach_max_turn, 2 completion_token_exceeded, 3 stop_when_truncated).
            Pads: input id = pad token, mask 0, labels and step_ids -100.
        non_tensor_batch: lists of B: ``question`` (text, ``<image>`` where images go),
            ``finish_reason`` (ReMA's vocabulary, see `Episode`), ``num_turns``, ``response``
            (the last history entry's content), ``history`` (ReMA entries padded to
            `history_size` with ``{"role": "padding", "content": "<PAD>"}``) and
            ``{role}_conversation_history`` (the role's last prompt; a content is a string,
            or a content list where it shows images; padded to 2 * max_num_turns with
            ``{"role": "padding", "content": "<PAD>"}``).
        image_grid_thw: int64 [I, 3], the questions' images, once (not per role).
        pixel_values_u8: uint8 [N, 3*p*p], their resized pixels in patch order.
        image_offsets / patch_offsets: int64 [B+1]; row b owns images / patch rows
            ``offsets[b]:offsets[b+1]``.
        spec: the `VisionSpec` float32 pixels are made with (None: the family's).
        pixel_values: float32 [N, 3*T*p*p] (property), the processor's pixel_values.
        agent_roles / max_num_turns / family: the roles in order, the round limit, the family name.
    """

    agent_roles: tuple[str, ...]
    max_num_turns: int
    family: str
    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, list[Any]]
    image_grid_thw: torch.Tensor
    pixel_values_u8: torch.Tensor
    image_offsets: torch.Tensor
    patch_offsets: torch.Tensor
    spec: Optional[VisionSpec] = None

    def __len__(self) -> int:
        return len(self.non_tensor_batch["question"])

    @property
    def pixel_values(self) -> Optional[torch.Tensor]:
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
        mm_token_type_ids, pixel_values [N, D] + image_grid_thw [I, 3] when there are images;
        with ``labels=True`` the shifted labels as ``labels`` and ``shift_labels`` (transformers'
        loss then scores them unshifted: ReMA's), none where all were cut (a NaN loss)."""
        if role not in self.agent_roles:
            raise ArgumentError(f"role {role!r} is not in this batch's agent_roles {list(self.agent_roles)}")
        b = self.batch
        out = {"input_ids": b[f"{role}_input_ids"], "attention_mask": b[f"{role}_attention_mask"]}
        if get_family(self.family).is_vision:
            out["position_ids"] = b[f"{role}_position_ids"].permute(1, 0, 2).contiguous()
            out["mm_token_type_ids"] = b[f"{role}_mm_token_type_ids"]
            if self.image_grid_thw.shape[0]:
                out["pixel_values"], out["image_grid_thw"] = self.pixel_values, self.image_grid_thw
        else:
            out["position_ids"] = b[f"{role}_position_ids"]
        if labels and bool((b[f"{role}_labels"] != IGNORE_INDEX).any()):
            out["labels"] = out["shift_labels"] = b[f"{role}_labels"]
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
        for role in self.agent_roles:
            cols[f"{role}_conversation_history"] = [
                [{"role": m["role"], "content": [{"type": it["type"], "text": it.get("text")} for it in _items(m["content"])]}
                 for m in msgs] for msgs in cols[f"{role}_conversation_history"]
            ]
            for name in ROLE_TENSORS + ROLE_TURN_TENSORS:
                t = self.batch[f"{role}_{name}"]
                cols[f"{role}_{name}"] = (t[:, None, :] if t.dim() == 2 and name == "position_ids" else t).tolist()
        grids = self.image_grid_thw.numpy()
        u8 = self.pixel_values_u8.numpy()
        io, po = self.image_offsets.tolist(), self.patch_offsets.tolist()
        cols["image_grid_thw"] = [grids[io[b]:io[b + 1]].tolist() for b in range(B)]
        cols["pixel_values_u8"] = [u8_bytes(u8[po[b]:po[b + 1]]) for b in range(B)]
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
            raise InputError(
                "the table has no mmpipe.agent_roles / mmpipe.max_num_turns schema metadata; it was not written by "
                "ReMABatch.to_arrow", where="", stage="validate", expected="both keys", found=f"keys {sorted(meta)}",
                fix="keep the schema metadata when saving (pyarrow.parquet keeps it)",
            ) from None
        rows = table.to_pydict()
        fam = get_family(rows["family"][0]) if rows["family"] else get_family(meta.get(b"mmpipe.family", b"text").decode())
        B = table.num_rows
        tensors = {}
        for role in roles:
            for name in ROLE_TENSORS + ROLE_TURN_TENSORS:
                arr = np.asarray(rows[f"{role}_{name}"], bool if name == "stop_reasons" else np.int64)
                if name == "position_ids":
                    arr = fam.model_positions(arr.reshape(B, -1, arr.shape[-1] if arr.size else 0), axis=1)
                tensors[f"{role}_{name}"] = torch.from_numpy(np.ascontiguousarray(arr.reshape(B, -1) if name in (
                    "num_gen_tokens", "stop_reasons") else arr))
        grids = [np.asarray(g, np.int64).reshape(-1, 3) for g in rows["image_grid_thw"]]
        u8 = [u8_block(v, int(g.prod(axis=1).sum()) if len(g) else 0, fam.patch_dim_u8, "pixel_values_u8", b)
              for b, (v, g) in enumerate(zip(rows["pixel_values_u8"], grids))]
        non = {k: rows[k] for k in ("question", "finish_reason", "num_turns", "response")}
        non["history"] = [[{k: v for k, v in h.items() if v is not None} for h in hs] for hs in rows["history"]]
        for role in roles:
            non[f"{role}_conversation_history"] = [
                [{"role": m["role"], "content": _from_arrow_content(m["content"])} for m in msgs]
                for msgs in rows[f"{role}_conversation_history"]
            ]
        return cls(
            agent_roles=roles, max_num_turns=max_turns, family=fam.name, batch=tensors, non_tensor_batch=non,
            image_grid_thw=torch.from_numpy(np.concatenate(grids).reshape(-1, 3) if grids else np.zeros((0, 3), np.int64)),
            pixel_values_u8=torch.from_numpy(np.concatenate(u8) if u8 else np.zeros((0, fam.patch_dim_u8), np.uint8)),
            image_offsets=torch.from_numpy(offsets([len(g) for g in grids])),
            patch_offsets=torch.from_numpy(offsets([len(x) for x in u8])),
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


ROLE_TENSORS = ("input_ids", "labels", "step_ids", "attention_mask", "position_ids", "mm_token_type_ids")
ROLE_TURN_TENSORS = ("num_gen_tokens", "stop_reasons", "turn_finished")  # [B, T], [B, T] bool, [B]


def _items(content) -> list[dict]:
    """A message content (string or content list) as content items."""
    return [text_item(content)] if isinstance(content, str) else list(content)


def _from_arrow_content(items: list[dict]):
    """Stored content items -> the batch's form: a string when there is no image (`_items`' inverse)."""
    if all(it["type"] == "text" for it in items):
        return "".join(it["text"] for it in items)
    return [{"type": "image"} if it["type"] == "image" else text_item(it["text"]) for it in items]


_ITEM = pa.struct([("type", pa.string()), ("text", pa.string())])


_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.list_(_ITEM))])


_HISTORY_ENTRY = pa.struct([("role", pa.string()), ("content", pa.string()), ("num_gen_tokens", pa.int32()),
                            ("stop_reason", pa.string())])  # padding entries: null num_gen_tokens / stop_reason


def rema_arrow_schema(agent_roles: Sequence[str] = ("{role}",), *, family: Optional[str] = None,
                      max_num_turns: Optional[int] = None) -> pa.Schema:
    """Arrow schema of a `ReMABatch` stored one row per question.

    With the default ``agent_roles=("{role}",)`` it shows the per-role column pattern (what
    ``schemas/rema_batch.json`` holds). Tensor columns are stored padded (length L).
    """
    cols: list[tuple[str, pa.DataType, str]] = [
        ("question", pa.string(), "the question's text, <image> where each image goes"),
        ("finish_reason", pa.string(), "ReMA's: null (the finish flag ended it), reach_max_turn, "
         "completion_token_exceeded or stop_when_truncated"),
        ("num_turns", pa.int32(), "rounds played: len(history) // number of roles"),
        ("response", pa.string(), "the last history entry's content"),
        ("history", pa.list_(_HISTORY_ENTRY),
         "every response in order {role, content, num_gen_tokens (generated), stop_reason (engine's finish reason)}, "
         "padded to max(2, R) * max_num_turns entries with {role: padding, content: <PAD>} (null other fields)"),
    ]
    for r in agent_roles:
        cols += [
            (f"{r}_input_ids", pa.list_(pa.int32()), "int [L] the role's view, image pads expanded, right-padded"),
            (f"{r}_labels", pa.list_(pa.int32()), "int [L] SHIFTED: at t the target of the logits at t; -100 except "
             "the role's own response tokens (+ end-of-turn after a normal stop)"),
            (f"{r}_step_ids", pa.list_(pa.int32()), "int [L] shifted like labels: turn index on the targets, -100 elsewhere"),
            (f"{r}_attention_mask", pa.list_(pa.int8()), "int [L] 1 for real tokens"),
            (f"{r}_position_ids", pa.list_(pa.list_(pa.int32())), "int [3, L] M-RoPE (vision families) or [1, L] plain (text), pads 0"),
            (f"{r}_mm_token_type_ids", pa.list_(pa.int8()), "int [L] 0 text, 1 image"),
            (f"{r}_num_gen_tokens", pa.list_(pa.int32()), "int [T] per turn the role's target tokens, 0 after the last"),
            (f"{r}_stop_reasons", pa.list_(pa.bool_()), "bool [T] per turn: the response did not stop normally"),
            (f"{r}_turn_finished", pa.int8(), "finish code: 0 none/flag, 1 reach_max_turn, 2 completion_token_exceeded, "
             "3 stop_when_truncated"),
            (f"{r}_conversation_history", pa.list_(_MESSAGE),
             "the role's last prompt as chat messages {role, content: [{type: text|image, text}]} (a content without "
             "images reads back as a string), padded to 2 * max_num_turns with {role: padding, content: <PAD>}"),
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
    return pa.schema([pa.field(n, t, nullable=n == "finish_reason", metadata={"doc": d}) for n, t, d in cols],
                     metadata=meta)

