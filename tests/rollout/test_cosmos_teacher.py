"""cosmos-rl 0.4.7's distillation teacher (``cosmos_rl.reference.engine.torch_engine.TorchEngine``) on
what mmpipe's packer returns (`CosmosRow`): its ``step_forward`` first checks, per rollout, that the
student's prompt ids mapped into the teacher's vocabulary equal the teacher's
(``assert mapped_list == sample.input_ids``: with a bare numpy array that assert raised "truth value
of an array ... is ambiguous"), then packs the samples with our ``policy_collate_fn`` and scores them.

Set by hand (the engine's ``__init__`` builds NCCL meshes and a GPU model): the engine is made with
``TorchEngine.__new__``: a CPU ``parallel_dims`` (no PP/CP/TP), cosmos-rl's ``HFModel`` around the
tiny Qwen2.5-VL, student and teacher the same packer class (one tokenizer: the mapping is the
identity). Importing the engine needs the ``torchao`` stand-in of test_cosmos_trainer_modes.py
(with a module spec: diffusers looks it up).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import sys
import types

import numpy as np
import pytest
import torch

from mmpipe.rollout.packers import CosmosRow, QwenVLDataPacker

from conftest import model_for, processor_for
from test_cosmos_trainer_modes import FAMILY, _config, _generated, _stub_module, _teacher_logprobs

pytestmark = pytest.mark.needs_env("cosmos")


@pytest.fixture(scope="module")
def cosmos_teacher():
    processor_for(FAMILY)  # built before the stand-ins: transformers probes torchao while loading
    with pytest.MonkeyPatch.context() as mp:
        try:
            importlib.import_module("torchao.float8")
        except ModuleNotFoundError:
            for n in ("torchao", "torchao.float8"):
                mp.setitem(sys.modules, n, _stub_module(n))
        stage = importlib.import_module("torch.distributed.pipelining.stage")
        if not hasattr(stage, "_RootArgPlaceholder"):
            mp.setattr(stage, "_RootArgPlaceholder", type("_RootArgPlaceholder", (), {}), raising=False)
        engine = importlib.import_module("cosmos_rl.reference.engine.torch_engine")
        from cosmos_rl.dispatcher.data.schema import Rollout
        from cosmos_rl.policy.config import Config
        from cosmos_rl.policy.model.hf_models import HFModel
        yield types.SimpleNamespace(TorchEngine=engine.TorchEngine, Rollout=Rollout, Config=Config, HFModel=HFModel)


@pytest.fixture
def model_dir(tmp_path):
    model_for(FAMILY).config.save_pretrained(tmp_path)
    processor_for(FAMILY).save_pretrained(tmp_path)
    return tmp_path


def test_token_ids_compare_with_a_list_as_a_whole():
    proc = processor_for(FAMILY)
    row = QwenVLDataPacker(proc).get_policy_input([{"role": "user", "content": "Hi"}], "")
    assert isinstance(row, CosmosRow)
    ids = row.input_ids.tolist()
    assert (ids == row.input_ids) is True and (row.input_ids == tuple(ids)) is True
    assert (ids[:-1] == row.input_ids) is False and (row.input_ids != ids + [1]) is True
    elementwise = row.input_ids == ids[0]  # with a number: elementwise, as any array
    assert isinstance(elementwise, np.ndarray) and elementwise.shape == (len(ids),) and bool(elementwise[0])
    assert np.array_equal(row.input_ids, np.asarray(ids)) and row.input_ids.dtype == np.int64
    assert type(np.asarray(row.input_ids)) is np.ndarray  # plain arrays for everything downstream
    assert row["input_ids"] == ids  # cosmos-rl's item read: a list


def test_cosmos_teacher_step_forward_on_our_samples(cosmos_teacher, model_dir):
    """cosmos-rl's own ``TorchEngine.step_forward`` (the student/teacher id check, our
    ``get_policy_input`` / ``policy_collate_fn``, its ``include_prompt`` masks, its
    ``compute_logprobs``): the teacher logprobs it returns equal the model's own next-token
    logprobs on prompt + response (rows with 1, 0 and 2 images)."""
    proc, model = processor_for(FAMILY), copy.deepcopy(model_for(FAMILY)).eval()
    model.config._attn_implementation = "eager"
    config = _config(cosmos_teacher, model_dir, "distill_prompt")
    student, teacher = QwenVLDataPacker(proc), QwenVLDataPacker(proc)
    student.setup(config)
    teacher.setup(config)
    T = cosmos_teacher.TorchEngine
    eng = T.__new__(T)
    hf = cosmos_teacher.HFModel(model.config, model, type(model), is_vlm=True)
    eng.__dict__.update(
        config=config, data_packer=teacher, student_data_packer=student, tokenizer=proc.tokenizer,
        student_tokenizer=proc.tokenizer, device=torch.device("cpu"), model=hf, train_stream=None,
        seq_len_multiple=1, act_offloading_ctx_manager=contextlib.nullcontext(),
        parallel_dims=types.SimpleNamespace(pp_enabled=False, cp_enabled=False, pp_coord=(0, 1), tp_coord=(0, 1),
                                            cp_coord=(0, 1), dp_shard_coord=(0, 1), world_size=1, mesh={}))
    rollouts, want = [], {}
    for k, (item, P, c) in enumerate(_generated("vl")):
        ids = list(c.token_ids)
        r = cosmos_teacher.Rollout(prompt=item, completion="", completion_token_ids=[[i] for i in ids],
                                   completion_logprobs=[[float(x)] for x in c.logprobs],
                                   prompt_logprobs=[[0.0]] * (P - 1))
        r.teacher_result_uuid = f"t{k}"
        rollouts.append(r)
        want[r.teacher_result_uuid] = [x[0] for x in _teacher_logprobs(model, teacher, item, ids)]

    data = eng.step_forward(rollouts)

    assert [d["teacher_result_uuid"] for d in data] == [r.teacher_result_uuid for r in rollouts]
    gap = 0.0
    for d in data:
        got, ref = torch.tensor(d["teacher_logprobs"]).reshape(-1), torch.tensor(want[d["teacher_result_uuid"]])
        assert got.shape == ref.shape  # include_prompt: every position but the last
        gap = max(gap, (got - ref).abs().max().item())
    print(f"[cosmos teacher] {len(data)} samples, teacher logprobs vs the model's own: max gap {gap:.2e}")
    assert gap < 1e-4
