"""mmpipe.hosts.verl: verl's per-row dicts and DataProto-ready batches.

The unmarked tests check the rows against mmpipe's own records (any environment). The tests
marked ``needs_env("verl")`` run in scripts/envs/verl.sh's venv against the REAL verl package
(verl 0.9.1, its own transformers pin): verl's ``collate_fn``, ``DataProto.from_single_dict`` /
``from_dict`` and its operations, verl's ``get_rope_index`` (Qwen2/2.5-VL and Qwen3-VL), its
``extract_multi_modal_inputs`` feeding a forward that equals mmpipe's, and the README block.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.encoding.placeholders import expand_placeholders
from mmpipe.hosts import collate_verl_rows, verl_batch, verl_rows
from mmpipe.testing.invariants import assert_roundtrip

from conftest import FAMILIES, model_for, processor_for
from helpers import prompt_rows, readme_block

KEEP = ["data_source", "reward_model", "extra_info"]
LP = 400  # max_prompt_length: longer than every test prompt


def stored(proc, counts=(2, 0, 1)) -> list[dict]:
    """Encoded prompt rows (no labels) with verl's pass-through columns."""
    return [dict(r.to_dict(), data_source="toy", reward_model={"ground_truth": str(i), "style": "rule"},
                 extra_info={"index": 10 + i, "split": "train"}) for i, r in enumerate(prompt_rows(proc, counts))]


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_hold_the_encoded_prompt_in_verls_layout(family):
    proc = processor_for(family)
    rows = stored(proc)
    recs = [mmpipe.MultiModalInputs.from_dict(r) for r in rows]
    out = verl_rows(rows, proc, max_prompt_length=LP, keep_columns=KEEP)
    batch = mmpipe.collate(rows, processor=proc)
    assert_roundtrip(recs, batch=batch)
    pv = torch.cat([o["multi_modal_inputs"]["pixel_values"] for o in out if o["multi_modal_inputs"]])
    assert torch.equal(pv, batch.pixel_values)
    for i, (o, r) in enumerate(zip(out, recs)):
        n = r.num_tokens
        assert o["input_ids"].shape == (LP,) and o["position_ids"].shape == (4, LP)
        assert torch.equal(o["input_ids"][LP - n:], torch.from_numpy(r.input_ids))
        assert int(o["attention_mask"].sum()) == n and not bool(o["attention_mask"][:LP - n].any())
        assert torch.equal(o["position_ids"][0, LP - n:], torch.arange(n))
        assert torch.equal(o["position_ids"][1:, LP - n:], torch.from_numpy(r.position_ids))
        assert bool((o["position_ids"][:, :LP - n] == 1).all())  # verl's pad value
        ids = expand_placeholders(np.asarray(o["raw_prompt_ids"]), r.image_grid_thw, family=proc)
        assert np.array_equal(ids, r.input_ids)
        assert len(o["raw_prompt_ids"]) == n - int((r.mm_token_type_ids == 1).sum()) + r.num_images
        p = r.fam.patch_size  # the processor's resized images: grid x patch pixels
        images = o["multi_modal_data"].get("image", [])
        assert [im.size for im in images] == [(w * p, h * p) for _, h, w in r.image_grid_thw.tolist()]
        mmi = o["multi_modal_inputs"]
        if r.num_images:
            assert torch.equal(mmi["image_grid_thw"], torch.from_numpy(r.image_grid_thw))
            assert int(mmi["images_seqlens"].sum()) == r.num_image_patches
        else:
            assert mmi == {} and o["multi_modal_data"] == {}
        assert o["reward_model"] == {"ground_truth": str(i), "style": "rule"} and o["data_source"] == "toy"
        assert o["index"] == 10 + i and o["tools_kwargs"] == {} and o["interaction_kwargs"] == {}


def test_a_batch_carries_its_columns_into_the_rows():
    proc = processor_for("qwen2_5_vl")
    rows = stored(proc)
    batch = mmpipe.Collator(proc, keep_columns=KEEP, padding_side="right")(rows)
    from_batch = verl_rows(batch, proc, max_prompt_length=LP)
    from_rows = verl_rows(rows, proc, max_prompt_length=LP, keep_columns=KEEP)
    for a, b in zip(from_batch, from_rows):
        assert a.keys() == b.keys()
        for k in ("input_ids", "attention_mask", "position_ids"):
            assert torch.equal(a[k], b[k])
        assert a["raw_prompt_ids"] == b["raw_prompt_ids"] and a["extra_info"] == b["extra_info"]
    with pytest.raises(mmpipe.errors.ArgumentError, match="not carried by the batch"):
        verl_rows(batch, proc, keep_columns=["uid"])


def test_arrow_rows_give_the_same_rows():
    import datasets

    proc = processor_for("qwen3_vl")
    rows = stored(proc)
    ds = datasets.Dataset.from_list(rows)
    want = verl_batch(rows, proc, max_prompt_length=LP, keep_columns=KEEP)
    for source in (ds, mmpipe.ArrowRows(ds).__getitems__([0, 1, 2])):
        got = verl_batch(source, proc, max_prompt_length=LP, keep_columns=KEEP)
        assert got.keys() == want.keys()
        for k in ("input_ids", "attention_mask", "position_ids"):
            assert torch.equal(got[k], want[k])
        assert list(got["raw_prompt_ids"]) == list(want["raw_prompt_ids"])
        assert list(got["extra_info"]) == list(want["extra_info"])
        assert torch.equal(got["multi_modal_inputs"][0]["pixel_values"], want["multi_modal_inputs"][0]["pixel_values"])


def test_batch_is_stacked_tensors_and_object_arrays():
    proc = processor_for("qwen2_vl")
    out = verl_batch(stored(proc), proc, max_prompt_length=LP, keep_columns=KEEP)
    assert out["input_ids"].shape == (3, LP) and out["position_ids"].shape == (3, 4, LP)
    for k in ("raw_prompt_ids", "multi_modal_data", "multi_modal_inputs", *KEEP, "index"):
        assert isinstance(out[k], np.ndarray) and out[k].dtype == object and out[k].shape == (3,), k
    assert out["raw_prompt_ids"][1] == verl_rows(stored(proc)[1:2], proc)[0]["raw_prompt_ids"]
    assert out["reward_model"][2] == {"ground_truth": "2", "style": "rule"}


def test_errors_name_the_fix():
    proc = processor_for("qwen2_vl")
    with pytest.raises(mmpipe.errors.InputError, match="pad_to_length=8"):
        verl_rows(stored(proc), proc, max_prompt_length=8)
    with pytest.raises(mmpipe.errors.InputError, match="no column 'uid'"):
        verl_rows(stored(proc), proc, keep_columns=["uid"])
    rows = verl_rows(stored(proc), proc, keep_columns=["data_source"])
    del rows[1]["data_source"]
    with pytest.raises(mmpipe.errors.ArgumentError, match="rows \\[1\\] have no 'data_source'"):
        collate_verl_rows(rows)


def test_text_family_rows_have_1d_positions():
    proc = mmpipe.testing.build_tokenizer("qwen2_vl")  # a tokenizer alone: the text family
    raw = [{"messages": [{"role": "user", "content": f"Count to {k}."}]} for k in (3, 12)]
    rows = [mmpipe.encode_row(r, proc, labels=False).to_dict() for r in raw]
    out = verl_rows(rows, proc)
    n = [int(o["attention_mask"].sum()) for o in out]
    L = max(n)
    assert out[0]["position_ids"].shape == (L,) and "multi_modal_inputs" not in out[0]
    assert torch.equal(out[0]["position_ids"], torch.cat([torch.zeros(L - n[0], dtype=torch.long), torch.arange(n[0])]))


# ---- against the real verl ---------------------------------------------------------------
@pytest.mark.needs_env("verl")
@pytest.mark.parametrize("family", FAMILIES)
def test_verl_collate_fn_and_dataproto_accept_the_rows(family):
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    proc = processor_for(family)
    rows = verl_rows(stored(proc), proc, max_prompt_length=LP, keep_columns=KEEP)
    theirs, ours = collate_fn(rows), verl_batch(rows)
    assert theirs.keys() == ours.keys()
    for k, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, ours[k]), k
        else:
            assert v.dtype == ours[k].dtype == object and v.shape == ours[k].shape == (3,), k
            assert all(_same(a, b) for a, b in zip(v, ours[k])), k
    data = DataProto.from_single_dict(ours)
    assert len(data) == 3 and data.batch["position_ids"].shape == (3, 4, LP)
    tensors = {k: v for k, v in ours.items() if isinstance(v, torch.Tensor)}
    also = DataProto.from_dict(tensors=tensors, non_tensors={k: v for k, v in ours.items() if k not in tensors})
    assert torch.equal(also.batch["input_ids"], data.batch["input_ids"])
    # what the PPO loop does to it: n samples per prompt, chunk for workers, concat back, ship
    grouped = data.repeat(repeat_times=2, interleave=True)
    assert len(grouped) == 6 and grouped.non_tensor_batch["reward_model"][1] == rows[0]["reward_model"]
    back = DataProto.concat(grouped.chunk(3))
    assert torch.equal(back.batch["position_ids"], grouped.batch["position_ids"])
    shipped = pickle.loads(pickle.dumps(grouped))
    assert torch.equal(shipped.non_tensor_batch["multi_modal_inputs"][0]["pixel_values"],
                       rows[0]["multi_modal_inputs"]["pixel_values"])
    picked = data.select_idxs([2, 0])
    assert picked.non_tensor_batch["extra_info"][0]["index"] == 12
    # the trainer's images_seqlens gathering (ray_trainer.fit) reads every image row
    seqlens = [s for m in data.non_tensor_batch["multi_modal_inputs"] if "image_grid_thw" in m
               for s in m["images_seqlens"].tolist()]
    assert sum(seqlens) == sum(int(r["multi_modal_inputs"]["pixel_values"].shape[0]) for r in rows
                               if r["multi_modal_inputs"])


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or a is b


@pytest.mark.needs_env("verl")
@pytest.mark.parametrize("family", FAMILIES)
def test_positions_equal_verls_own_rope_function(family):
    if family == "qwen3_vl":
        from verl.models.transformers.qwen3_vl import get_rope_index
    else:
        from verl.models.transformers.qwen2_vl import get_rope_index

    proc = processor_for(family)
    rows = verl_rows(stored(proc, counts=(2, 0, 1, 3)), proc, max_prompt_length=LP)
    for r in rows:
        grid = r["multi_modal_inputs"].get("image_grid_thw")
        want = get_rope_index(proc, input_ids=r["input_ids"], image_grid_thw=grid, attention_mask=r["attention_mask"])
        assert torch.equal(r["position_ids"][1:], want)
        # row 0 as verl's agent loop writes it: ones, then 0..n-1 on the valid tokens
        valid = r["attention_mask"].bool()
        text = torch.ones(LP, dtype=torch.long)
        text[valid] = torch.arange(int(valid.sum()))
        assert torch.equal(r["position_ids"][0], text)


@pytest.mark.needs_env("verl")
@pytest.mark.parametrize("family", FAMILIES)
def test_verls_multi_modal_inputs_feed_the_same_forward(family):
    """extract_multi_modal_inputs (verl's actor) over the rows + the [B, 4, L] positions give
    the logits of mmpipe's own batch forward on every valid token."""
    from verl.utils.model import extract_multi_modal_inputs

    proc, model = processor_for(family), model_for(family)
    rows = verl_rows(stored(proc), proc, max_prompt_length=LP)
    data = verl_batch(rows)
    mm = extract_multi_modal_inputs(list(data["multi_modal_inputs"]))
    batch = mmpipe.collate(stored(proc), processor=proc, padding_side="left", pad_to_length=LP)
    assert torch.equal(mm["pixel_values"], batch.pixel_values) and torch.equal(mm["image_grid_thw"], batch.image_grid_thw)
    with torch.no_grad():
        theirs = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"],
                       position_ids=data["position_ids"].transpose(0, 1), **mm).logits
        ours = model(**batch.model_inputs(positions="verl")).logits
    valid = batch.attention_mask.bool()
    assert torch.allclose(theirs[valid], ours[valid], atol=1e-5, rtol=0)


@pytest.mark.needs_env("verl")
def test_readme_verl_block_runs_as_written():
    import datasets

    proc = processor_for("qwen2_vl")
    raws = [{"prompt": [{"role": "user", "content": f"<image>What is shown in picture {i}?"}],
             "images": [mmpipe.testing.tiny_image(40, 56 + 8 * i, seed=i)], "data_source": "toy",
             "reward_model": {"ground_truth": str(i), "style": "rule"}, "extra_info": {"index": i, "split": "train"}}
            for i in range(4)]
    namespace = {"ds": datasets.Dataset.from_list(raws), "processor": proc}
    exec(compile(readme_block("## verl"), "README.md", "exec"), namespace)  # the docs block may build its own ds
    data, n = namespace["data"], len(namespace["ds"])
    assert len(data) == n and data.batch["position_ids"].shape == (n, 4, 1024)
    assert list(data.non_tensor_batch["index"]) == list(range(n))


def test_agent_loop_module_imports_without_verl(tmp_path):
    """mmpipe.hosts.verl_agent imports verl only when its class is built; its helpers work anywhere."""
    import importlib.util

    import mmpipe.hosts.verl_agent as mmagent
    from mmpipe.errors import ArgumentError

    path = mmagent.write_agent_loop_config(tmp_path / "loops.yaml")
    assert (tmp_path / "loops.yaml").read_text().splitlines() == [
        f"- name: {mmagent.AGENT_NAME}", "  _target_: mmpipe.hosts.verl_agent.MMPipeToolAgentLoop"]
    assert path == str((tmp_path / "loops.yaml").resolve())
    img = mmpipe.testing.tiny_image(32, 32, seed=0)
    msgs, images = mmagent.split_inline_images(
        [{"role": "system", "content": "s"},
         {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "q"}]}])
    assert images == [img] and msgs[1]["content"] == [{"type": "image"}, {"type": "text", "text": "q"}]
    with pytest.raises(ArgumentError, match="no 'image'"):
        mmagent.split_inline_images([{"role": "user", "content": [{"type": "image"}]}])
    if importlib.util.find_spec("verl") is None:
        with pytest.raises(ImportError, match="scripts/envs/verl.sh"):
            mmagent.MMPipeToolAgentLoop
    else:
        assert mmagent.MMPipeToolAgentLoop.__mro__[1].__name__ == "ToolAgentLoop"
