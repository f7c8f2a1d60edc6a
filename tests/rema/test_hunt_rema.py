"""ReMA edge cases: labels over many turns, GLM's template (no end of turn), families ReMA does
not take, bad messages / arguments / engine outputs as typed errors, a long sampled rollout."""

from __future__ import annotations

import pytest
import torch

from mmpipe import rema, testing
from mmpipe.batching.collate import Collator
from mmpipe.errors import ArgumentError, InputError, ParseError
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.rollout import TransformersEngine

from conftest import model_for, processor_for

TEXTS = ["", "héllo 🌍 ünïcode", "<|im_end|> sneaky <|im_start|>assistant\n", "plain", "\nleading newline",
         "trailing space ", "<image> literal", "a\n\nb", "中文字符", "", "x", "last"]


class FixedEngine:
    """`RolloutEngine` replying ``reply(k) -> Completion`` to the k-th prompt of each call."""

    def __init__(self, reply):
        self.reply = reply

    def generate(self, rows, params=SamplingParams()):
        return [Generation(prompt_index=k, completions=[self.reply(k)]) for k in range(len(rows))]


def _text_engine(tok, text="fine", stop=None):
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.convert_tokens_to_ids(stop)] if stop else [])
    return FixedEngine(lambda k: Completion(token_ids=list(ids), finish_reason="stop"))


def _turn_targets(batch, role, b, tok):
    """Per turn of ``role`` in row ``b``: the decoded targets (shifted labels where step == turn)."""
    lab, st = batch.batch[f"{role}_labels"][b], batch.batch[f"{role}_step_ids"][b]
    turns = sorted(set(st.tolist()) - {-100})
    return [tok.decode(lab[st == k].tolist()) for k in turns]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_twelve_turns_label_exactly_each_reply_with_images_on_several_turns(family):
    proc = processor_for(family)
    tok = proc.tokenizer
    msgs, imgs = [], []
    for k, text in enumerate(TEXTS):
        if k % 4 == 1:
            msgs.append({"role": "user", "content": [{"type": "text", "text": f"u{k} "}, {"type": "image"}]})
            imgs.append(testing.tiny_image(36 + 4 * k, 44, seed=k))
        else:
            msgs.append({"role": "user", "content": f"u{k}"})
        msgs.append({"role": "assistant", "content": text})
    enc = rema.encode_conversation(msgs, proc, images=imgs)
    assert ((enc.labels != -100) == (enc.step_ids != -100)).all()
    for k, text in enumerate(TEXTS):
        assert tok.decode(enc.input_ids[enc.step_ids == k].tolist()) == text + "<|im_end|>"
    if family == "qwen2_vl":  # the rows feed the model: image tokens and features agree
        with torch.no_grad():
            model_for(family)(**Collator(proc)([enc.row]).model_inputs())


def test_glm_rollout_targets_the_stop_token_and_collates():
    # GLM-4.1V's template writes no end of turn after a reply: the last reply had no token after
    # it and the batch failed with "rema_view needs a conversation that ends with an assistant message"
    proc = testing.build_processor("glm4v")
    tok = proc.tokenizer
    qs = [{"question": "Q0 <image> what?", "images": [testing.tiny_image(40, 56, seed=1)]}, "Q1 plain"]
    batch = rema.rollout(qs, _text_engine(tok, "ok ü", "<|endoftext|>"), proc, agent_roles=["meta", "reasoner"],
                         max_num_turns=2, finish_flag=None)
    for role in batch.agent_roles:
        for b in range(2):
            assert _turn_targets(batch, role, b, tok) == ["ok ü<|endoftext|>"] * 2  # ReMA: response + EOS
        with torch.no_grad():
            model_for("glm4v")(**batch.model_inputs(role, labels=True))


@pytest.mark.parametrize("family", ["gemma3", "llava_onevision"])
def test_tiled_families_are_refused_with_a_typed_error(family):
    proc = testing.build_processor(family)
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(ArgumentError, match=r"patch-grid families.*processor.tokenizer"):
        rema.encode_conversation(msgs, proc)
    with pytest.raises(ArgumentError, match="patch-grid families"):
        rema.rollout(["q"], _text_engine(proc.tokenizer), proc, agent_roles=["a"], max_num_turns=1, finish_flag=None)


def test_bad_messages_name_the_message_and_the_fix():
    proc = processor_for("qwen2_vl")
    user = {"role": "user", "content": "q"}
    with pytest.raises(ParseError, match="expected a list of .* found NoneType") as e:
        rema.encode_conversation(None, proc)
    assert e.value.column == "messages"
    for bad in ({"role": "assistant", "content": None}, {"role": "assistant"}):
        with pytest.raises(ParseError, match=r"message 1: assistant message without content.*an empty reply"):
            rema.encode_conversation([user, bad], proc)  # was trained silently as an empty reply
    with pytest.raises(ParseError, match=r"message 0: the conversation starts with an assistant message"):
        rema.encode_conversation([{"role": "assistant", "content": "a"}, user], proc)
    with pytest.raises(ParseError, match=r"message 1: .*'meta'.* other roles' turns reach it as 'user'"):
        rema.encode_conversation([user, {"role": "meta", "content": "x"}], proc)


def test_bad_rollout_arguments_are_typed_errors():
    proc = processor_for("qwen2_vl")
    engine = _text_engine(proc.tokenizer)
    kw = dict(agent_roles=["meta", "reasoner"], max_num_turns=1, finish_flag=None)

    def refused(match, qs=("q",), engine=engine, **over):
        with pytest.raises(ArgumentError, match=match):
            rema.rollout(list(qs) if qs is not None else None, engine, proc, **{**kw, **over})

    refused(r"agent_roles must be a list .* found 'meta'", agent_roles="meta")  # was 4 roles m, e, t, a
    refused("agent_roles must be a list", agent_roles=None)
    refused("questions must be a non-empty list", qs=None)
    refused(r"strip_finish_flag \['critic'\] are not in agent_roles", strip_finish_flag=["critic"])  # was ignored
    refused("finish_flag must be a string", finish_flag=3)
    refused("not a RolloutEngine", engine=None)
    refused("max_length must be a positive int", max_length=0)
    with pytest.raises(ParseError, match="wrap a single image in a list") as e:
        rema.rollout([{"question": "q <image>", "images": testing.tiny_image(30, 30)}], engine, proc, **kw)
    assert e.value.row == 0 and e.value.column == "images"


class HalfBadEngine:
    """Row 0 gets a good reply, the other rows ``bad`` as their whole `Generation` (a string) or as
    their completion (a `Completion`), so the error must name row 1."""

    def __init__(self, bad):
        self.bad = bad

    def generate(self, rows, params=SamplingParams()):
        good = Completion(token_ids=[5, 6], finish_reason="stop")
        wrap = (lambda k, c: Generation(prompt_index=k, completions=[c]))
        out = [wrap(0, good)]
        for k in range(1, len(rows)):
            out.append(wrap(k, self.bad) if isinstance(self.bad, Completion) else self.bad)
        return out


@pytest.mark.parametrize("bad", [Completion(token_ids=None, finish_reason="stop"), "text",
                                 Completion(token_ids=[5], finish_reason=None)])
def test_malformed_engine_outputs_name_row_role_and_turn(bad):
    proc = processor_for("qwen2_vl")
    with pytest.raises(InputError, match=r"row 1, role 'meta', turn 0: the engine's output") as e:
        rema.rollout(["q0", "q1"], HalfBadEngine(bad), proc, agent_roles=["meta"], max_num_turns=1, finish_flag=None)
    assert e.value.stage == "rollout" and e.value.row == 1


def test_sampled_long_rollout_appends_each_reply_to_its_role():
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    engine = TransformersEngine(model_for("qwen2_vl"), proc)
    qs = [{"question": "Q0 <image> and <image>", "images": [testing.tiny_image(40, 52, seed=1),
                                                           testing.tiny_image(60, 44, seed=2)]}]
    batch = rema.rollout(qs, engine, proc, agent_roles=["meta", "reasoner"], max_num_turns=2, finish_flag=None,
                         system_prompts={"meta": "Plan.", "reasoner": "Solve."},
                         params=SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))
    non = batch.non_tensor_batch
    for b in range(len(batch)):
        hist = [h for h in non["history"][b] if h["role"] != "padding"]
        assert [h["role"] for h in hist] == ["meta", "reasoner"] * 2
        for role in batch.agent_roles:
            own = [h for h in hist if h["role"] == role]
            want = [h["content"] + ("<|im_end|>" if h["stop_reason"] == "stop" else "") for h in own]
            assert _turn_targets(batch, role, b, tok) == [w for w in want if w]
            assert all(h["num_gen_tokens"] <= 64 and (h["num_gen_tokens"] == 64) == (h["stop_reason"] == "length")
                       for h in own)
    for role in batch.agent_roles:
        with torch.no_grad():
            model_for("qwen2_vl")(**batch.model_inputs(role, labels=True))
