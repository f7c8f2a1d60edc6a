"""Multi-agent turn-taking rollouts (ReMA): views, finish rules, per-role encoding, the batch
and its Arrow form, with a scripted engine and with the real transformers engine."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from mmpipe import rema, testing
from mmpipe.compat import hf_get_rope_index, is_transformers_5
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.families import get_family
from mmpipe.testing.invariants import assert_rema_roundtrip
from mmpipe.records.generation import Completion, Generation, SamplingParams

from conftest import model_for, processor_for
from strategies import rema_cases
import rema_reference as ref

FLAG = "[FINISH]"
VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


# ---- a scripted engine ------------------------------------------------------------------
class ScriptedEngine:
    """`RolloutEngine` whose replies come from ``respond(row, turn) -> (text, finish_reason)``.

    The row is read from the ``Q<i>:`` tag of the question in the prompt, the turn from the
    number of assistant headers. A "stop" reply ends with ``<|im_end|>``; a "length" reply
    has no end token. Every call is recorded (decoded prompts and the prompt rows)."""

    def __init__(self, processor, respond):
        self.tok = getattr(processor, "tokenizer", processor)
        self.respond = respond
        self.calls = []
        self.im_end = self.tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, rows, params=SamplingParams()):
        texts = [self.tok.decode(r.input_ids.tolist()) for r in rows]
        self.calls.append({"texts": texts, "rows": list(rows)})
        out = []
        for k, text in enumerate(texts):
            row = int(re.search(r"Q(\d+):", text).group(1))
            turn = text.count("<|im_start|>assistant") - 1
            reply, finish = self.respond(row, turn)
            ids = self.tok(reply, add_special_tokens=False)["input_ids"] + ([self.im_end] if finish == "stop" else [])
            out.append(Generation(prompt_index=k, completions=[Completion(token_ids=ids, finish_reason=finish)]))
        return out


def rows_of(engine_calls):
    return [[int(re.search(r"Q(\d+):", t).group(1)) for t in call["texts"]] for call in engine_calls]


# ---- the invariant checks every batch must pass ----------------------------------------
def check_batch(batch, proc, images_per_row):
    """Every role's tensors equal ReMA's own encoding rule (`rema_reference`, read from ReMA's
    released source) applied to the batch's conversation histories; ReMA's history / padding
    entries, per-turn tensors and finish codes; decoded targets == responses."""
    tok = getattr(proc, "tokenizer", proc)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    non = batch.non_tensor_batch
    B, T, R = len(batch), batch.max_num_turns, len(batch.agent_roles)
    vision = batch.family != "text"
    for b in range(B):
        assert len(non["history"][b]) == rema.history_size(R, T)
        real = [h for h in non["history"][b] if h["role"] != rema.PAD_ROLE]
        assert all(h == {"role": "padding", "content": "<PAD>"} for h in non["history"][b][len(real):])
        assert all(set(h) == {"role", "content", "num_gen_tokens", "stop_reason"} for h in real)
        assert [h["role"] for h in real] == list(batch.agent_roles) * non["num_turns"][b]
        assert non["num_turns"][b] == len(real) // R and non["response"][b] == real[-1]["content"]
        assert non["finish_reason"][b] in ref.FINISH_CODE
    for role in batch.agent_roles:
        t = {k: batch.batch[f"{role}_{k}"] for k in rema.ROLE_TENSORS}
        L = t["input_ids"].shape[1]
        assert all(v.shape[0] == B and v.shape[-1] == L and v.dtype == torch.int64 for v in t.values())
        assert t["position_ids"].shape == ((B, 3, L) if vision else (B, L))
        assert batch.batch[f"{role}_num_gen_tokens"].shape == (B, T) and batch.batch[f"{role}_stop_reasons"].dtype == torch.bool
        assert batch.batch[f"{role}_turn_finished"].tolist() == [ref.FINISH_CODE[f] for f in non["finish_reason"]]
        for b in range(B):
            n = int(t["attention_mask"][b].sum())
            assert t["attention_mask"][b, :n].all() and not t["attention_mask"][b, n:].any()  # right padding
            assert (t["labels"][b, n:] == -100).all() and (t["step_ids"][b, n:] == -100).all()
            own = [h for h in non["history"][b] if h["role"] == role]
            assert len(own) == non["num_turns"][b]
            hist = non[f"{role}_conversation_history"][b]
            assert len(hist) == 2 * T
            conv = [m for m in hist if m["role"] != rema.PAD_ROLE]
            assert all(m == rema.conversation_pad_entry() for m in hist[len(conv):])
            conv = conv + [{"role": "assistant", "content": own[-1]["content"]}]
            want = ref.reference_encode(conv, proc, [h["stop_reason"] for h in own], images_per_row[b])
            assert t["input_ids"][b, :n].tolist() == want["input_ids"], f"role {role}, row {b}: ids differ from ReMA's"
            assert t["labels"][b, :n].tolist() == want["labels"], f"role {role}, row {b}: labels differ from ReMA's"
            assert t["step_ids"][b, :n].tolist() == want["step_ids"], f"role {role}, row {b}: step_ids differ"
            nums = batch.batch[f"{role}_num_gen_tokens"][b].tolist()
            assert nums == want["num_gen_tokens"] + [0] * (T - len(want["num_gen_tokens"]))
            stops = batch.batch[f"{role}_stop_reasons"][b].tolist()
            assert stops == [h["stop_reason"] != "stop" for h in own] + [False] * (T - len(own))
            if not vision:  # ReMA's compute_position_id_with_mask
                assert t["position_ids"][b].tolist() == [max(0, min(k, n - 1)) for k in range(L)]
            # each turn's targets decode to exactly that response (+ EOS after a normal stop)
            labels, steps = t["labels"][b].tolist(), t["step_ids"][b].tolist()
            for turn, h in enumerate(own):
                toks = [x for x, s_ in zip(labels, steps) if s_ == turn]
                if h["stop_reason"] == "stop":
                    assert toks and toks[-1] == im_end
                    toks = toks[:-1]
                assert tok.decode(toks) == h["content"]
            n_img = sum(isinstance(m["content"], list) and sum(it["type"] == "image" for it in m["content"]) for m in conv)
            assert n_img == len(images_per_row[b])  # every role's view shows every question image once
    # pixel data once per question, not per role
    assert batch.image_offsets.tolist() == list(np.cumsum([0] + [len(x) for x in images_per_row]))
    if vision and batch.image_grid_thw.shape[0]:
        assert batch.pixel_values.shape == (int(batch.image_grid_thw.prod(1).sum()), get_family(batch.family).patch_dim)


# ---- scripted engine ---------------------------------------------------------------------
def _questions(n, images=(1, 0, 2)):
    qs, imgs = [], []
    for i in range(n):
        k = images[i % len(images)]
        ims = [testing.tiny_image(40 + 8 * j, 52 + 4 * i, seed=10 * i + j) for j in range(k)]
        qs.append({"question": f"Q{i}: what is shown?" + " <image>" * k, "images": ims})
        imgs.append(ims)
    return qs, imgs


@pytest.mark.parametrize("family", ["text", "qwen2_vl", "qwen3_vl"])
def test_scripted_rema_rollout(family):
    proc = testing.build_tokenizer("qwen2_vl") if family == "text" else processor_for(family)
    qs, imgs = _questions(3, images=(0,) if family == "text" else (1, 0, 2))
    script = {}

    def respond(role):
        def f(row, turn):
            text, finish = script[(row, role, turn)]
            return text, finish
        return f

    for i in range(3):
        for t in range(3):
            script[(i, "meta", t)] = (f"plan r{i} t{t}" + (f" {FLAG}" if (i, t) == (1, 1) else ""), "stop")
            # the reasoner's flag is ignored: only the first role ends a row (ReMA)
            script[(i, "reasoner", t)] = (f"answer r{i} t{t}" + (f" {FLAG}" if (i, t) == (2, 0) else ""),
                                          "length" if (i + t) % 2 else "stop")
    engines = {"meta": ScriptedEngine(proc, respond("meta")), "reasoner": ScriptedEngine(proc, respond("reasoner"))}
    batch = rema.rollout(qs, engines, proc, agent_roles=["meta", "reasoner"], max_num_turns=3, finish_flag=FLAG,
                         system_prompts={"meta": "You are meta.", "reasoner": "You are reasoner."})
    non = batch.non_tensor_batch
    # the flag stops its row (at the end of that round) and only that row; max_num_turns honoured
    assert non["finish_reason"] == ["reach_max_turn", None, "reach_max_turn"]  # ReMA's vocabulary
    assert non["num_turns"] == [3, 2, 3]
    # one batched call per role per turn, over the rows still running
    assert rows_of(engines["meta"].calls) == [[0, 1, 2], [0, 1, 2], [0, 2]]
    assert rows_of(engines["reasoner"].calls) == [[0, 1, 2], [0, 1, 2], [0, 2]]
    # ReMA's views: meta gets the question, then the reasoner's replies; the reasoner gets
    # question + meta's instruction, then meta's latest message
    q1 = qs[1]["question"]
    assert non["question"][1] == q1
    meta_hist = [m for m in non["meta_conversation_history"][1] if m["role"] != "padding"]
    assert meta_hist == [{"role": "system", "content": "You are meta."},   # ReMA's form: string contents
                         {"role": "user", "content": q1},                  # (row 1 has no image)
                         {"role": "assistant", "content": "plan r1 t0"},
                         {"role": "user", "content": "answer r1 t0"}]
    reasoner_hist = [m for m in non["reasoner_conversation_history"][0] if m["role"] != "padding"]
    if family == "text":
        first = "Question:\nQ0: what is shown?\n\nInstruction:\nplan r0 t0"
    else:
        first = [{"type": "text", "text": "Question:\nQ0: what is shown? "}, {"type": "image"},
                 {"type": "text", "text": "\n\nInstruction:\nplan r0 t0"}]
    assert reasoner_hist[1] == {"role": "user", "content": first}
    assert reasoner_hist[2:] == [{"role": "assistant", "content": "answer r0 t0"},
                                 {"role": "user", "content": "plan r0 t1"},
                                 {"role": "assistant", "content": "answer r0 t1"},
                                 {"role": "user", "content": "plan r0 t2"}]
    assert non["response"] == ["answer r0 t2", "answer r1 t1", "answer r2 t2"]
    # every prompt row handed to the engine carried the question's images
    for eng in engines.values():
        for call in eng.calls:
            for text, row in zip(call["texts"], call["rows"]):
                i = int(re.search(r"Q(\d+):", text).group(1))
                assert row.num_images == len(imgs[i]) and row.pixel_values_u8.shape[0] == row.num_image_patches
    check_batch(batch, proc, imgs)
    assert_rema_roundtrip(batch)
    # what the engine saw each turn is a prefix of the role's training sequence (ids and positions)
    for role, eng in engines.items():
        for call, rows in zip(eng.calls, rows_of(eng.calls)):
            for prompt, i in zip(call["rows"], rows):
                n = prompt.num_tokens
                assert torch.equal(batch.batch[f"{role}_input_ids"][i, :n], torch.from_numpy(prompt.input_ids))
                pos = batch.batch[f"{role}_position_ids"][i]
                pos = pos[:, :n] if pos.dim() == 2 else pos[None, :n].expand(3, n)
                assert torch.equal(pos, torch.from_numpy(prompt.position_ids))


def test_custom_views_are_what_the_configuration_says():
    proc = processor_for("qwen2_vl")
    qs, imgs = _questions(2, images=(1, 0))

    def critic_view(ctx):
        plan, answer = ctx.latest("planner"), ctx.latest("solver")
        if ctx.turn == 0:
            return [*ctx.question, {"type": "text", "text": f"\nPlan: {plan}\nAnswer: {answer}"}]
        return f"New answer: {answer}"

    views = {"planner": rema.AskQuestion(reply_from=("critic",), continue_text="unused"),
             "solver": rema.QuestionWithInstruction(template="{instruction} || {question}"),
             "critic": critic_view}
    engine = ScriptedEngine(proc, lambda row, turn: (f"reply r{row} t{turn}", "stop"))
    batch = rema.rollout(qs, engine, proc, agent_roles=["planner", "solver", "critic"], max_num_turns=2,
                         finish_flag=None, views=views)
    assert len(engine.calls) == 6 and batch.non_tensor_batch["finish_reason"] == ["reach_max_turn"] * 2
    non = batch.non_tensor_batch
    user = lambda role, b: [m["content"] for m in non[f"{role}_conversation_history"][b] if m["role"] == "user"]  # noqa: E731
    q0 = [{"type": "text", "text": "Q0: what is shown? "}, {"type": "image"}]
    # no system prompt given: the conversation starts with the user turn
    assert non["planner_conversation_history"][0][0]["role"] == "user"
    assert user("planner", 0) == [q0, "reply r0 t0"]       # the critic's reply
    assert user("solver", 0) == [[{"type": "text", "text": "reply r0 t0 || Q0: what is shown? "}, {"type": "image"}],
                                 "reply r0 t1"]              # the planner's latest
    assert user("critic", 0)[0] == q0 + [{"type": "text", "text": "\nPlan: reply r0 t0\nAnswer: reply r0 t0"}]
    assert user("critic", 0)[1] == "New answer: reply r0 t1"
    # the engine's prompts are the rendered views (the critic's second prompt, row 1)
    last = engine.calls[-1]["texts"][1]
    assert last.endswith("<|im_start|>user\nNew answer: reply r1 t1<|im_end|>\n<|im_start|>assistant\n")
    check_batch(batch, proc, imgs)
    assert_rema_roundtrip(batch)


def test_view_errors_name_row_role_turn_and_fix():
    proc = processor_for("qwen2_vl")
    qs, _ = _questions(2, images=(0, 1))
    engine = ScriptedEngine(proc, lambda row, turn: ("ok", "stop"))
    blind = {"meta": rema.AskQuestion(), "reasoner": lambda ctx: "no question here"}
    with pytest.raises(ValueError, match=r"row 1, role 'reasoner', turn 0: .*0 <\|image_pad\|> token\(s\) but the question has 1"):
        rema.rollout(qs, engine, proc, agent_roles=["meta", "reasoner"], max_num_turns=1, finish_flag=None, views=blind)
    with pytest.raises(ValueError, match="n=2.*repeat each question"):
        rema.rollout(qs, engine, proc, agent_roles=["meta"], max_num_turns=1, finish_flag=None,
                     params=SamplingParams(n=2))
    with pytest.raises(ValueError, match="distinct"):
        rema.rollout(qs, engine, proc, agent_roles=["a", "a"], max_num_turns=1, finish_flag=None)
    with pytest.raises(ValueError, match="'solver', which has not answered yet"):
        rema.rollout(qs, engine, proc, agent_roles=["meta", "reasoner"], max_num_turns=1, finish_flag=None,
                     views={"meta": rema.AskQuestion(), "reasoner": rema.QuestionWithInstruction("solver")})
    with pytest.raises(ValueError, match=r"question 0: 1 image\(s\) but 0 <image> placeholder"):
        rema.rollout([{"question": "Q0: no slot", "images": [testing.tiny_image(30, 30)]}], engine, proc,
                     agent_roles=["meta"], max_num_turns=1, finish_flag=None)


def test_encode_conversation_eos_rule_and_special_text():
    tok = testing.build_tokenizer("qwen2_vl")
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "six, I think"}]
    stop = rema.encode_conversation(msgs, tok)
    cut = rema.encode_conversation(msgs, tok, finish_reasons=["stop", "length"])
    assert stop.input_ids.tolist() == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    assert tok.decode(stop.input_ids[stop.labels != -100]) == "4<|im_end|>six, I think<|im_end|>"
    assert tok.decode(cut.input_ids[cut.labels != -100]) == "4<|im_end|>six, I think"
    assert sorted(set(cut.step_ids.tolist())) == [-100, 0, 1]
    assert ((cut.step_ids != -100) == (cut.labels != -100)).all()
    # special-token text in a reply would re-tokenize as a control token: it is removed
    ids = tok("a<|image_pad|>b <|im_<|im_end|>end|>c", add_special_tokens=False)["input_ids"]
    assert rema.response_text(ids, tok) == "ab c"


# ---- the real transformers engine --------------------------------------------------------
def _text_model(tok):
    from helpers import tiny_text_model

    return tiny_text_model(len(tok))


@pytest.mark.parametrize("family", ["text", *VL_FAMILIES])
def test_transformers_engine_rollout(family):
    """Random weights never write the flag: every row plays max_num_turns rounds; each
    generate call and each role's training forward sees the question images; positions
    equal transformers' get_rope_index on that role's ids."""
    if family == "text":
        proc = testing.build_tokenizer("qwen2_vl")
        model = _text_model(proc)
    else:
        proc, model = processor_for(family), model_for(family)
    qs, imgs = _questions(3, images=(0,) if family == "text" else (1, 0, 2))
    seen = []
    hook = None
    if family != "text":
        hook = model.model.visual.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(kwargs.get("grid_thw", args[1] if len(args) > 1 else None).clone()),
            with_kwargs=True)
    try:
        batch = rema.rollout(qs, TransformersEngine(model, proc), proc, agent_roles=["meta", "reasoning"],
                             system_prompts={"meta": "You plan.", "reasoning": "You solve."}, max_num_turns=2,
                             finish_flag=FLAG, params=SamplingParams(max_new_tokens=4))
        non = batch.non_tensor_batch
        assert non["finish_reason"] == ["reach_max_turn"] * 3 and non["num_turns"] == [2, 2, 2]
        assert all(h["num_gen_tokens"] <= 4 for hs in non["history"] for h in hs if h["role"] != "padding")
        check_batch(batch, proc, imgs)
        assert_rema_roundtrip(batch)
        if family == "text":
            for role in batch.agent_roles:
                kw = batch.model_inputs(role, labels=True)
                mask = kw["attention_mask"]
                assert torch.equal(kw["position_ids"], (mask.cumsum(1) - 1).clamp(min=0))  # ReMA's positions
                with torch.no_grad():
                    out = model(**kw)
                # the loss scores the shifted labels where they stand (ReMA: labels = rolled ids)
                lab = kw["labels"]
                want = torch.nn.functional.cross_entropy(out.logits[lab != -100].float(), lab[lab != -100])
                torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-6)
            return
        # rollout: 2 roles x 2 turns generate calls, each prefill ran the vision tower on all rows' images
        all_grids = batch.image_grid_thw
        assert len(seen) == 4 and all(torch.equal(g, all_grids) for g in seen)
        seen.clear()
        with torch.no_grad():
            for role in batch.agent_roles:
                kw = batch.model_inputs(role)
                ref_pos, _ = hf_get_rope_index(model, kw["input_ids"], kw["mm_token_type_ids"],
                                               image_grid_thw=all_grids, attention_mask=kw["attention_mask"])
                mask = kw["attention_mask"].bool()
                if is_transformers_5():
                    assert torch.equal(ref_pos, kw["position_ids"])  # pads included (0 on both sides)
                else:  # 4.x gives pads position 1
                    assert torch.equal(ref_pos[:, mask], kw["position_ids"][:, mask])
                logits = model(**kw).logits
                assert len(seen) == 1 and torch.equal(seen.pop(), all_grids)  # this role's forward saw the images
                # another picture of the same size: rows with images change, the text-only row does not
                other = dict(kw, pixel_values=torch.flip(kw["pixel_values"], dims=[0]))
                moved = model(**other).logits
                seen.clear()
                for b in range(len(batch)):
                    m = mask[b]
                    changed = not torch.allclose(logits[b][m], moved[b][m])
                    assert changed == bool(imgs[b]), f"role {role}, row {b}"
    finally:
        if hook is not None:
            hook.remove()


# ---- any conversation shape ---------------------------------------------------------------
def _proc(family):
    return testing.build_tokenizer("qwen2_vl") if family == "text" else processor_for(family)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=rema_cases())
def test_any_conversation_shape_encodes_pads_and_roundtrips(case):
    proc = _proc(case["family"])
    roles, T = case["roles"], case["max_num_turns"]
    qs = [{"question": [{"type": "text", "text": f"Q{i}: "}, *content], "images": ims}
          for i, (content, ims) in enumerate(case["questions"])]

    def respond(role):
        def f(row, turn):
            text, finish = case["responses"][(row, role, turn)]
            if (role == roles[0] and case["finish_at"][row] == turn) or case["flag_elsewhere"].get((row, role, turn)):
                text += " " + FLAG
            return text, finish
        return f

    engines = {r: ScriptedEngine(proc, respond(r)) for r in roles}
    batch = rema.rollout(qs, engines, proc, agent_roles=roles, max_num_turns=T, finish_flag=FLAG,
                         system_prompts=case["system"], pad_to_multiple_of=8)
    non = batch.non_tensor_batch
    for i, at in enumerate(case["finish_at"]):
        fired = at is not None and at < T
        assert non["finish_reason"][i] == (None if fired or T == 1 else "reach_max_turn")  # ReMA: T == 1 keeps None
        assert non["num_turns"][i] == (at + 1 if fired else T)
    for r in roles:  # one call per role per round, over the rows still running
        want = [[i for i in range(len(qs)) if non["num_turns"][i] > t] for t in range(max(non["num_turns"]))]
        assert rows_of(engines[r].calls) == want
    assert batch.batch[f"{roles[0]}_input_ids"].shape[1] % 8 == 0
    check_batch(batch, proc, [ims for _, ims in case["questions"]])
    assert_rema_roundtrip(batch)
