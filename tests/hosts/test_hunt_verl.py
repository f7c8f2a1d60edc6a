"""mmpipe.hosts.verl / verl_agent driven the way verl 0.9.1's loops drive them, where the other verl
tests do not go: bad prompt columns and prompt widths (any environment), and, against the REAL verl
(``needs_env("verl")``, scripts/envs/verl.sh): `MMPipeToolAgentLoop` on prompts with 0, 1 and 3
images and on a prompt longer than ``rollout.prompt_length``; ``MMPipeRLHFDataset`` on raw rows
with a video (its image hook must not drop the video). The verl worker pieces that cannot run on
CPU are replaced as tests/hosts/verl_fit_steps.py says."""

from __future__ import annotations

import asyncio
import copy
import sys
import types

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.errors import ArgumentError, InputError, TruncationError
from mmpipe.hosts.verl import verl_prompt_rows, verl_rows

from conftest import model_for, processor_for
from helpers import prompt_rows
from verl_fit_steps import page_tool_source

KEEP = ["prompt", "data_source", "reward_model", "extra_info"]
TOOL = page_tool_source("open_hunt_page")


PATH_TOOL = '''
import os
import tempfile

from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse
from mmpipe.testing import tiny_image

DIR = tempfile.mkdtemp()


@function_tool
def open_hunt_page_file(page: int) -> ToolResponse:
    """Open one page of the document: its image file.

    Args:
        page: the page number.
    """
    path = os.path.join(DIR, f"page{page}.png")
    if page < 5:
        tiny_image(60, 60, seed=page).save(path)
    return ToolResponse(image=[path], text=f"page {page}")
'''


def _source(counts, words=0):
    return [{"prompt": [{"role": "user", "content": "<image>" * k + f"Which page answers question {i}?" + " w" * words}],
             "images": [mmpipe.testing.tiny_image(40 + 8 * j, 56 + 8 * i, seed=i + j) for j in range(k)],
             "data_source": "toy", "reward_model": {"ground_truth": str(i), "style": "rule"},
             "extra_info": {"index": i, "split": "train"}} for i, k in enumerate(counts)]


@pytest.mark.parametrize("prompt, found", [(None, "NoneType"), (3, "int: 3"), (["<image>hi"], "str: <image>hi")])
def test_prompt_rows_refuse_a_bad_prompt_column_by_row_and_column(prompt, found):
    proc = processor_for("qwen2_vl")
    rows = [r.to_dict() for r in prompt_rows(proc, (0, 1))]
    rows = [dict(rows[0], prompt=[{"role": "user", "content": "q"}]), dict(rows[1], prompt=prompt)]
    with pytest.raises(InputError, match="message dicts") as e:
        verl_prompt_rows(rows, proc, keep_columns=["prompt"])
    assert e.value.row == 1 and e.value.column == "prompt" and found in str(e.value)


def test_verl_rows_name_verls_prompt_width():
    proc = processor_for("qwen2_vl")
    rows = [r.to_dict() for r in prompt_rows(proc, (0, 2))]
    n = [len(r["input_ids"]) for r in rows]
    with pytest.raises(TruncationError, match="data.max_prompt_length") as e:
        verl_rows(rows, proc, max_prompt_length=n[0])
    assert e.value.row == 1 and f"found {n[1]} tokens" in str(e.value)
    for bad in (0, -4, 2.5):
        with pytest.raises(ArgumentError, match="max_prompt_length must be an int >= 1"):
            verl_rows(rows, proc, max_prompt_length=bad)
    assert verl_rows(rows, proc, max_prompt_length=max(n))[1]["input_ids"].shape == (max(n),)


# ---- against the real verl ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tool_file(tmp_path_factory):
    """Written once: verl's function-tool registry refuses a second file defining the same tool."""
    path = tmp_path_factory.mktemp("hunt_tools") / "hunt_tools.py"
    path.write_text(TOOL)
    return str(path)


def _tool_loop(tmp_path, tool_file, counts, *, prompt_length=256, words=0, tool="open_hunt_page", page=2):
    """verl's fit() up to the rollout's union with MMPipeToolAgentLoop (a scripted tool call, then an
    answer): (batch, server, encoded rows, processor)."""
    import datasets
    from verl import DataProto
    from verl.tools.tool_registry import load_all_tools
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    import mmpipe.hosts.verl as host
    import mmpipe.hosts.verl_agent as mmagent
    from verl_fit_steps import HFServer, agent_worker, verl_config

    proc, model = processor_for("qwen2_vl"), copy.deepcopy(model_for("qwen2_vl")).eval()
    tok = proc.tokenizer
    cfg = verl_config(prompt_length=prompt_length, response_length=160, n=1)
    cfg.actor_rollout_ref.rollout.agent.update(
        agent_loop_config_path=mmagent.write_agent_loop_config(tmp_path / "loops.yaml"),
        default_agent_loop=mmagent.AGENT_NAME)
    cfg.actor_rollout_ref.rollout.multi_turn.update(enable=True, max_assistant_turns=3, format="hermes",
                                                     function_tool_path=tool_file)
    tools = load_all_tools(tool_config_path=None, function_tool_path=tool_file)
    dataset_cls = get_dataset_class(cfg.data.__class__({"custom_cls": {"path": host.__file__,
                                                                        "name": "MMPipeRLHFDataset"}}))
    call = f'<tool_call>\n{{"name": "{tool}", "arguments": {{"page": {page}}}}}\n</tool_call><|im_end|>'
    script = [tok(call, add_special_tokens=False)["input_ids"],
              lambda k: tok(f"Page {k}.<|im_end|>", add_special_tokens=False)["input_ids"]]
    vision = [v for v in mmpipe.families.resolve_family(proc).vision_token_ids(tok).values() if v is not None]
    server = HFServer(model, proc, length=6, banned=vision, script=script)
    worker = agent_worker(proc, model, cfg, server, tools=tools, dataset_cls=dataset_cls)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(_source(counts, words)), proc, labels=False,
                                   keep_columns=KEEP)
    batch = DataProto.from_single_dict(collate_fn(verl_prompt_rows(enc, proc, keep_columns=KEEP)))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(batch))], dtype=object)
    out = asyncio.run(worker.generate_sequences(RayPPOTrainer._get_gen_batch(None, batch)))
    return batch.union(out), server, enc, proc


@pytest.mark.needs_env("verl")
def test_tool_loop_on_prompts_with_0_1_and_3_images(tmp_path, tool_file):
    """Each trajectory's actor inputs: the prompt's images as mmpipe encoded them, then the tool's
    page; positions mmpipe's M-RoPE on every valid token; one image-token run per image."""
    batch, server, enc, proc = _tool_loop(tmp_path, tool_file, (0, 1, 3))
    fam = mmpipe.families.resolve_family(proc)
    image_id = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ours = [r["multi_modal_inputs"] for r in verl_rows(enc, proc)]
    ids, am, pos = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"]
    assert len(server.calls) == 2 * len(batch)
    for j, k in enumerate((0, 1, 3)):
        v = am[j].bool()
        seq, mmi = ids[j][v], batch.non_tensor_batch["multi_modal_inputs"][j]
        assert len(mmi["image_grid_thw"]) == k + 1  # the prompt's images, then the page
        if k:
            assert torch.equal(mmi["pixel_values"][: len(ours[j]["pixel_values"])], ours[j]["pixel_values"])
        assert int((seq == image_id).sum()) == int(mmi["image_grid_thw"].prod(-1).sum()) // fam.merge_size ** 2
        mine, _ = mmpipe.rope.get_rope_index(seq, (seq == image_id).long(), mmi["image_grid_thw"], family=fam)
        assert torch.equal(pos[j, 1:][:, v], mine[:, 0])
        assert not bool((batch.batch["response_mask"][j].bool() & (batch.batch["responses"][j] == image_id)).any())


@pytest.mark.needs_env("verl")
@pytest.mark.parametrize("counts", [(1, 0), (1,), (0,)], ids=["mixed", "image", "text"])
def test_tool_loop_refuses_a_prompt_longer_than_rollout_prompt_length(tmp_path, tool_file, counts):
    """verl pads prompts to rollout.prompt_length without cutting them: a longer one broke the batch's
    torch.cat (mixed lengths: RuntimeError 'Sizes of tensors must match') or silently widened
    ``prompts`` past prompt_length (one length); now a TruncationError names the row and the setting."""
    with pytest.raises(TruncationError, match="rollout.prompt_length=40") as e:
        _tool_loop(tmp_path, tool_file, counts, prompt_length=40)
    assert e.value.row == 0 and e.value.column == "raw_prompt" and "prompt_length" in e.value.fix


@pytest.mark.needs_env("verl")
def test_dataset_hook_hands_raw_videos_to_verls_video_path(tmp_path, monkeypatch):
    """MMPipeRLHFDataset's image hook returned (None, None, None) for a raw row's ``<video>``: the
    prompt kept a video pad with no frames and verl's length filter counted it as text. Now video
    items go to verl's own path (qwen_vl_utils), or, without it, raise a typed error."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import get_dataset_class

    import mmpipe.hosts.verl as host

    proc = processor_for("qwen2_vl")
    frames = []
    for j in range(4):
        frames.append(str(tmp_path / f"f{j}.png"))
        mmpipe.testing.tiny_image(56, 56, seed=j).save(frames[-1])
    image = str(tmp_path / "im.png")
    mmpipe.testing.tiny_image(40, 56, seed=9).save(image)
    datasets.Dataset.from_list([
        {"prompt": [{"role": "user", "content": "<video>What happens?"}], "videos": [frames], "images": None,
         "data_source": "t", "extra_info": {"index": 0}},
        {"prompt": [{"role": "user", "content": "<image>What is it?"}], "videos": None, "images": [image],
         "data_source": "t", "extra_info": {"index": 1}}]).to_parquet(tmp_path / "raw.parquet")
    cls = get_dataset_class(OmegaConf.create({"custom_cls": {"path": host.__file__, "name": "MMPipeRLHFDataset"}}))
    cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": False,
                            "cache_dir": str(tmp_path / "cache")})
    ds = cls(data_files=[str(tmp_path / "raw.parquet")], tokenizer=proc.tokenizer, processor=proc, config=cfg)
    video_msgs, image_msgs = ds[0]["raw_prompt"], ds[1]["raw_prompt"]
    images, videos, _ = asyncio.run(cls.process_multi_modal_info(image_msgs, 14, cfg))
    assert [im.size for im in images] == [(56, 40)] and videos is None  # images: mmpipe's hook, no qwen_vl_utils
    monkeypatch.setitem(sys.modules, "qwen_vl_utils", None)  # not installed
    with pytest.raises(InputError, match="qwen-vl-utils") as e:
        asyncio.run(cls.process_multi_modal_info(video_msgs, 14, cfg))
    assert e.value.column == "raw_prompt" and "1 video item(s)" in str(e.value)
    seen = []

    def process_vision_info(messages, image_patch_size=14, return_video_metadata=False):
        seen.append(messages)
        return None, [("frames", {"fps": 2.0})]
    monkeypatch.setitem(sys.modules, "qwen_vl_utils", types.SimpleNamespace(process_vision_info=process_vision_info))
    assert asyncio.run(cls.process_multi_modal_info(video_msgs, 14, cfg)) == (None, [("frames", {"fps": 2.0})], None)
    assert asyncio.run(cls.process_vision_info(video_msgs, 14, cfg)) == (None, [("frames", {"fps": 2.0})])
    assert len(seen) == 2 and seen[0] is video_msgs


@pytest.mark.needs_env("verl")
def test_encoded_overlong_filter_counts_the_tool_schemas_as_verls_does(tmp_path, tool_file):
    """With tools configured (data.function_tool_path follows multi_turn.function_tool_path), verl's
    filter renders the schemas into each prompt. On ENCODED rows the filter read only the stored
    ``input_ids`` and kept every row of this set at a width verl's filter drops them all at (the agent
    loop then met prompts over rollout.prompt_length). Now both keep the same rows at every width."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import get_dataset_class

    import mmpipe.hosts.verl as host

    proc = processor_for("qwen3_vl")  # its template renders tools
    src = _source((0, 1, 2))
    src[0]["prompt"] = [{"role": "system", "content": "Be brief."}] + src[0]["prompt"]
    datasets.Dataset.from_list(src).to_parquet(tmp_path / "raw.parquet")
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(src), proc, labels=False, keep_columns=KEEP)
    enc.to_parquet(tmp_path / "enc.parquet")
    cls = get_dataset_class(OmegaConf.create({"custom_cls": {"path": host.__file__, "name": "MMPipeRLHFDataset"}}))

    def kept(name, width, tools=True):
        cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": width, "filter_overlong_prompts": True,
                                "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache"),
                                "function_tool_path": tool_file if tools else None})
        ds = cls(data_files=[str(tmp_path / name)], tokenizer=proc.tokenizer, processor=proc, config=cfg)
        return sorted(ds.dataframe["extra_info"][i]["index"] for i in range(len(ds)))

    stored = [len(ids) for ids in enc["input_ids"]]
    assert kept("enc.parquet", max(stored), tools=False) == [0, 1, 2]  # no tools: the stored ids alone
    assert kept("raw.parquet", max(stored)) == kept("enc.parquet", max(stored)) == []
    ds = cls(data_files=[str(tmp_path / "enc.parquet")], tokenizer=proc.tokenizer, processor=proc,
             config=OmegaConf.create({"prompt_key": "prompt", "filter_overlong_prompts": False,
                                      "cache_dir": str(tmp_path / "cache"), "function_tool_path": tool_file}))
    widths = sorted({n + ds._tool_tokens(p) for n, p in zip(stored, enc["prompt"])})
    for width in [w + d for w in widths for d in (-1, 0)]:
        assert kept("enc.parquet", width) == kept("raw.parquet", width), width
    assert kept("enc.parquet", widths[-1]) == [0, 1, 2]


@pytest.fixture(scope="module")
def path_tool_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hunt_path_tools") / "hunt_path_tools.py"
    path.write_text(PATH_TOOL)
    return str(path)


@pytest.mark.needs_env("verl")
def test_a_tool_image_given_as_a_file_path_reaches_the_actor_as_an_image(tmp_path, path_tool_file):
    """verl's ToolResponse.image is list[Any]; a tool returning its page as a file path had the path go
    in as the tool turn's TEXT (the model never saw the page). Now the file is opened, encoded and
    trained on like a PIL result; a missing file raises mmpipe's ImageError naming it."""
    batch, server, enc, proc = _tool_loop(tmp_path, path_tool_file, (1,), tool="open_hunt_page_file")
    mmi = batch.non_tensor_batch["multi_modal_inputs"][0]
    v = batch.batch["attention_mask"][0].bool()
    text = proc.tokenizer.decode(batch.batch["input_ids"][0][v])
    assert len(mmi["image_grid_thw"]) == 2 and "page2.png" not in text  # the prompt's image, then the page
    page = verl_rows([mmpipe.encode_row({"messages": [{"role": "user", "content": "<image>"}],
                                         "images": [mmpipe.testing.tiny_image(60, 60, seed=2)]}, proc)],
                     proc)[0]["multi_modal_inputs"]
    assert torch.equal(mmi["pixel_values"][-len(page["pixel_values"]):], page["pixel_values"])
    assert len(server.calls[-1]["images"]) == 2  # the rollout's second call got the page too
    with pytest.raises(mmpipe.errors.ImageError, match="page9.png"):
        _tool_loop(tmp_path, path_tool_file, (1,), tool="open_hunt_page_file", page=9)
