"""The VRAG case in verl 0.9.1's own loop: `MMPipeToolAgentLoop` (mmpipe.hosts.verl_agent), registered
through verl's ``agent_loop_config_path``, built by ``AgentLoopWorker._run_agent_loop`` (hydra), runs
a tool (verl ``@function_tool``, loaded by verl's ``load_all_tools``) that returns a page image;
then ``fit()``'s steps from verl's installed code: ``_postprocess`` -> union ->
``compute_response_mask`` -> ``extract_reward`` -> ``_compute_old_log_prob`` -> ``compute_advantage``
(GRPO) -> ``_update_actor`` (2 optimizer steps). What is replaced, and why: verl_fit_steps.py.
"""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.hosts.verl import verl_prompt_rows, verl_rows

from conftest import model_for, processor_for
from verl_fit_steps import (
    HFServer, Trainer, agent_worker, cpu_world, fit_tail, page_tool_source, rule_reward, verl_config,
)

pytestmark = pytest.mark.needs_env("verl")

KEEP = ["prompt", "data_source", "reward_model", "extra_info"]
PL, RL, N = 256, 160, 2
TOOLS = page_tool_source("fetch_page")


def _source(n=3):
    return [{"prompt": [{"role": "user", "content": "<image>" * (i % 2 + 1) + f"Which page answers question {i}?"}],
             "images": [mmpipe.testing.tiny_image(40 + 8 * j, 56 + 8 * i, seed=i + j) for j in range(i % 2 + 1)],
             "data_source": "toy", "reward_model": {"ground_truth": str(i), "style": "rule"},
             "extra_info": {"index": i, "split": "train"}} for i in range(n)]


def _tool_call(tok, page):
    text = f'<tool_call>\n{{"name": "fetch_page", "arguments": {{"page": {page}}}}}\n</tool_call><|im_end|>'
    return tok(text, add_special_tokens=False)["input_ids"]


def _answer(tok, k):
    return tok(f"It is on page {k % 3}." + "!" * k + "<|im_end|>", add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory):
    """The tool file, written once: verl's function-tool registry refuses a second file defining fetch_page."""
    path = tmp_path_factory.mktemp("verl_tools") / "tools.py"
    path.write_text(TOOLS)
    return str(path)


def _rollout(tmp_path, tools_file, script, *, response_length=RL, max_turns=3):
    """verl's fit() up to the rollout's union, with MMPipeToolAgentLoop as the default agent loop:
    (batch, server, enc, cfg, model, proc)."""
    from verl import DataProto
    from verl.tools.tool_registry import load_all_tools
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    import mmpipe.hosts.verl as host
    import mmpipe.hosts.verl_agent as mmagent

    proc = processor_for("qwen2_vl")
    model = copy.deepcopy(model_for("qwen2_vl")).eval()  # trained below: not the shared cached model
    cfg = verl_config(prompt_length=PL, response_length=response_length, n=N)
    cfg.actor_rollout_ref.rollout.agent.update(agent_loop_config_path=mmagent.write_agent_loop_config(
        tmp_path / "agent_loops.yaml"), default_agent_loop=mmagent.AGENT_NAME)
    cfg.actor_rollout_ref.rollout.multi_turn.update(enable=True, max_assistant_turns=max_turns, format="hermes",
                                                     function_tool_path=tools_file)
    tools = load_all_tools(tool_config_path=None, function_tool_path=tools_file)
    assert [t.name for t in tools] == ["fetch_page"]
    dataset_cls = get_dataset_class(cfg.data.__class__({"custom_cls": {"path": host.__file__,
                                                                        "name": "MMPipeRLHFDataset"}}))
    vision = [v for v in mmpipe.families.resolve_family(proc).vision_token_ids(proc.tokenizer).values() if v is not None]
    server = HFServer(model, proc, length=6, banned=vision, script=script(proc.tokenizer))
    worker = agent_worker(proc, model, cfg, server, tools=tools, dataset_cls=dataset_cls)

    enc, _ = mmpipe.encode_dataset(__import__("datasets").Dataset.from_list(_source()), proc, labels=False,
                                   keep_columns=KEEP)
    rows = verl_prompt_rows(enc, proc, keep_columns=KEEP)
    batch = DataProto.from_single_dict(collate_fn(rows))  # fit(): batch_dict -> DataProto
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch).repeat(repeat_times=N, interleave=True)
    gen_out = asyncio.run(worker.generate_sequences(gen_batch))
    return batch.repeat(repeat_times=N, interleave=True).union(gen_out), server, enc, cfg, model, proc


def test_vrag_agent_loop_images_reach_rollout_and_actor_then_grpo_update(tmp_path, tools_file):
    # the rollout: a scripted tool call, then a scripted answer differing per trajectory (rewards differ),
    # both with their log-probs from the model's forward on the ids and ALL images the server got
    batch, server, enc, cfg, model, proc = _rollout(
        tmp_path, tools_file, lambda tok: [_tool_call(tok, 2), lambda k: _answer(tok, k)])

    # the loop ran two turns on each trajectory: the tool call, then the answer
    assert len(server.calls) == 2 * len(batch)
    assert list(batch.non_tensor_batch["__num_turns__"]) == [4] * len(batch)  # user, call, tool, answer
    ids, am, pos = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"]
    fam = mmpipe.families.resolve_family(proc)
    control = {}
    ours = [r["multi_modal_inputs"] for r in verl_rows(enc, proc)]
    page_row = mmpipe.encode_row({"messages": [{"role": "user", "content": "<image>"}],
                                  "images": [mmpipe.testing.tiny_image(60, 44 + 16, seed=2)]}, proc)
    page = verl_rows([page_row], proc)[0]["multi_modal_inputs"]
    image_id = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for j in range(len(batch)):
        v = am[j].bool()
        seq = ids[j][v]
        mmi = batch.non_tensor_batch["multi_modal_inputs"][j]
        n_prompt_images = j // N % 2 + 1
        assert len(mmi["image_grid_thw"]) == n_prompt_images + 1  # the tool's page image reached the actor
        second = next(c for c in server.calls if c["prompt_ids"] == seq[: len(c["prompt_ids"])].tolist()
                      and len(c["images"]) == n_prompt_images + 1)
        # the rollout's second call got the row so far and all its images; the actor the same pixels
        assert torch.equal(second["pixel_values"], mmi["pixel_values"])
        assert torch.equal(second["image_grid_thw"], mmi["image_grid_thw"])
        # ... and they are mmpipe's: the prompt's images as verl_rows holds them, the page as mmpipe encodes it
        assert torch.equal(mmi["pixel_values"][: len(ours[j // N]["pixel_values"])], ours[j // N]["pixel_values"])
        assert torch.equal(mmi["pixel_values"][len(ours[j // N]["pixel_values"]):], page["pixel_values"])
        assert int((seq == image_id).sum()) == int(mmi["image_grid_thw"].prod(-1).sum()) // fam.merge_size ** 2
        tt = (seq == image_id).long()
        mine, _ = mmpipe.rope.get_rope_index(seq, tt, mmi["image_grid_thw"], family=fam)
        assert torch.equal(pos[j, 1:][:, v], mine[:, 0])  # mmpipe's M-RoPE, tool image included
        assert torch.equal(pos[j, 0][v], torch.arange(int(v.sum())))
        # the tool turn is not trained on: response mask 0 over the tool's tokens
        resp_mask = batch.batch["response_mask"][j]
        resp = batch.batch["responses"][j]
        assert not bool((resp_mask.bool() & (resp == image_id)).any())
        answer = [x for x in range(2 * N * 3) if (resp[resp_mask.bool()].tolist()
                                                  == _tool_call(proc.tokenizer, 2) + _answer(proc.tokenizer, x))]
        assert len(answer) == 1  # the response mask is 1 on exactly the two replies' tokens
        # control: the answer's log-probs with the tool image's pixels zeroed (what a loop that drops it trains on)
        control[j] = _answer_logprobs(model, seq, mmi, int(resp_mask.sum()) - len(_tool_call(proc.tokenizer, 2)),
                                      zero_last_image=True)

    with cpu_world(tmp_path):
        trainer = Trainer(cfg, model)
        before = [p.detach().clone() for p in model.parameters()]
        batch.batch["rm_scores"] = rule_reward(batch, lambda toks: float(sum(t % 7 for t in toks[-6:])))
        batch, metrics = fit_tail(trainer, batch)
    old, mask = batch.batch["old_log_probs"], batch.batch["response_mask"].bool()
    rollout_gap = ((old - batch.batch["rollout_log_probs"]).abs() * mask).max().item()
    control_gap = max((old[j][mask[j]][-len(c):] - c).abs().max().item() for j, c in control.items())
    adv = batch.batch["advantages"]
    moved = max((p.detach() - b).abs().max().item() for p, b in zip(model.parameters(), before))
    losses = metrics["actor/pg_loss"]
    print(f"VRAG: old-log-prob (verl engine) vs rollout log-prob gap {rollout_gap:.3g} (control, tool image "
          f"zeroed: {control_gap:.3g}); "
          f"pg_loss {losses}; grad_norm {metrics['actor/grad_norm']}; max weight change {moved:.3g}")
    assert rollout_gap < 1e-4 and control_gap > 100 * max(rollout_gap, 1e-6)
    assert bool(adv.abs().sum() > 0) and torch.isfinite(adv).all()
    groups = batch.non_tensor_batch["uid"]
    for g in set(groups):  # GRPO: each group's advantages sum to 0 over its samples
        rows_g = [k for k in range(len(batch)) if groups[k] == g]
        per = [adv[k][batch.batch["response_mask"][k].bool()][0].item() for k in rows_g]
        assert abs(sum(per)) < 1e-4
    assert len(metrics["actor/grad_norm"]) == 2  # ppo_epochs=2: two optimizer steps
    assert all(g > 0 for g in metrics["actor/grad_norm"])
    assert all(np.isfinite(x) for x in np.ravel(losses)) and moved > 0


def _answer_logprobs(model, seq, mmi, n, *, zero_last_image=False):
    """The last ``n`` tokens' log-probs from an HF forward on ``seq`` with mmpipe's M-RoPE positions."""
    pixels = mmi["pixel_values"].clone()
    if zero_last_image:
        pixels[-int(mmi["image_grid_thw"][-1].prod()):] = 0
    types_ = (seq == model.config.image_token_id).long()
    pos, _ = mmpipe.rope.get_rope_index(seq, types_, mmi["image_grid_thw"], family="qwen2_vl")
    with torch.no_grad():
        logits = model(input_ids=seq[None], position_ids=pos, pixel_values=pixels,
                       image_grid_thw=mmi["image_grid_thw"]).logits[0].float()
    return torch.log_softmax(logits[-n - 1:-1], -1).gather(-1, seq[-n:, None])[:, 0]


@pytest.mark.parametrize("case", ["no_room_for_the_page", "vision_token_sampled"])
def test_vrag_agent_loop_ends_without_cutting_an_image(tmp_path, tools_file, case):
    """A tool turn that would not fit whole is not appended; a sampled vision token ends the
    reply before it. Either way the actor's images match the row's vision tokens."""
    if case == "no_room_for_the_page":
        batch, server, *_, proc = _rollout(tmp_path, tools_file, lambda tok: [_tool_call(tok, 2)], response_length=40)
    else:
        batch, server, *_, proc = _rollout(tmp_path, tools_file, lambda tok: [tok("a<|image_pad|>b")["input_ids"]])
    image_id = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert len(server.calls) == len(batch)  # one reply each, no tool turn
    for j in range(len(batch)):
        mmi = batch.non_tensor_batch["multi_modal_inputs"][j]
        assert len(mmi["image_grid_thw"]) == j // N % 2 + 1  # the prompt's images only
        resp, mask = batch.batch["responses"][j], batch.batch["response_mask"][j]
        assert not bool((resp == image_id).any())
        if case == "vision_token_sampled":
            assert resp[mask.bool()].tolist() == proc.tokenizer("a")["input_ids"]
