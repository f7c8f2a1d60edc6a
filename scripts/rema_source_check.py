"""Check mmpipe.rema's output against ReMA's OWN code (not a restatement of it).

    python scripts/rema_source_check.py PATH/TO/ReMA-public/src/verl/verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py

ReMA (ziyuwan/ReMA-public) is not a package one can install here (a verl fork with vLLM), so
the tests check against its rules restated in tests/rema/rema_reference.py. This script takes
ReMA's released file, extracts ``encode_conversation``, ``_pad_history`` and the method
``_build_tensor_dict`` with ``ast`` (their imports are not needed; nothing is copied into
mmpipe), runs random scripted two-role rollouts through ``mmpipe.rema.rollout`` (text model,
the offline tokenizer; finish flag, truncation, ``stop_when_truncated``, ``prompt_length``,
the flag stripped from the second role) and feeds ReMA's functions the batch's own
histories, as ``multi_turn_generate_sequences`` does. Every tensor ReMA builds
(input_ids, labels, step_ids, attention_mask, position_ids, num_gen_tokens, stop_reasons,
turn_finished) must equal the batch's, and the padded histories ReMA's.
"""

from __future__ import annotations

import ast
import random
import re
import sys
import types
import typing
from collections import Counter

import numpy as np
import torch

from mmpipe import rema, testing
from mmpipe.records.generation import Completion, Generation

ROLES = ["meta_thinking", "reasoning"]
FLAG = "[FINISH]"
WORDS = ["alpha", "beta two", "gamma", "x = 3 + 4", "the answer", "plan: add", "ok", ""]


def rema_functions(path: str) -> dict:
    """ReMA's encode_conversation, _pad_history and _build_tensor_dict, from its source file."""
    ns = {"torch": torch, "np": np, "List": typing.List, "Dict": typing.Dict, "Optional": typing.Optional,
          "PreTrainedTokenizer": object,
          # verl.utils.model.compute_position_id_with_mask (ReMA's verl fork), one line:
          "compute_position_id_with_mask": lambda m: torch.clip(torch.cumsum(m, dim=-1) - 1, min=0, max=None)}
    wanted = {"encode_conversation", "_pad_history", "_build_tensor_dict"}
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            exec(compile(ast.Module([node], []), path, "exec"), ns)
    missing = wanted - set(ns)
    if missing:
        sys.exit(f"{path}: no {sorted(missing)} found; is this ReMA's vllm_rollout_spmd.py?")
    return ns


class Scripted:
    """Replies ``script[(row, role, turn)]``; row from the ``Q<i>:`` tag, turn from the headers."""

    def __init__(self, tok, role, script):
        self.tok, self.role, self.script = tok, role, script
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, rows, params=None):
        out = []
        for k, r in enumerate(rows):
            text = self.tok.decode(r.input_ids.tolist())
            row = int(re.search(r"Q(\d+):", text).group(1))
            reply, finish = self.script[(row, self.role, text.count("<|im_start|>assistant") - 1)]
            ids = self.tok(reply, add_special_tokens=False)["input_ids"] + ([self.im_end] if finish == "stop" else [])
            out.append(Generation(prompt_index=k, completions=[Completion(token_ids=ids, finish_reason=finish)]))
        return out


def main(path: str, trials: int = 40, seed: int = 0) -> None:
    ns = rema_functions(path)
    tok = testing.build_tokenizer("qwen2_vl")
    rng = random.Random(seed)
    seen, checked, rows = Counter(), 0, 0
    for _ in range(trials):
        T, B = rng.randint(1, 3), rng.randint(1, 4)
        script = {(i, r, t): (rng.choice(WORDS) + (f" {FLAG}" if r == ROLES[0] and rng.random() < 0.25 else ""),
                              rng.choice(["stop", "stop", "length"]))
                  for i in range(B) for r in ROLES for t in range(T)}
        prompt_length, response_length = 200, 64
        try:
            batch = rema.rollout([f"Q{i}: what is {i}+{i}?" for i in range(B)],
                                 {r: Scripted(tok, r, script) for r in ROLES}, tok, agent_roles=ROLES,
                                 max_num_turns=T, finish_flag=FLAG, system_prompts={r: r.title() for r in ROLES},
                                 stop_when_truncated=rng.random() < 0.5, prompt_length=rng.choice([None, 70, 90]),
                                 max_length=prompt_length + response_length, strip_finish_flag=[ROLES[1]])
        except ValueError as e:  # the first role's first prompt over prompt_length: ReMA raises too
            assert "first prompt is longer" in str(e)
            continue
        non = batch.non_tensor_batch
        hist = [[h for h in hs if h["role"] != "padding"] for hs in non["history"]]
        conv = {r: [[m for m in c if m["role"] != "padding"] for c in non[f"{r}_conversation_history"]] for r in ROLES}
        # as multi_turn_generate_sequences prepares _build_tensor_dict's arguments
        last = [{m["role"]: m["content"] for m in h[-2:]} for h in hist]
        nums = {r: [[m["num_gen_tokens"] for m in h if m["role"] == r] for h in hist] for r in ROLES}
        stops = {r: [[m["stop_reason"] for m in h if m["role"] == r] for h in hist] for r in ROLES}
        self = types.SimpleNamespace(config=types.SimpleNamespace(response_length=response_length,
                                                                  prompt_length=prompt_length, max_num_turns=T))
        theirs = ns["_build_tensor_dict"](self, last, conv, tok, nums, stops, T, list(non["finish_reason"]))
        for r in ROLES:
            for k, v in theirs[r].items():
                ours = batch.batch[f"{r}_{k}"]
                assert ours.shape == v.shape and torch.equal(ours.to(v.dtype), v), f"{r}_{k} differs from ReMA's"
            assert ns["_pad_history"](conv[r], 2 * T) == non[f"{r}_conversation_history"]
        assert ns["_pad_history"](hist, 2 * T) == non["history"]
        assert non["num_turns"] == [len(h) // len(ROLES) for h in hist]
        assert non["response"] == [h[-1]["content"] for h in hist]
        checked, rows = checked + 1, rows + B
        seen.update(map(str, non["finish_reason"]))
        seen["placeholder entries"] += sum(m["content"] == "" and m["stop_reason"] not in ("stop", "length")
                                           for h in hist for m in h)
    print(f"{checked} batches ({rows} rows) equal ReMA's own _build_tensor_dict / _pad_history; seen: {dict(seen)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
