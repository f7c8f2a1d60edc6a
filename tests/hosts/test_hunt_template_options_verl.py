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
    return _run(tmp_path, tools_file, kwargs).calls[0]["prompt_ids"]


def _run(tmp_path, tools_file: str, kwargs: dict, *, script=None, mm_processor_kwargs=None, turns: int = 1):
    """verl's worker runs one trajectory of the loop (``data.apply_chat_template_kwargs=kwargs``,
    ``data.mm_processor_kwargs``, ``turns`` assistant turns; replies ``script``, else one answer);
    returns the server with its calls."""
    from verl import DataProto
    from verl.tools.tool_registry import load_all_tools
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    import mmpipe.hosts.verl as host
    import mmpipe.hosts.verl_agent as mmagent

    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    cfg = verl_config(prompt_length=256, response_length=160, n=1)
    cfg.data.update(apply_chat_template_kwargs=kwargs, mm_processor_kwargs=mm_processor_kwargs or {})
    cfg.actor_rollout_ref.rollout.agent.update(agent_loop_config_path=mmagent.write_agent_loop_config(
        tmp_path / "agent_loops.yaml"), default_agent_loop=mmagent.AGENT_NAME)
    cfg.actor_rollout_ref.rollout.multi_turn.update(enable=True, max_assistant_turns=turns, format="hermes",
                                                     function_tool_path=tools_file)
    tools = load_all_tools(tool_config_path=None, function_tool_path=tools_file)
    dataset_cls = get_dataset_class(cfg.data.__class__({"custom_cls": {"path": host.__file__,
                                                                        "name": "MMPipeRLHFDataset"}}))
    answer = proc.tokenizer("Two pictures.<|im_end|>", add_special_tokens=False)["input_ids"]
    server = HFServer(model, proc, length=4, script=script or [answer])
    worker = agent_worker(proc, model, cfg, server, tools=tools, dataset_cls=dataset_cls)
    raw = [{"prompt": [{"role": "user", "content": "<image><image>What are these?"}], "images": IMAGES,
            "data_source": "toy", "reward_model": {"ground_truth": "2", "style": "rule"},
            "extra_info": {"index": 0, "split": "train"}}]
    enc, _ = mmpipe.encode_dataset(__import__("datasets").Dataset.from_list(raw), proc, labels=False,
                                   keep_columns=KEEP, chat_template_kwargs=kwargs or None,
                                   **(mm_processor_kwargs or {}))
    batch = DataProto.from_single_dict(collate_fn(verl_prompt_rows(enc, proc, keep_columns=KEEP)))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array(["0"], dtype=object)
    asyncio.run(worker.generate_sequences(RayPPOTrainer._get_gen_batch(None, batch)))
    return server


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


BOUNDS = {"min_pixels": 28 * 28 * 16, "max_pixels": 28 * 28 * 32}  # a 60x60 page is enlarged to 16+ windows


def test_tool_images_take_verls_mm_processor_kwargs(tmp_path, tools_file):
    """verl's own loops process every image, a tool's too, with ``data.mm_processor_kwargs``: the
    page a tool returns must reach the server with the grid the processor gives it under those
    bounds (before the fix: the processor's default bounds, grid (1, 4, 4) instead of (1, 4+, ...))."""
    proc = processor_for("qwen2_vl")
    call = proc.tokenizer('<tool_call>\n{"name": "fetch_page_options", "arguments": {"page": 2}}\n</tool_call><|im_end|>',
                          add_special_tokens=False)["input_ids"]
    server = _run(tmp_path, tools_file, {}, script=[call, call], mm_processor_kwargs=BOUNDS, turns=2)
    page = mmpipe.testing.tiny_image(60, 44 + 16, seed=2)
    want = proc.image_processor(images=[page], **BOUNDS)["image_grid_thw"].tolist()
    got = proc.image_processor(images=server.calls[1]["images"][-1:])["image_grid_thw"].tolist()
    assert got == want


def test_mm_processor_kwargs_the_loop_cannot_honour_are_refused():
    """Bounds in any of the processor call's forms become the Encoder's; another image keyword
    (verl would process images with it, mmpipe not) is an ArgumentError naming it."""
    from mmpipe.errors import ArgumentError
    from mmpipe.hosts import verl_agent

    proc = processor_for("qwen2_vl")
    for mm in (BOUNDS, {"images_kwargs": BOUNDS}, {"size": {"shortest_edge": BOUNDS["min_pixels"],
                                                            "longest_edge": BOUNDS["max_pixels"]}}):
        enc = verl_agent._encoder(proc, {}, mm)
        assert (enc.spec.min_pixels, enc.spec.max_pixels) == (BOUNDS["min_pixels"], BOUNDS["max_pixels"])
    with pytest.raises(ArgumentError, match="do_normalize"):
        verl_agent._encoder(proc, {}, {"do_normalize": False})
