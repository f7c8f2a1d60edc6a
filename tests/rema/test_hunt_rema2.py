"""ReMA encoding edges (second hunt): a thinking template that rewrites earlier replies (GLM-4.6V),
bad prompt_length / pad_to_multiple_of / view role names (typed, before any engine call), a reply
with no prompt before it, and a max_length that cuts every target (ReMA's cut, now reported)."""

from __future__ import annotations

import logging

import pytest
import torch

from mmpipe import rema, testing
from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import ArgumentError, InputError, ParseError
from mmpipe.records.generation import Completion, Generation, SamplingParams

from conftest import processor_for

ROLES = ["meta", "reasoner"]


class CountingEngine:
    """`RolloutEngine` replying ``text`` (+ ``stop``) to every prompt; counts its calls."""

    def __init__(self, tok, text="ok", stop="<|im_end|>"):
        stop_ids = [tok.convert_tokens_to_ids(stop)] if stop else []
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + stop_ids
        self.calls = 0

    def generate(self, rows, params=SamplingParams()):
        self.calls += 1
        return [Generation(prompt_index=k, completions=[Completion(token_ids=list(self.ids), finish_reason="stop")])
                for k in range(len(rows))]


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def _glm46v():
    from mmpipe.offline import glm46v

    if not glm46v.available():
        pytest.skip("GLM-4.6V needs transformers 5")
    return glm46v.build_processor()


# ---- 1. a template that is not prefix-stable (GLM-4.6V) ------------------------------------------
def test_glm46v_rewritten_reply_names_what_the_template_writes_and_the_fix():
    proc = _glm46v()
    msgs = [U("q"), A("<think>r</think>\na"), U("q2"), A("<think>r2</think>\nb")]
    with pytest.raises(InputError, match=r"message 1: the chat template does not write this reply verbatim") as e:
        rema.encode_conversation(msgs, proc)
    err = str(e.value)
    assert "a later turn follows the reply" in err and "'<think></think>'" in err  # what the template does
    assert "<think></think>\\na<|endoftext|><|user|>" in err  # what it writes there
    assert "chat_template_kwargs={'enable_thinking': False}" in err  # what to do
    assert e.value.stage == "template" and e.value.column == "messages"
    # a reply without reasoning: its own turn gets '<think></think>' the generation prompt did not have
    with pytest.raises(InputError, match="this reply's own turn .* renders it differently"):
        rema.encode_conversation([U("q"), A("a")], proc)


def test_glm46v_fix_as_named_labels_exactly_and_rollout_refuses_after_one_round():
    proc = _glm46v()
    tok = proc.tokenizer
    enc = Encoder(proc, labels=False, chat_template_kwargs={"enable_thinking": False})
    out = rema.encode_conversation([U("q"), A("a"), U("q2"), A("b")], enc)
    assert tok.decode(out.input_ids[out.labels != -100].tolist()) == "a<|endoftext|>b<|endoftext|>"
    qs = [{"question": "Q0 <image> what?", "images": [testing.tiny_image(40, 56, seed=1)]}]
    engine = CountingEngine(tok, "<think>hm</think>\nok", "<|endoftext|>")
    with pytest.raises(InputError, match=r"row 0, role 'meta', turn 1, message 1: .*enable_thinking"):
        rema.rollout(qs, engine, proc, agent_roles=ROLES, max_num_turns=3, finish_flag=None)
    assert engine.calls == 2  # refused when the next prompt is built, not after all 6 engine calls
    engine = CountingEngine(tok, "ok", "<|endoftext|>")
    batch = rema.rollout(qs, engine, enc, agent_roles=ROLES, max_num_turns=2, finish_flag=None)
    lab, st = batch.batch["meta_labels"][0], batch.batch["meta_step_ids"][0]
    assert [tok.decode(lab[st == k].tolist()) for k in range(2)] == ["ok<|endoftext|>"] * 2


# ---- 2. prompt_length and the other lengths: typed, before any engine call --------------------
@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_prompt_length_must_be_a_positive_int(bad):
    proc = processor_for("qwen2_vl")
    engine = CountingEngine(proc.tokenizer)
    with pytest.raises(ArgumentError, match=rf"prompt_length must be a positive int .* found {bad!r}"):
        rema.rollout(["q"], engine, proc, agent_roles=ROLES, max_num_turns=2, finish_flag=None, prompt_length=bad)
    assert engine.calls == 0


def test_first_prompt_over_prompt_length_names_its_token_count():
    proc = processor_for("qwen2_vl")
    n = rema.encode_conversation([U("q")], proc, add_generation_prompt=True).row.num_tokens
    with pytest.raises(InputError, match=rf"at most prompt_length={n - 1} tokens; found {n} tokens"):
        rema.rollout(["q"], CountingEngine(proc.tokenizer), proc, agent_roles=ROLES, max_num_turns=2,
                     finish_flag=None, prompt_length=n - 1)


@pytest.mark.parametrize("kw", [dict(pad_to_multiple_of=8.0), dict(pad_to_multiple_of="8"),
                                dict(pad_to_multiple_of=-8), dict(max_length=0)])
def test_bad_padded_lengths_are_refused_before_the_rollout_runs(kw):
    proc = processor_for("qwen2_vl")
    engine = CountingEngine(proc.tokenizer)
    with pytest.raises(ArgumentError, match="must be a positive int"):  # was a bare TypeError for 8.0 / "8"
        rema.rollout(["q"], engine, proc, agent_roles=ROLES, max_num_turns=2, finish_flag=None, **kw)
    assert engine.calls == 0


# ---- 3. turn order --------------------------------------------------------------------------------
def test_a_reply_without_a_prompt_is_refused_consecutive_user_turns_kept():
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    for msgs, k in (([U("q"), A("a"), A("b")], 2), ([U("q"), A("a"), {"role": "system", "content": "s"}, A("b")], 3)):
        with pytest.raises(ParseError, match=rf"message {k}: two assistant messages in a row.*pass another role's "
                                             "reply as a user message") as e:
            rema.encode_conversation(msgs, proc)
        assert e.value.column == "messages"
    out = rema.encode_conversation([U("q"), U("q2"), A("a")], proc)  # context only: ReMA's encoder takes it
    assert tok.decode(out.input_ids[out.labels != -100].tolist()) == "a<|im_end|>"
    assert set(out.step_ids.tolist()) == {-100, 0}


# ---- 4. a max_length that cuts the targets ---------------------------------------------------------
def test_max_length_cut_is_rema_right_cut_and_rows_without_targets_are_reported(caplog):
    proc = processor_for("qwen2_vl")
    qs = ["a long question that needs many tokens to say", "q"]
    kw = dict(agent_roles=ROLES, max_num_turns=2, finish_flag=None)
    full = rema.rollout(qs, CountingEngine(proc.tokenizer), proc, **kw)
    targets = (full.batch["meta_labels"] != -100).nonzero()
    L = int(targets[targets[:, 0] == 0, 1].min())  # row 0 loses every target, row 1 (a shorter prompt) keeps some
    with caplog.at_level(logging.WARNING, logger="mmpipe"):
        cut = rema.rollout(qs, CountingEngine(proc.tokenizer), proc, max_length=L, **kw)
    for role in ROLES:  # ReMA's cut: each sequence's first L tokens, labels with them; counts from before
        for name in ("input_ids", "labels", "step_ids", "attention_mask"):
            assert torch.equal(cut.batch[f"{role}_{name}"], full.batch[f"{role}_{name}"][:, :L])
        assert torch.equal(cut.batch[f"{role}_num_gen_tokens"], full.batch[f"{role}_num_gen_tokens"])
    assert (cut.batch["meta_labels"][0] != -100).sum() == 0 and (cut.batch["meta_labels"][1] != -100).sum() > 0
    msgs = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert any("of role 'meta' in" in m and "1 row(s) keep no target at all and train nothing: [0]" in m
               for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mmpipe"):
        rema.rollout(qs, CountingEngine(proc.tokenizer), proc, max_length=int(full.batch["meta_input_ids"].shape[1]),
                     **kw)
    assert not [r for r in caplog.records if "max_length" in r.getMessage()]


# ---- views name roles of agent_roles ---------------------------------------------------------------
def test_view_source_roles_one_name_or_a_list_and_misspelt_roles_refused():
    proc = processor_for("qwen2_vl")
    views = {"meta": rema.AskQuestion(reply_from="reasoner"), "reasoner": rema.QuestionWithInstruction()}
    batch = rema.rollout(["q"], CountingEngine(proc.tokenizer, "ok"), proc, agent_roles=ROLES, max_num_turns=2,
                         finish_flag=None, views=views)
    seen = [m["content"] for m in batch.non_tensor_batch["meta_conversation_history"][0] if m["role"] == "user"]
    assert seen == ["q", "ok"]  # was "Continue.": the string was read as roles 'r', 'e', 'a', ...
    for views in ({"meta": rema.AskQuestion(reply_from=("reasonr",)), "reasoner": rema.QuestionWithInstruction()},
                  {"meta": rema.AskQuestion(), "reasoner": rema.QuestionWithInstruction(instruction_from="mta")}):
        engine = CountingEngine(proc.tokenizer)
        with pytest.raises(ArgumentError, match="not (all|among) in agent_roles|not among agent_roles"):
            rema.rollout(["q"], engine, proc, agent_roles=ROLES, max_num_turns=2, finish_flag=None, views=views)
        assert engine.calls == 0
    ctx = rema.ViewContext(index=0, turn=1, role="meta", agent_roles=tuple(ROLES), question=(), history=())
    with pytest.raises(ArgumentError, match=r"role 'meta', turn 1: the view's role names \['solver'\]"):
        ctx.latest("solver")  # a custom view's typo: was None, then an unrelated content error


def test_role_without_targets_gets_no_labels_so_no_nan_loss():
    """Every target of a role cut by max_length: model_inputs(labels=True) handed all -100 labels and
    the loss was NaN; they are left out (as BatchedMultiModalInputs does). An unknown role is an
    ArgumentError (was a bare KeyError)."""
    from conftest import model_for

    proc = processor_for("qwen2_vl")
    kw = dict(agent_roles=ROLES, max_num_turns=2, finish_flag=None)
    batch = rema.rollout(["a long question that needs many tokens to say"], CountingEngine(proc.tokenizer), proc,
                         max_length=10, **kw)
    assert (batch.batch["meta_labels"] == -100).all()
    inputs = batch.model_inputs("meta", labels=True)
    assert "labels" not in inputs and "shift_labels" not in inputs
    with torch.no_grad():
        assert model_for("qwen2_vl")(**inputs).loss is None
    full = rema.rollout(["q"], CountingEngine(proc.tokenizer), proc, **kw)
    with torch.no_grad():
        assert torch.isfinite(model_for("qwen2_vl")(**full.model_inputs("meta", labels=True)).loss)
    with pytest.raises(ArgumentError, match="agent_roles"):
        full.model_inputs("solver")
