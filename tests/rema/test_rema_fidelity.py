"""ReMA's ending rules and output layout (checked against ReMA's released source, restated in
tests/rema/rema_reference.py): finish reasons None / reach_max_turn / completion_token_exceeded
/ stop_when_truncated with ReMA's placeholder entries, per-turn tensors, fixed-length padding,
the flag stripped from the second role, and the loss at ReMA's (shifted) label positions."""

from __future__ import annotations

import pytest
import torch

from mmpipe import rema, testing
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import processor_for
from helpers import tiny_text_model
from test_rema import FLAG, ScriptedEngine, check_batch, rows_of

ROLES = ["meta", "reasoning"]
SYSTEM = {"meta": "Plan.", "reasoning": "Solve."}


def scripted(proc, script):
    """Engines per role answering ``script[(row, role, turn)] = (text, finish)`` ("stop" default)."""
    def respond(role):
        return lambda row, turn: script.get((row, role, turn), (f"{role} r{row} t{turn}", "stop"))
    return {r: ScriptedEngine(proc, respond(r)) for r in ROLES}


def test_stop_when_truncated_ends_the_row_with_rema_placeholders():
    tok = testing.build_tokenizer("qwen2_vl")
    script = {(0, "meta", 0): ("cut plan", "length"),             # first role cut: placeholder for the second
              (1, "reasoning", 0): ("cut answer", "length"),      # second role cut: the round is complete
              (2, "meta", 0): (f"plan {FLAG}", "stop"), (2, "reasoning", 0): ("cut", "length"),  # truncation wins
              (3, "meta", 1): (f"done {FLAG}", "stop")}
    engines = scripted(tok, script)
    qs = [f"Q{i}: what?" for i in range(4)]
    batch = rema.rollout(qs, engines, tok, agent_roles=ROLES, max_num_turns=3, finish_flag=FLAG,
                         system_prompts=SYSTEM, stop_when_truncated=True)
    non = batch.non_tensor_batch
    assert non["finish_reason"] == ["stop_when_truncated"] * 3 + [None]
    assert non["num_turns"] == [1, 1, 1, 2]
    assert batch.batch["meta_turn_finished"].tolist() == [3, 3, 3, 0]
    assert rows_of(engines["meta"].calls) == [[0, 1, 2, 3], [3]]
    assert rows_of(engines["reasoning"].calls) == [[1, 2, 3], [3]]  # row 0 never asked: it got the placeholder
    h0 = non["history"][0]
    assert h0[1] == {"role": "reasoning", "content": "", "num_gen_tokens": 0, "stop_reason": "stop_when_truncated"}
    assert h0[2:] == [{"role": "padding", "content": "<PAD>"}] * 4
    # the placeholder's prompt is the view the second role would have got (ReMA rebuilds it)
    conv = [m for m in non["reasoning_conversation_history"][0] if m["role"] != "padding"]
    assert conv[-1] == {"role": "user", "content": "Question:\nQ0: what?\n\nInstruction:\ncut plan"}
    assert batch.batch["reasoning_num_gen_tokens"][0].tolist() == [0, 0, 0]
    assert batch.batch["reasoning_stop_reasons"][0].tolist() == [True, False, False]
    assert batch.batch["meta_stop_reasons"][:, 0].tolist() == [True, False, False, False]
    check_batch(batch, tok, [[] for _ in qs])


def test_prompt_length_ends_rows_with_completion_token_exceeded():
    tok = testing.build_tokenizer("qwen2_vl")
    long = " ".join(["word"] * 40)
    script = {(0, "meta", 0): (long, "stop"),        # the second role's prompt grows too long: placeholder
              (1, "reasoning", 0): (long, "stop")}   # the first role's next prompt too long: no placeholder
    engines = scripted(tok, script)
    qs = [f"Q{i}: what?" for i in range(3)]
    batch = rema.rollout(qs, engines, tok, agent_roles=ROLES, max_num_turns=2, finish_flag=FLAG,
                         system_prompts=SYSTEM, prompt_length=86)  # prompts: row 0 reasoning 87, row 1 meta 93, row 2 <= 85
    non = batch.non_tensor_batch
    assert non["finish_reason"] == ["completion_token_exceeded", "completion_token_exceeded", "reach_max_turn"]
    assert non["num_turns"] == [1, 1, 2]
    assert rows_of(engines["reasoning"].calls) == [[1, 2], [2]]
    assert rows_of(engines["meta"].calls) == [[0, 1, 2], [2]]
    assert non["history"][0][1]["stop_reason"] == "completion_token_exceeded"
    # row 1's first role keeps the prompt it answered last (turn 0), as in ReMA
    meta1 = [m for m in non["meta_conversation_history"][1] if m["role"] != "padding"]
    assert [m["role"] for m in meta1] == ["system", "user"]
    assert batch.batch["reasoning_turn_finished"].tolist() == [2, 2, 1]
    check_batch(batch, tok, [[] for _ in qs])
    with pytest.raises(ValueError, match="first role's first prompt is longer than prompt_length"):
        rema.rollout(qs, scripted(tok, {}), tok, agent_roles=ROLES, max_num_turns=1, finish_flag=FLAG, prompt_length=5)


def test_one_round_keeps_none_fixed_length_and_stripped_flag():
    proc = processor_for("qwen2_vl")
    script = {(0, "reasoning", 0): (f"answer {FLAG}", "stop")}
    qs = [{"question": "Q0: what is shown? <image>", "images": [testing.tiny_image(40, 52)]}, "Q1: and this?"]
    batch = rema.rollout(qs, scripted(proc, script), proc, agent_roles=ROLES, max_num_turns=1, finish_flag=FLAG,
                         system_prompts=SYSTEM, max_length=256, strip_finish_flag=["reasoning"])
    non = batch.non_tensor_batch
    assert non["finish_reason"] == [None, None]  # ReMA marks reach_max_turn only when max_num_turns > 1
    assert non["response"][0] == "answer"        # ReMA removes the flag from the second role's output
    assert all(batch.batch[f"{r}_{k}"].shape[-1] == 256 for r in ROLES for k in rema.ROLE_TENSORS)
    check_batch(batch, proc, [[qs[0]["images"][0]], []])
    with pytest.raises(ValueError, match="max_length=8 .*drop image tokens"):
        rema.rollout(qs, scripted(proc, {}), proc, agent_roles=ROLES, max_num_turns=1, finish_flag=FLAG, max_length=8)


def test_loss_is_rema_actor_logprob_of_shifted_labels():
    """ReMA's actor scores ``labels`` at the same positions as the logits (they are the rolled
    ids); ``model_inputs(labels=True)`` makes transformers' loss do exactly that."""
    tok = testing.build_tokenizer("qwen2_vl")
    model = tiny_text_model(len(tok))
    batch = rema.rollout(["Q0: 2+2?", "Q1: 3+3?"], TransformersEngine(model, tok), tok, agent_roles=ROLES,
                         max_num_turns=2, finish_flag=FLAG, params=SamplingParams(max_new_tokens=5), max_length=160)
    for role in ROLES:
        kw = batch.model_inputs(role, labels=True)
        with torch.no_grad():
            out = model(**kw)
        labels = batch.batch[f"{role}_labels"]
        lp = torch.log_softmax(out.logits.float(), -1)
        sel = labels != -100
        rema_logprob = lp[sel].gather(-1, labels[sel][:, None])[:, 0]   # ReMA: log_probs(logits, labels)
        torch.testing.assert_close(out.loss, -rema_logprob.mean(), rtol=1e-5, atol=1e-6)
        # every target is the next input token, except the end-of-turn after the last response
        ids, n = batch.batch[f"{role}_input_ids"], batch.batch[f"{role}_attention_mask"].sum(1)
        for b in range(len(batch)):
            t = torch.nonzero(sel[b]).reshape(-1)
            inside = t[t + 1 < n[b]]
            assert torch.equal(labels[b, inside], ids[b, inside + 1])
        assert torch.equal(batch.batch[f"{role}_step_ids"] != -100, sel)
