"""verl's ``data.apply_chat_template_kwargs`` reach mmpipe's agent loop (`MMPipeToolAgentLoop`):
verl's own agent loops render every prompt with them, and `MMPipeRLHFDataset`'s length filter
counts with them, so the prompt ids the rollout server gets must be the processor's chat path
with those keywords (Qwen2-VL ``add_vision_id``: ``Picture 1:`` before each image).

Before the fix the loop built its encoder with no template keywords: the server got the prompt
without the vision ids (and, for thinking templates, with thinking on where the config turned it
off), silently unlike verl's own loops.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import mmpipe
from mmpipe.hosts.verl import verl_prompt_rows

from conftest import model_for, processor_for
from helpers import chat_path
from verl_fit_steps import HFServer, agent_worker, page_tool_source, verl_config

pytestmark = pytest.mark.needs_env("verl")

KEEP = ["prompt", "data_source", "reward_model", "extra_info"]
IMAGES = [mmpipe.testing.tiny_image(40, 56, seed=1), mmpipe.testing.tiny_image(48, 56, seed=2)]


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory):
    """Written once: verl's function-tool registry refuses a second file defining the same tool."""
    path = tmp_path_factory.mktemp("verl_tools") / "tools.py"
    path.write_text(page_tool_source("fetch_page_options"))
    return str(path)


def _prompt_ids(tmp_path, tools_file: str, kwargs: dict) -> list:
    """The prompt ids of the first generate call of one trajectory, the loop run by verl's worker
    with ``data.apply_chat_template_kwargs=kwargs``."""
    from verl import DataProto
    from verl.tools.tool_registry import load_all_tools
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    import mmpipe.hosts.verl as host
    import mmpipe.hosts.verl_agent as mmagent

    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    cfg = verl_config(prompt_length=256, response_length=32, n=1)
    cfg.data.update(apply_chat_template_kwargs=kwargs)
    cfg.actor_rollout_ref.rollout.agent.update(agent_loop_config_path=mmagent.write_agent_loop_config(
        tmp_path / "agent_loops.yaml"), default_agent_loop=mmagent.AGENT_NAME)
    cfg.actor_rollout_ref.rollout.multi_turn.update(enable=True, max_assistant_turns=1, format="hermes",
                                                     function_tool_path=tools_file)
    tools = load_all_tools(tool_config_path=None, function_tool_path=tools_file)
    dataset_cls = get_dataset_class(cfg.data.__class__({"custom_cls": {"path": host.__file__,
                                                                        "name": "MMPipeRLHFDataset"}}))
    answer = proc.tokenizer("Two pictures.<|im_end|>", add_special_tokens=False)["input_ids"]
    server = HFServer(model, proc, length=4, script=[answer])
    worker = agent_worker(proc, model, cfg, server, tools=tools, dataset_cls=dataset_cls)
    raw = [{"prompt": [{"role": "user", "content": "<image><image>What are these?"}], "images": IMAGES,
            "data_source": "toy", "reward_model": {"ground_truth": "2", "style": "rule"},
            "extra_info": {"index": 0, "split": "train"}}]
    enc, _ = mmpipe.encode_dataset(__import__("datasets").Dataset.from_list(raw), proc, labels=False,
                                   keep_columns=KEEP, chat_template_kwargs=kwargs or None)
    batch = DataProto.from_single_dict(collate_fn(verl_prompt_rows(enc, proc, keep_columns=KEEP)))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array(["0"], dtype=object)
    asyncio.run(worker.generate_sequences(RayPPOTrainer._get_gen_batch(None, batch)))
    return server.calls[0]["prompt_ids"]


def _reference(kwargs: dict) -> list:
    proc = processor_for("qwen2_vl")
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                     {"type": "text", "text": "What are these?"}]}],
           "images": IMAGES}
    return np.asarray(chat_path(proc, raw, add_generation_prompt=True, **kwargs)["input_ids"]).reshape(-1).tolist()


@pytest.mark.parametrize("kwargs", [{"add_vision_id": True}, {}], ids=["add_vision_id", "none"])
def test_the_rollout_prompt_is_the_chat_path_with_verls_template_kwargs(tmp_path, tools_file, kwargs):
    got = _prompt_ids(tmp_path, tools_file, kwargs)
    assert got == _reference(kwargs)
    if kwargs:
        assert got != _reference({})  # the keywords change the prompt: the check can tell
